"""Train a small transformer on packed documents with context parallelism through cpsched.torch.

Documents are packs of the bundled length histogram (configs/data/doc_length_distribution.csv, one pack per
step); their tokens count up by a stride of 1 or 3 (mod V) chosen per document, so the loss falls. Two layers of
GQA attention (4 query heads over 2 KV heads, d = 16), RoPE on positions inside each document, fp32.

    torchrun --nproc_per_node 4 examples/torch/train_packed.py                   # sequential layout, per-layer plans
    torchrun --nproc_per_node 4 examples/torch/train_packed.py --layout planned  # dispatched in the data loader
    python examples/torch/train_packed.py --reference                            # the same run in one process
    torchrun --nproc_per_node 4 examples/torch/train_packed.py --check           # both, side by side (rank 0)

--layout sequential: every rank keeps its S / P contiguous tokens; each layer plans its own mask per step
(layer 0 causal_document, layer 1 sliding_window inside the documents) with a DistAttention module.
--layout planned: the data loader solves the step's causal_document mask with the `static` solver, whose plan
lays the tokens out anew, and dispatches tokens, labels and positions with it; both layers run that plan.
Gradients are summed over the ranks (each rank's loss is its tokens' share of the global mean).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import cpsched
import cpsched.torch as cpt
from cpsched.torch.reference import dense_attention, mask_matrix

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG = os.path.join(ROOT, "configs", "quickstart.yaml")
V, DM, HQ, HKV, D = 64, 64, 4, 2, 16


def step_data(step, P, spr, layout):
    """The step's packed documents: tokens, labels (-100 at a document's end), positions, and the layers'
    masks as (q_ranges, k_ranges, types)."""
    over = {"problem.cp_size": P, "problem.seqlen_per_rank": spr, "problem.mask.pack": step}
    m0 = cpsched.mask_from_config(CONFIG, dict(over, **{"problem.mask.kind": "causal_document"}))
    S = m0.seqlen
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.empty(S, dtype=torch.long)
    labels = torch.full((S,), -100, dtype=torch.long)
    pos = torch.empty(S, dtype=torch.long)
    for b, e in m0.q_ranges.tolist():  # causal_document: one causal slice per document
        c = 1 + 2 * int(torch.randint(0, 2, (1,), generator=g))  # a stride of 1 or 3, seen in context
        x = int(torch.randint(0, V, (1,), generator=g))
        for i in range(b, e):
            tokens[i] = x
            x = (x + c) % V
        labels[b:e - 1] = tokens[b + 1:e]
        pos[b:e] = torch.arange(e - b)
    if layout == "planned":
        masks = [m0, m0]  # one layout for the whole model: both layers run the loader's plan
    else:
        m1 = cpsched.mask_from_config(CONFIG, dict(over, **{"problem.mask.kind": "sliding_window",
                                                           "problem.mask.window": [24, 0]}))
        masks = [m0, m1]
    return tokens, labels, pos, [(m.q_ranges, m.k_ranges, m.types) for m in masks]


def rope(x, pos):
    half = x.shape[-1] // 2
    freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    ang = pos.float()[:, None] * freq[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n1 = torch.nn.RMSNorm(DM)
        self.wq = torch.nn.Linear(DM, HQ * D, bias=False)
        self.wk = torch.nn.Linear(DM, HKV * D, bias=False)
        self.wv = torch.nn.Linear(DM, HKV * D, bias=False)
        self.wo = torch.nn.Linear(HQ * D, DM, bias=False)
        self.n2 = torch.nn.RMSNorm(DM)
        self.up = torch.nn.Linear(DM, 4 * DM)
        self.down = torch.nn.Linear(4 * DM, DM)

    def forward(self, x, pos, attn):
        L = x.shape[0]
        h = self.n1(x)
        q = rope(self.wq(h).view(L, HQ, D), pos)
        k = rope(self.wk(h).view(L, HKV, D), pos)
        v = self.wv(h).view(L, HKV, D)
        x = x + self.wo(attn(q, k, v).reshape(L, HQ * D))
        return x + self.down(F.gelu(self.up(self.n2(x))))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, DM)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.norm = torch.nn.RMSNorm(DM)
        self.head = torch.nn.Linear(DM, V, bias=False)

    def forward(self, tokens, pos, attns):
        x = self.emb(tokens)
        for blk, attn in zip(self.blocks, attns):
            x = blk(x, pos, attn)
        return self.head(self.norm(x))


def make_model():
    torch.manual_seed(0)
    return Model()


def train_reference(args, P):
    """One process, the whole sequence, dense attention with each layer's boolean mask."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        tokens, labels, pos, masks = step_data(step, P, args.seqlen_per_rank, args.layout)
        S = tokens.shape[0]
        mats = [mask_matrix(q, k, t, S) for q, k, t in masks]
        attns = [lambda q, k, v, m=m: dense_attention(q, k, v, m) for m in mats]
        logits = model(tokens, pos, attns)
        loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / (labels >= 0).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_distributed(args):
    rank, P = dist.get_rank(), dist.get_world_size()
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    heads = (HQ, HKV, D, "fp32")
    if args.layout == "sequential":
        # per-layer planning: the module solves each call's mask (its cache serves repeats)
        attn_mod = cpt.DistAttention(cpsched.Session(cp_size=P, seqlen=P * args.seqlen_per_rank, heads=heads,
                                                     solver="balanced_bytes", cost_model="area", stages=2))
    else:
        loader_session = cpsched.Session(cp_size=P, seqlen=P * args.seqlen_per_rank, heads=heads, solver="static",
                                         cost_model="area", stages=2, layout="planned")
    losses, t0, dispatched = [], time.time(), 0
    for step in range(args.steps):
        tokens, labels, pos, masks = step_data(step, P, args.seqlen_per_rank, args.layout)
        count = (labels >= 0).sum()
        if args.layout == "sequential":
            lo, hi = (int(x) for x in cpsched._cpsched.sharding_ranges(tokens.shape[0], P)[rank])
            tok_l, lab_l, pos_l = tokens[lo:hi], labels[lo:hi], pos[lo:hi]
            attns = [lambda q, k, v, m=m: attn_mod(q, k, v, m) for m in masks]
        else:
            # the data loader plans the step's mask and lays tokens, labels and positions out as the plan says
            plan = cpt.prepare(loader_session.solve(*masks[0]), rank)
            dispatched += not plan.layout.sequential
            tok_l, lab_l, pos_l = (cpt.dispatch(x, plan) for x in (tokens, labels, pos))
            lay = cpt.layout_of(tok_l)
            attns = [lambda q, k, v: cpt.attention(q, k, v, plan, layout=lay)] * 2
        logits = model(tok_l, pos_l, attns)
        loss = F.cross_entropy(logits, lab_l, ignore_index=-100, reduction="sum") / count
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
        if rank == 0 and not args.quiet:
            print(f"step {step:2d}  loss {total.item():.6f}", flush=True)
    if rank == 0 and not args.quiet:
        print(f"{args.steps} steps in {time.time() - t0:.1f} s on {P} ranks ({args.layout} layout"
              + (f", {dispatched} of the steps' plans dispatched the tokens" if args.layout == "planned" else "") + ")",
              flush=True)
    return losses, dispatched


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layout", choices=["sequential", "planned"], default="sequential")
    ap.add_argument("--seqlen-per-rank", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--reference", action="store_true", help="run the single-process reference only")
    ap.add_argument("--cp", type=int, default=4, help="P whose packs the reference trains on (--reference)")
    ap.add_argument("--check", action="store_true",
                    help="after the distributed run, rank 0 runs the reference and compares (|diff| <= --tol)")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--json", help="write the losses to this file (rank 0)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.reference:
        losses = train_reference(args, args.cp)
        for i, x in enumerate(losses):
            print(f"step {i:2d}  loss {x:.6f}")
        if args.json:
            json.dump({"reference": losses}, open(args.json, "w"))
        return 0
    dist.init_process_group("gloo")
    losses, dispatched = train_distributed(args)
    rc = 0
    try:
        if dist.get_rank() == 0:
            out = {"distributed": losses, "layout": args.layout, "P": dist.get_world_size(),
                   "dispatched_steps": dispatched}
            if args.check:
                ref = train_reference(args, dist.get_world_size())
                out["reference"] = ref
                diff = max(abs(a - b) for a, b in zip(losses, ref))
                out["max_abs_diff"] = diff
                print(f"\n| step | single process | {dist.get_world_size()} ranks ({args.layout}) | diff |")
                print("|---:|---:|---:|---:|")
                for i, (a, b) in enumerate(zip(ref, losses)):
                    print(f"| {i} | {a:.6f} | {b:.6f} | {b - a:+.1e} |")
                print(f"max |diff| = {diff:.2e} (tolerance {args.tol:g})", flush=True)
                if not diff <= args.tol or any(math.isnan(x) for x in losses):
                    rc = 1
            if args.json:
                json.dump(out, open(args.json, "w"))
    finally:
        # Every rank waits for rank 0's reference, so gloo's connections close together: a rank that tears its
        # process group down while a peer is still connected can abort at exit.
        dist.barrier()
        dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
