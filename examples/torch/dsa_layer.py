"""One DeepSeek-style sparse attention (DSA) layer under context parallelism with cpsched.torch: each rank's
indexer picks the top-k keys of its own queries, and the layer plans that mask per call where the indices are.

    torchrun --nproc_per_node 4 examples/torch/dsa_layer.py            # forward + backward, every rank
    torchrun --nproc_per_node 4 examples/torch/dsa_layer.py --check    # and compare with one dense process

Heads are MLA in MQA mode (8 query heads over one shared latent KV row of 48 dims, V its first 32), fp32. The
indexer scores a query against every earlier key with small index features (all-gathered: 8 dims per token),
so each rank holds only the rows [S/P, 1, k] of its own queries. DistAttention (its Session knows the rank)
then, per call: counts the rank's summary and row runs with torch ops on the indices' device, all-gathers the
summaries (a few KiB), plans the rank's part on the host from them alone, writes the plan's index rows on the
device and runs forward and backward with the plan's collectives (docs/torch.md, "Index masks").
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import cpsched
import cpsched.torch as cpt
from cpsched.torch.reference import dense_attention, topk_matrix

HQ, D, DV, DI = 8, 48, 32, 8


def inputs(S, seed):
    """Global q [S, HQ, D], the latent KV [S, 1, D], the indexer's features [S, DI] and dO [S, HQ, DV]."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(S, HQ, D, generator=g), torch.randn(S, 1, D, generator=g), torch.randn(S, DI, generator=g),
            torch.randn(S, HQ, DV, generator=g))


def indexer(feat_q, feat_all, first, k):
    """Top-k earlier keys (itself included) of queries [first, first + n) by feature dot products: int64
    [n, 1, k], -1 padded where a query has fewer than k keys before it."""
    n, S = feat_q.shape[0], feat_all.shape[0]
    scores = feat_q @ feat_all.T                                           # [n, S]
    q = torch.arange(first, first + n).view(n, 1)
    scores = scores.masked_fill(torch.arange(S).view(1, S) > q, float("-inf"))
    top = torch.topk(scores, k=min(k, S), dim=1)
    return torch.where(torch.isinf(top.values), torch.full_like(top.indices, -1), top.indices).unsqueeze(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens-per-rank", type=int, default=64)
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="rank 0 compares out and the gradients with one dense process")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, P = dist.get_rank(), dist.get_world_size()
    S = P * a.tokens_per_rank
    lo, hi = (int(x) for x in cpsched._cpsched.sharding_ranges(S, P)[rank])
    q, kv, feat, do = inputs(S, a.seed)
    # this rank's shards (the sequential layout: a per-layer mask keeps the tokens where they are)
    ql, kvl = q[lo:hi].clone().requires_grad_(), kv[lo:hi].clone().requires_grad_()
    feats = [torch.empty(hi - lo, DI) for _ in range(P)]  # sequential shards of equal length here
    dist.all_gather(feats, feat[lo:hi].contiguous())
    idx = indexer(feat[lo:hi], torch.cat(feats), lo, a.topk)  # only this rank's rows
    session = cpsched.Session(cp_size=P, seqlen=S, rank=rank, cost_model="time",
                              heads={"q": HQ, "kv": 1, "dim_qk": D, "dim_v": DV, "kv_shared": True, "dtype": "fp32"})
    attn = cpt.DistAttention(session)
    out = attn(ql, kvl, None, idx)
    out.backward(do[lo:hi])
    tp = attn.last_plan
    print(f"rank {rank}: {tp!r}; planned by {tp.result.solver}, {sum(1 for lst in [tp.fwd.stage0] + tp.fwd.stages for x in lst if x.index_width > 0)} "
          f"index args, pool of {tp.fwd.deferred_entries} entries written on {idx.device}", flush=True)
    try:
        if a.check:
            got = {n: [torch.empty_like(x) for _ in range(P)] for n, x in
                   (("out", out.detach()), ("dq", ql.grad), ("dkv", kvl.grad), ("idx", idx))}
            for n, x in (("out", out.detach()), ("dq", ql.grad), ("dkv", kvl.grad), ("idx", idx)):
                dist.all_gather(got[n], x.contiguous())
            if rank == 0:
                qr, kr = q.double().requires_grad_(), kv.double().requires_grad_()
                ref = dense_attention(qr, kr, kr[..., :DV], topk_matrix(torch.cat(got["idx"])))
                ref.backward(do.double())
                err = {"out": (torch.cat(got["out"]) - ref).abs().max().item(),
                       "dq": (torch.cat(got["dq"]) - qr.grad).abs().max().item(),
                       "dkv": (torch.cat(got["dkv"]) - kr.grad).abs().max().item()}
                print("max |distributed - dense|: " + ", ".join(f"{n} {e:.2e}" for n, e in err.items()), flush=True)
                if max(err.values()) > a.tol:
                    raise SystemExit(f"dsa_layer: the distributed layer differs from the dense one by more than {a.tol}")
    finally:  # the ranks close gloo's connections together, after rank 0's check (train_packed.py says why)
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
