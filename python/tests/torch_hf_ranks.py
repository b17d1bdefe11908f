"""Distributed cases of cpsched.torch's transformers integration, run by test_torch_hf_dist.py under
`torchrun --nproc_per_node 4` (gloo, CPU) in one launch: every case runs on every rank, rank 0 writes what each
rank measured (or raised) to --out as JSON.

Cases: cp (CP over the 4 ranks: loss and gradients against the single process's own `sdpa` model),
checkpoint (activation checkpointing: the same gradients, the same collectives on every rank), fsdp (a 2 x 2
dp x cp DeviceMesh with FSDP2 on the other dimension and on the same ranks), mismatch (one rank's batch
differs: every rank raises, then the next step runs), gather (a loader that shards on its own), example
(examples/torch/train_hf.py shortened, in each mode: CP, FSDP2, compiled, two masks; against one process).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

V = 64


def llama_config(layers=2):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                       use_cache=False)


def qwen2_config(layers=4, window=9):
    """Llama's architecture with sliding-window layers between full ones: two mask kinds in one model."""
    from transformers import Qwen2Config
    kinds = ["full_attention", "sliding_attention"] * (layers // 2) + ["full_attention"] * (layers % 2)
    return Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       use_sliding_window=True, sliding_window=window, layer_types=kinds, use_cache=False)


def build(config, impl, seed=0):
    """A model with random weights from `config` (nothing downloaded), fp32, deterministic per seed."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl)  # fp32


def packed(lengths, seed):
    """One packed sequence: input_ids, position_ids [1, S] and next-token labels (-100 at each document's
    last token)."""
    g = torch.Generator().manual_seed(seed)
    S = sum(lengths)
    ids = torch.randint(0, V, (1, S), generator=g)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    labels = torch.full((1, S), -100, dtype=torch.long)
    b = 0
    for n in lengths:
        labels[0, b:b + n - 1] = ids[0, b + 1:b + n]
        b += n
    return ids, pos, labels


LENGTHS = [[7, 30, 1, 12, 41, 5], [19, 19, 2, 36, 20]]  # S = 96, documents across the ranks' boundaries


def loss_of(logits, labels, count):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100,
                           reduction="sum") / count


def reference(config, batches, seed=0, steps=1):
    """The single process: the model's own sdpa attention on whole sequences (transformers' packed-sequence
    mask from the position ids); the loss is the mean over `batches` of each batch's token mean. Returns the
    loss and {name: grad} after one forward / backward."""
    m = build(config, "sdpa", seed)
    total = 0.0
    for ids, pos, labels in batches:
        out = m(input_ids=ids, position_ids=pos).logits
        loss = loss_of(out, labels, (labels >= 0).sum()) / len(batches)
        loss.backward()
        total += loss.item()
    return total, {n: p.grad.detach().clone() for n, p in m.named_parameters()}


def max_rel(grads, ref):
    """max over parameters of |g - ref|_max / (|ref|_max + 1e-12)."""
    out = 0.0
    for n, r in ref.items():
        g = grads[n]
        out = max(out, float((g - r).abs().max()) / (float(r.abs().max()) + 1e-12))
    return out


class CollectiveCounter:
    """Counts this rank's collectives (name, element count) while active (torch.distributed's functions
    wrapped), so ranks can compare what they issued."""

    NAMES = ("all_to_all_single", "all_gather", "all_reduce", "all_gather_object", "broadcast")

    def __init__(self):
        self.calls = []
        self._orig = {}

    def __enter__(self):
        for name in self.NAMES:
            f = getattr(dist, name)
            self._orig[name] = f

            def wrapped(*a, __f=f, __n=name, **kw):
                t = a[0] if a and isinstance(a[0], torch.Tensor) else (a[1] if len(a) > 1 and isinstance(a[1], torch.Tensor) else None)
                self.calls.append((__n, int(t.numel()) if t is not None else -1))
                return __f(*a, **kw)
            setattr(dist, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, f in self._orig.items():
            setattr(dist, name, f)


def cp_step(model, cp, batch, count):
    """One forward / backward of this rank's shard; returns the loss (this rank's share)."""
    ids, pos, labels = batch
    local = cp.shard(position_ids=pos, input_ids=ids, labels=labels)
    out = model(input_ids=local["input_ids"], position_ids=local["position_ids"]).logits
    loss = loss_of(out, local["labels"], count)
    loss.backward()
    return loss


def total(x, group=None):
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return float(t)


# ---- cases -------------------------------------------------------------------------------------------


def case_cp(rank, P):
    """CP over all ranks, a Llama (one mask kind) and a Qwen2 with sliding layers (two kinds): loss and
    gradients against the single process's sdpa model; solves per step."""
    import cpsched.torch.integrations.transformers as hf
    from cpsched.torch.integrations.mesh import all_reduce_gradients
    res = {}
    for name, cfg in (("llama", llama_config()), ("qwen2", qwen2_config())):
        batch = packed(LENGTHS[0], 1)
        ref_loss, ref_grads = reference(cfg, [batch])
        m = build(cfg, "cpsched")
        cp = hf.ContextParallel(m, solver="balanced_bytes", stages=2)
        loss = cp_step(m, cp, batch, (batch[2] >= 0).sum())
        all_reduce_gradients(m.parameters())
        grads = {n: p.grad for n, p in m.named_parameters()}
        res[name] = {"loss": total(loss.item()), "ref_loss": ref_loss, "grad_rel": max_rel(grads, ref_grads),
                     "stats": dict(cp.stats)}
    return res


