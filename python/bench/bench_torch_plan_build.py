"""The time to prepare a TorchPlan from a Result (`TorchPlan(result, rank)`, what the first call with a Result
does) and from the plan's text (`TorchPlan.from_json`), median of --repeat, for a causal_document mask and a
DSA-like token top-k mask at P = --cp (CPU only; the solve is not timed).

  python python/bench/bench_torch_plan_build.py [--cp 8] [--spr 2048] [--topk 64] [--repeat 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import cpsched
import cpsched.torch as cpt

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def topk_indices(S, k, seed=0):
    """Per query itself and k - 1 distinct earlier keys (fewer near the start), sorted, -1 padded."""
    rng = np.random.default_rng(seed)
    idx = np.full((S, 1, k), -1, dtype=np.int32)
    for q in range(S):
        n = min(k, q + 1)
        sel = rng.choice(q, size=n - 1, replace=False) if n > 1 else np.zeros(0, dtype=np.int64)
        idx[q, 0, :n] = np.sort(np.append(sel, q))
    return idx


def cases(P, spr, topk, which, blocks=(1,)):
    S = P * spr
    if "document" in which:
        m = cpsched.mask_from_config(os.path.join(ROOT, "configs", "quickstart.yaml"),
                                     {"problem.cp_size": P, "problem.seqlen_per_rank": spr,
                                      "problem.mask.kind": "causal_document"})
        r = cpsched.Session(cp_size=P, seqlen=S, heads=(8, 2, 64, "bf16"), solver="balanced_bytes", stages=2).solve(
            m.q_ranges, m.k_ranges, m.types)
        yield f"causal_document P={P} S={S} stages=2", r
    if "topk" in which:
        heads = {"q": 16, "kv": 1, "dim": 576, "dim_v": 512, "kv_shared": True, "dtype": "bf16"}
        idx = topk_indices(S, topk)
        for bpr in blocks:  # a finer grid: more cells, more args
            r = cpsched.Session(cp_size=P, seqlen=S, heads=heads, stages=2, blocks_per_rank=bpr).solve_topk(idx)
            yield f"DSA top-{topk} P={P} S={S} stages=2 blocks_per_rank={bpr}", r


def median_ms(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cp", type=int, default=8)
    ap.add_argument("--spr", type=int, default=2048, help="tokens per rank")
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--blocks", default="1,16", help="the top-k plans' blocks_per_rank")
    ap.add_argument("--cases", default="document,topk", help="document, topk or both")
    ap.add_argument("--no-text", action="store_true", help="time TorchPlan(result, rank) only")
    a = ap.parse_args()
    for name, r in cases(a.cp, a.spr, a.topk, a.cases, [int(x) for x in a.blocks.split(",")]):
        args = sum(len(r.calc_meta(k).local_attn_args) + sum(len(x) for x in r.calc_meta(k).remote_attn_args)
                   for k in range(a.cp))
        line = f"{name} ({args} fwd args): TorchPlan(result, 0) {median_ms(lambda: cpt.TorchPlan(r, 0), a.repeat):.1f} ms"
        line += f", all_ranks {median_ms(lambda: cpt.TorchPlan.all_ranks(r), a.repeat):.1f} ms"
        if not a.no_text:
            text = r.to_json()
            line += f", from_json(text, 0) {median_ms(lambda: cpt.TorchPlan.from_json(text, 0), a.repeat):.1f} ms"
        print(line, flush=True)


if __name__ == "__main__":
    main()
