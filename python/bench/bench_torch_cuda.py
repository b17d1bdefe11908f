"""Kernel time of cpsched.torch on one GPU: forward and backward of a one-rank plan per backend, with achieved
TFLOP/s, beside FlexAttention called directly (compiled) on the same whole mask. Exits 77 without a CUDA
device.

    python python/bench/bench_torch_cuda.py                      # S = 8192 and 32768, heads 64:8, d 128, bf16
    python python/bench/bench_torch_cuda.py --tokens 16384 --iters 20

FLOPs count the mask's area only: forward 4 * area * heads_q * d, backward 2.5x that (the usual convention:
the backward recomputes the scores and makes dQ, dK and dV). Times are medians of --iters calls after two
warm-ups, measured with CUDA events. The `torch` backend (dense per-arg scores, the reference) runs only up
to --torch-max tokens, and so does eager FlexAttention: their memory grows with the square of an arg's
size.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import cpsched
import cpsched.torch as cpt
from cpsched.torch._backends import flash_available, flex_available

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
QUICKSTART = os.path.join(ROOT, "configs", "quickstart.yaml")
def timed(fn, iters):
    """Median milliseconds of fn() over iters calls (CUDA events), after two warm-ups."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def fwd_bwd(call, q, k, v, do, iters):
    """(forward ms, backward ms) of out = call(q, k, v); out.backward(do)."""
    def fwd():
        with torch.no_grad():
            call(q, k, v)

    def both():
        for t in (q, k, v):
            t.grad = None
        call(q, k, v).backward(do)

    f = timed(fwd, iters)
    fb = timed(both, iters)
    return f, max(fb - f, 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--heads", type=int, nargs=3, default=[64, 8, 128], metavar=("Q", "KV", "D"))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--torch-max", type=int, default=8192)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 77
    hq, hkv, d = a.heads
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}; heads {hq}:{hkv}, d {d}, bf16; "
          f"median of {a.iters}")
    print(f"{'mask':16} {'S':>6} {'path':28} {'fwd ms':>8} {'bwd ms':>8} {'fwd TF/s':>9} {'bwd TF/s':>9}")
    for S in a.tokens:
        for kind in ("causal", "causal_document"):
            m = cpsched.mask_from_config(QUICKSTART, {"problem.cp_size": 1, "problem.seqlen_per_rank": S,
                                                      "problem.mask.kind": kind})
            sess = cpsched.Session(cp_size=1, seqlen=S, heads={"q": hq, "kv": hkv, "dim": d, "dtype": "bf16"},
                                   cost_model="area", layout="fixed")
            res = sess.solve(m.q_ranges, m.k_ranges, m.types)
            area = int(res.metrics["load"].sum()) // hq  # the area cost model's load: mask area x q heads
            tp = cpt.prepare(res, 0)
            g = torch.Generator(device=dev).manual_seed(S)
            q = torch.randn(S, hq, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
            k = torch.randn(S, hkv, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
            v = torch.randn(S, hkv, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
            do = torch.randn(S, hq, d, device=dev, dtype=torch.bfloat16, generator=g)
            flops = 4.0 * area * hq * d
            paths = []
            backends = [("flash", "flash")] * flash_available()
            backends += [("flex compiled", cpt.FlexBackend(compile=True))] * flex_available()
            # eager flex and the torch kernels materialise an arg's scores: small S only
            backends += [("flex", "flex")] * (flex_available() and S <= a.torch_max)
            backends += [("torch", "torch")] * (S <= a.torch_max)
            for label, be in backends:
                paths.append((f"cpsched.torch {label}", lambda x, y, z, be=be: cpt.attention(x, y, z, tp, backend=be)))
            if flex_available():  # the yardstick: FlexAttention itself, compiled, on the whole mask
                from torch.nn.attention.flex_attention import create_block_mask, flex_attention
                doc = torch.zeros(S, dtype=torch.int64)
                for i, (qb, qe) in enumerate(m.q_ranges):
                    doc[int(qb):int(qe)] = i
                doc = doc.to(dev)
                bm = create_block_mask(lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (ki <= qi), None, None, S, S,
                                       device=str(dev))
                flex = torch.compile(flex_attention, dynamic=False)

                def ref(x, y, z):
                    o = flex(x.transpose(0, 1).unsqueeze(0), y.transpose(0, 1).unsqueeze(0),
                             z.transpose(0, 1).unsqueeze(0), block_mask=bm, enable_gqa=True)
                    return o[0].transpose(0, 1)
                paths.append(("flex_attention direct", ref))
            for name, call in paths:
                try:
                    f, b = fwd_bwd(call, q, k, v, do, a.iters)
                except Exception as e:  # noqa: BLE001 - a path that cannot run here is reported, not fatal
                    print(f"{kind:16} {S:>6} {name:28} failed: {type(e).__name__}: {str(e)[:200]}")
                    continue
                print(f"{kind:16} {S:>6} {name:28} {f:8.3f} {b:8.3f} {flops / f / 1e9:9.1f} "
                      f"{2.5 * flops / max(b, 1e-9) / 1e9:9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