def checkpointing(model, reentrant):
    """transformers' activation checkpointing (torch.utils.checkpoint around every decoder layer)."""
    kw = {"use_reentrant": reentrant}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:  # transformers before 5.x's rename
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def case_checkpoint(rank, P):
    """Activation checkpointing around every decoder layer (non-reentrant and reentrant): the same gradients
    as plain layers; the recompute issues the same collectives on every rank and solves nothing."""
    import cpsched.torch.integrations.transformers as hf
    from cpsched.torch.integrations.mesh import all_reduce_gradients
    cfg = qwen2_config()
    batch = packed(LENGTHS[1], 2)
    count = (batch[2] >= 0).sum()
    out = {}
    for mode in ("plain", "checkpoint", "checkpoint_reentrant"):
        m = build(cfg, "cpsched")
        m.train()
        if mode != "plain":
            checkpointing(m, mode == "checkpoint_reentrant")
        cp = hf.ContextParallel(m)
        with CollectiveCounter() as cc:
            loss = cp_step(m, cp, batch, count)
        all_reduce_gradients(m.parameters())
        out[mode] = {"loss": loss.item(), "grads": {n: p.grad.clone() for n, p in m.named_parameters()},
                     "calls": [n for n, _ in cc.calls], "stats": dict(cp.stats)}
    res = {}
    for mode in ("checkpoint", "checkpoint_reentrant"):
        calls = [None] * P
        dist.all_gather_object(calls, out[mode]["calls"])
        res[mode] = {"grad_rel": max_rel(out[mode]["grads"], out["plain"]["grads"]),
                     "loss_diff": abs(out[mode]["loss"] - out["plain"]["loss"]),
                     "same_calls_on_every_rank": all(c == calls[0] for c in calls),
                     "a2a": out[mode]["calls"].count("all_to_all_single"), "stats": out[mode]["stats"]}
    res["plain"] = {"a2a": out["plain"]["calls"].count("all_to_all_single"), "stats": out["plain"]["stats"]}
    return res


def case_fsdp(rank, P):
    """A 2 x 2 (dp x cp) mesh: each dp row trains on its own packed sequence with CP over its cp ranks;
    FSDP2 shards the parameters over dp (the CP ranks add their gradients by its all-reduce hook) or over all four ranks. Loss and full
    gradients against the single process (the mean of the two sequences' losses)."""
    import cpsched.torch.integrations.transformers as hf
    from cpsched.torch.integrations.mesh import fully_shard_model, make_mesh
    mesh = make_mesh(2, 2)
    dp = mesh.get_local_rank("dp")
    cfg = qwen2_config()
    batches = [packed(LENGTHS[0], 3), packed(LENGTHS[1], 4)]
    ref_loss, ref_grads = reference(cfg, batches)
    res = {}
    for same in (False, True):
        m = build(cfg, "cpsched")
        fully_shard_model(m, mesh, m.model.layers, same_ranks=same)
        cp = hf.ContextParallel(m, mesh=mesh, mesh_dim="cp")
        ids, pos, labels = batches[dp]
        loss = cp_step(m, cp, batches[dp], (labels >= 0).sum() * 2)
        grads = {n: p.grad.full_tensor() for n, p in m.named_parameters()}
        res["same_ranks" if same else "other_dim"] = {"loss": total(loss.item()), "ref_loss": ref_loss,
                                                  "grad_rel": max_rel(grads, ref_grads), "cp_size": cp.size}
    return res


