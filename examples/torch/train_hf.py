"""Train a transformers model context-parallel with attn_implementation="cpsched" (docs/torch.md, "Using cpsched
in a model").

A small Llama (4 layers, GQA 4:2, head dim 16, hidden 64; random weights from a config, nothing downloaded) on
packed documents of the bundled length histogram (configs/data/doc_length_distribution.csv through
configs/quickstart.yaml: one pack of S tokens per step and data-parallel row); the tokens of a document count
up by a stride of 1 or 3 (mod V), so the loss falls. fp32, AdamW, gloo on the CPU.

    torchrun --nproc_per_node 4 examples/torch/train_hf.py                  # CP over the 4 ranks
    torchrun --nproc_per_node 4 examples/torch/train_hf.py --fsdp           # 2 x 2 mesh: FSDP2 on dp, CP on cp
    torchrun --nproc_per_node 4 examples/torch/train_hf.py --compile        # torch.compile(model, fullgraph=True)
    torchrun --nproc_per_node 4 examples/torch/train_hf.py --masks two      # full and sliding-window layers
    torchrun --nproc_per_node 4 examples/torch/train_hf.py --check          # then the single process, compared
    python examples/torch/train_hf.py --reference                           # the single process alone

Every rank of a CP group reads the whole pack and keeps its rows (ContextParallel.shard); each rank's loss is
the sum over its tokens divided by the global number of tokens, so the gradients are sums over the ranks
(all-reduced here, or reduced by FSDP2). The single process runs the same model with its own `sdpa` attention
on whole packs (transformers' packed-sequence mask from the position ids).

--masks two: the model is Qwen2's architecture (Llama's with biases on q, k, v) with layer_types alternating
full and sliding-window attention (window --window): two masks per step, each solved once and shared by its
layers. --fsdp: a dp x cp DeviceMesh (--dp 2), each dp row on its own pack; FSDP2's fully_shard over dp (the
CP ranks' gradients added by an all-reduce hook), or over all ranks with --fsdp-over dp_cp.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import cpsched

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG = os.path.join(ROOT, "configs", "quickstart.yaml")
V = 64


def model_config(args):
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=args.layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * args.seqlen,
                  tie_word_embeddings=False, use_cache=False,
                  # transformers' default 0.02 starts on a plateau where AdamW's normalised steps amplify rounding:
                  # there the model's own sdpa and eager attention, in one process, differ by 1e-2 after 20 steps
                  initializer_range=0.1)
    if args.masks == "one":
        from transformers import LlamaConfig
        return LlamaConfig(head_dim=16, **common)
    from transformers import Qwen2Config
    kinds = ["full_attention" if i % 2 == 0 else "sliding_attention" for i in range(args.layers)]
    return Qwen2Config(use_sliding_window=True, sliding_window=args.window, layer_types=kinds, **common)


def build(args, impl):
    """The model, the same random weights in every process (a fixed seed)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(copy.deepcopy(model_config(args)), attn_implementation=impl)


def pack(index, S):
    """Pack `index` of the histogram's document stream, S tokens: input_ids, position_ids, next-token labels
    (-100 at each document's last token), all [1, S]."""
    m = cpsched.mask_from_config(CONFIG, {"problem.cp_size": 1, "problem.seqlen_per_rank": S,
                                          "problem.mask.pack": index, "problem.mask.kind": "causal_document"})
    g = torch.Generator().manual_seed(1000 + index)
    ids = torch.empty(S, dtype=torch.long)
    labels = torch.full((S,), -100, dtype=torch.long)
    pos = torch.empty(S, dtype=torch.long)
    for b, e in m.q_ranges.tolist():  # one causal slice per document
        c = 1 + 2 * int(torch.randint(0, 2, (1,), generator=g))
        x = int(torch.randint(0, V, (1,), generator=g))
        ids[b:e] = (x + c * torch.arange(e - b)) % V
        labels[b:e - 1] = ids[b + 1:e]
        pos[b:e] = torch.arange(e - b)
    return ids[None], pos[None], labels[None]


