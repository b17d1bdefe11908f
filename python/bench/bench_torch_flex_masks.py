"""What caching FlexAttention's block masks saves: the forward of a one-rank plan through the `flex` backend
with the block-mask cache and with it bypassed, calls alternating, median of the calls after the first.

    python python/bench/bench_torch_flex_masks.py            # CPU, eager flex; CUDA tensors with --cuda

causal_document packs of the bundled histogram, fp32 on the CPU (bf16 with --cuda), one thread.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import cpsched
import cpsched.torch as cpt
from cpsched.torch import _backends as B

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda", action="store_true", help="CUDA tensors, bf16, compiled flex")
    ap.add_argument("--calls", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dev = torch.device("cuda" if a.cuda else "cpu")
    dtype, tag = (torch.bfloat16, "bf16") if a.cuda else (torch.float32, "fp32")
    backend = cpt.FlexBackend(compile=a.cuda)
    for S, (hq, hkv, d) in ((2048, (8, 4, 16)), (4096, (8, 8, 16))):
        m = cpsched.mask_from_config(os.path.join(ROOT, "configs", "quickstart.yaml"),
                                     {"problem.cp_size": 1, "problem.seqlen_per_rank": S,
                                      "problem.mask.kind": "causal_document"})
        r = cpsched.Session(cp_size=1, seqlen=S, heads=(hq, hkv, d, tag), cost_model="area").solve(
            m.q_ranges, m.k_ranges, m.types)
        q, k, v = (torch.randn(S, h, d, device=dev, dtype=dtype) for h in (hq, hkv, hkv))
        cached_get = B._FLEX_MASKS.get
        times = {"cached": [], "bypassed": []}
        try:
            for _ in range(a.calls):
                for mode in times:
                    B._FLEX_MASKS.get = cached_get if mode == "cached" else (lambda key: None)
                    with torch.no_grad():
                        t = time.perf_counter()
                        cpt.attention(q, k, v, r, backend=backend)
                        if a.cuda:
                            torch.cuda.synchronize()
                        times[mode].append(time.perf_counter() - t)
        finally:
            B._FLEX_MASKS.get = cached_get
        c, u = (statistics.median(times[x][1:]) for x in ("cached", "bypassed"))
        print(f"S = {S}, heads {hq}:{hkv}, d {d}, {dev.type}: forward {c * 1e3:.1f} ms cached, "
              f"{u * 1e3:.1f} ms bypassed ({u / c:.2f}x)")


if __name__ == "__main__":
    main()