def case_mismatch(rank, P):
    """Rank 2's batch has other documents than the others': every rank raises the same ValueError in the
    first attention call (nothing hangs), and the next step, with equal batches, runs."""
    import cpsched.torch.integrations.transformers as hf
    m = build(llama_config(), "cpsched")
    cp = hf.ContextParallel(m)
    good = packed(LENGTHS[0], 5)
    bad = packed([48, 48], 5) if rank == 2 else good
    t0 = time.monotonic()
    err = None
    try:
        cp_step(m, cp, bad, 90)
    except ValueError as e:
        err = str(e)
    seconds = time.monotonic() - t0
    m.zero_grad()
    loss = cp_step(m, cp, good, (good[2] >= 0).sum())
    return {"error": err, "seconds": seconds, "next_loss": total(loss.item())}


def case_gather(rank, P):
    """A loader that shards on its own: gather_batch all-gathers the local position ids into the step's
    documents; the loss equals shard's."""
    import cpsched.torch.integrations.transformers as hf
    m = build(llama_config(), "cpsched")
    cp = hf.ContextParallel(m)
    ids, pos, labels = packed(LENGTHS[1], 7)
    local = cp.shard(position_ids=pos, input_ids=ids, labels=labels)
    a = loss_of(m(input_ids=local["input_ids"], position_ids=local["position_ids"]).logits, local["labels"], 1)
    cp.step = None
    step = cp.gather_batch(local["position_ids"])
    b = loss_of(m(input_ids=local["input_ids"], position_ids=local["position_ids"]).logits, local["labels"], 1)
    return {"documents": step.documents, "diff": abs(a.item() - b.item())}


EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch", "train_hf.py")
EXAMPLE_MODES = {"cp": [], "fsdp": ["--fsdp"], "compile": ["--compile", "--compile-backend", "aot_eager"],
                 "two_masks": ["--masks", "two"]}
EXAMPLE_STEPS, EXAMPLE_LAYERS = 3, 2  # the docs' tables: 20 steps, 4 layers


def case_example(rank, P):
    """examples/torch/train_hf.py, shortened (EXAMPLE_STEPS steps of EXAMPLE_LAYERS layers), in each of its modes with --check, in this
    launch (its `run`; a torchrun of its own per mode would cost more to start than to run): {mode: rank 0's
    losses, the single process's, the largest difference, ...}."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_hf", EXAMPLE)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    res = {}
    for mode, extra in EXAMPLE_MODES.items():
        args = ex.parse(["--steps", str(EXAMPLE_STEPS), "--layers", str(EXAMPLE_LAYERS), "--check", "--quiet"]
                        + extra)
        out = ex.run(args)
        out.pop("args", None)
        res[mode] = out
    return res


CASES = {"cp": case_cp, "checkpoint": case_checkpoint, "fsdp": case_fsdp, "mismatch": case_mismatch,
         "gather": case_gather, "example": case_example}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    torch.set_num_threads(1)
    # a collective left waiting raises here within 2 minutes (a case that hangs fails; pytest's limit is 420 s)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, P = dist.get_rank(), dist.get_world_size()
    results = {}
    for name in args.cases.split(","):
        t0 = time.monotonic()
        try:
            out = {"ok": True, "value": CASES[name](rank, P)}
        except Exception as e:  # noqa: BLE001 - reported per rank
            out = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        out["seconds"] = time.monotonic() - t0
        gathered = [None] * P
        dist.all_gather_object(gathered, out)
        results[name] = gathered
        if rank == 0:
            print(f"case {name}: {out['seconds']:.1f} s", "ok" if all(g["ok"] for g in gathered) else "FAILED",
                  flush=True)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, default=str)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