def token_loss(logits, labels, count):
    """Sum of the cross entropy over the tokens with labels, divided by `count`."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100,
                           reduction="sum") / count


def train_reference(args, dp):
    """One process, whole packs, the model's own sdpa attention; a step's loss is the mean over its dp packs."""
    model = build(args, "sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        opt.zero_grad()
        total = 0.0
        for d in range(dp):
            ids, pos, labels = pack(step * dp + d, args.seqlen)
            logits = model(input_ids=ids, position_ids=pos).logits
            loss = token_loss(logits, labels, (labels >= 0).sum()) / dp
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses


def train_distributed(args):
    import cpsched.torch.integrations.transformers as cpt_hf
    from cpsched.torch.integrations.mesh import all_reduce_gradients, fully_shard_model, make_mesh
    world, rank = dist.get_world_size(), dist.get_rank()
    model = build(args, "cpsched")
    if args.fsdp:
        if world % args.dp:
            raise SystemExit(f"--dp {args.dp} does not divide the {world} ranks")
        mesh = make_mesh(args.dp, world // args.dp)
        fully_shard_model(model, mesh, model.model.layers, same_ranks=args.fsdp_over == "dp_cp")
        cp = cpt_hf.ContextParallel(model, mesh=mesh, mesh_dim="cp", solver=args.solver, stages=args.stages)
        dp, d = args.dp, mesh.get_local_rank("dp")
    else:
        cp = cpt_hf.ContextParallel(model, solver=args.solver, stages=args.stages)
        dp, d = 1, 0
    if args.checkpointing:  # torch.utils.checkpoint around every decoder layer
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable()
        else:  # transformers before its rename
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.compile:
        import torch._dynamo as dynamo  # (not `import torch._dynamo`: it would make torch a local name here)
        from torch._dynamo.utils import counters
        dynamo.reset()
        counters.clear()
    run = torch.compile(model, backend=args.compile_backend, fullgraph=True) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses, t0 = [], time.time()
    for step in range(args.steps):
        ids, pos, labels = pack(step * dp + d, args.seqlen)
        local = cp.shard(position_ids=pos, input_ids=ids, labels=labels)  # this rank's rows; the step's documents
        logits = run(input_ids=local["input_ids"], position_ids=local["position_ids"]).logits
        loss = token_loss(logits, local["labels"], (labels >= 0).sum() * dp)  # this rank's share
        opt.zero_grad()
        loss.backward()
        if not args.fsdp:
            all_reduce_gradients(model.parameters())  # the CP ranks' partial gradients (FSDP2 reduces its own)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
        if rank == 0 and not args.quiet:
            print(f"step {step:2d}  loss {total.item():.6f}", flush=True)
    info = {"seconds": time.time() - t0, "cp_size": cp.size, "dp": dp, "stats": dict(cp.stats)}
    if args.compile:  # fullgraph=True raises at a break; the counters say it too
        info["graph_breaks"] = sum(counters["graph_break"].values())
        info["unique_graphs"] = counters["stats"]["unique_graphs"]
    if rank == 0 and not args.quiet:
        print(f"{args.steps} steps in {info['seconds']:.1f} s: {world} ranks, CP over {cp.size}"
              + (f", FSDP2 over {args.fsdp_over} of a {dp} x {cp.size} mesh" if args.fsdp else "")
              + (f", compiled ({args.compile_backend})" if args.compile else "")
              + f"; plans: {cp.stats['solves']} solved for {cp.stats['calls']} attention calls"
              + (f"; graph breaks: {info['graph_breaks']}, graphs: {info['unique_graphs']}" if args.compile else ""),
              flush=True)
    return losses, info


def run(args):
    """The distributed run (the process group initialized), then on rank 0 with --check the single process:
    {distributed: losses, reference, max_abs_diff, cp_size, dp, stats, ...} (rank 0's; the others' without
    the reference)."""
    losses, info = train_distributed(args)
    out = dict(info, distributed=losses, args=vars(args))
    if args.check and dist.get_rank() == 0:
        ref = train_reference(args, info["dp"])
        out.update(reference=ref, max_abs_diff=max(abs(a - b) for a, b in zip(losses, ref)))
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seqlen", type=int, default=512, help="S, tokens per pack")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--masks", choices=["one", "two"], default="one",
                    help="one: Llama (causal in each document); two: full and sliding-window layers")
    ap.add_argument("--window", type=int, default=24, help="the sliding window's keys (--masks two)")
    ap.add_argument("--fsdp", action="store_true", help="a dp x cp mesh with FSDP2 (--dp rows)")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--fsdp-over", choices=["dp", "dp_cp"], default="dp",
                    help="shard over the dp dimension (CP gradients all-reduced) or over all ranks")
    ap.add_argument("--compile", action="store_true", help="torch.compile(model, fullgraph=True)")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing of every layer")
    ap.add_argument("--solver", default="balanced_bytes")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--reference", action="store_true", help="run the single-process reference only")
    ap.add_argument("--check", action="store_true",
                    help="after the distributed run, rank 0 runs the reference and compares (|diff| <= --tol)")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--json", help="write the losses to this file (rank 0)")
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    torch.set_num_threads(1)
    if args.reference:
        losses = train_reference(args, args.dp if args.fsdp else 1)
        for i, x in enumerate(losses):
            print(f"step {i:2d}  loss {x:.6f}")
        if args.json:
            json.dump({"reference": losses}, open(args.json, "w"))
        return 0
    dist.init_process_group("gloo")
    rc = 0
    try:
        out = run(args)
        if dist.get_rank() == 0:
            losses = out["distributed"]
            if args.check:
                ref, diff = out["reference"], out["max_abs_diff"]
                what = f"{dist.get_world_size()} ranks" + (", FSDP2" if args.fsdp else "") + \
                    (", compiled" if args.compile else "") + (", two masks" if args.masks == "two" else "")
                print(f"\n| step | single process | {what} | diff |\n|---:|---:|---:|---:|")
                for i, (a, b) in enumerate(zip(ref, losses)):
                    print(f"| {i} | {a:.6f} | {b:.6f} | {b - a:+.1e} |")
                print(f"max |diff| = {diff:.2e} (tolerance {args.tol:g})", flush=True)
                if not diff <= args.tol or any(math.isnan(x) for x in losses):
                    rc = 1
            if args.json:
                json.dump(out, open(args.json, "w"))
    finally:
        # every rank waits for rank 0's reference, so that gloo's connections close together
        dist.barrier()
        dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
