"""Each rank's measured attention time against the kernel model's prediction, on one GPU (issue 48's check;
docs/bounds.md, "Plans priced as the kernels run them").

    python python/bench/check_kernel_model.py --hardware configs/hardware/h200_measured.yaml --out check.txt
    python python/bench/check_kernel_model.py --cp 8 --packs 0 1 2 --masks causal_document
    python python/bench/check_kernel_model.py --cpu-smoke        # the script's logic at toy sizes on the CPU

The plans are bench_step_time's (tools/bench/bench_step_time.cpp): the standard workload of
configs/quickstart.yaml (seed-42 packs of the bundled histogram, 8192 tokens per rank, heads 64:8, D 128, bf16,
flattened head groups), planned by the default solver on the time model of --hardware, layout planned (made
ahead), stages and relays auto; P = 8 and 64 (--cp), causal_document and full_document (--masks), pack 0
(--packs). Each plan runs once with its P ranks as threads of this process on this GPU (cpsched.torch.loopback,
the aten backend: PyTorch's FA2 varlen ops); then each rank alone runs its stages again, its collectives
replaced by nothing, --reps times. Per rank and pass: the kernel model's compute of the rank
(Result.predicted_compute on --hardware), the rank's FA2 calls measured alone (CUDA events around each call;
"kern"), their ratio, and the whole stages' time (with the gathers and merges around the calls). The check:
every rank's kern / model within 1 +- --tol (0.15) in both passes.

Exits 77 without a CUDA device (unless --cpu-smoke), 1 when a rank is outside the tolerance (not with
--cpu-smoke, whose times mean nothing).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch_cuda as btc  # noqa: E402 - the loopback timing of bench_torch_cuda, shared
import cpsched  # noqa: E402
from cpsched.torch import loopback  # noqa: E402

MASKS = ["causal_document", "full_document"]


def plan(hardware, P, mask, pack, tokens):
    """bench_step_time's plan of (mask, P, pack) on `hardware` (a Result)."""
    s = cpsched.Session.from_config(btc.QUICKSTART, {
        "problem.cp_size": P, "problem.seqlen_per_rank": tokens, "problem.mask.kind": mask,
        "problem.mask.pack": pack, "problem.layout": "planned", "hardware": hardware,
        "cost_model.name": "time", "solver.name": "balanced_bytes", "plan.stages": "auto", "plan.relay": "auto"})
    return s.solve_config()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hardware", default=None,
                    help="the profile that plans and predicts (bundled name or YAML path; default: "
                         "configs/hardware/<gpu>_measured.yaml where it exists, else the bundled profile of the GPU)")
    ap.add_argument("--cp", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--masks", nargs="+", default=MASKS, choices=MASKS)
    ap.add_argument("--packs", type=int, nargs="+", default=[0])
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per rank (bench_step_time's 8192)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls of each rank alone (the median is kept)")
    ap.add_argument("--tol", type=float, default=0.15, help="largest |kern / model - 1| that passes")
    ap.add_argument("--out", default=None, help="also append everything printed to this file")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="P = 2 and 4, 256 tokens per rank, the torch kernels on the CPU (the logic only)")
    a = ap.parse_args(argv)
    if min(a.cp) < 1 or a.tokens < 1 or a.reps < 1 or min(a.packs) < 0 or not a.tol > 0:
        ap.error("--cp, --tokens, --reps: expected positive numbers; --packs: >= 0; --tol: > 0")
    out = btc.Out(a.out)
    if a.cpu_smoke:
        device, backend = torch.device("cpu"), "torch"
        a.cp, a.tokens, a.reps, a.packs = [2, 4], 256, 1, a.packs[:1]
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        out("check_kernel_model: no CUDA device: skipped")
        return 77
    else:
        device, backend = torch.device("cuda"), "aten"
    if a.hardware is None:
        bundled = btc.default_hardware(device)
        measured = os.path.join(btc.ROOT, "configs", "hardware", bundled.split("_")[0] + "_measured.yaml")
        a.hardware = measured if os.path.exists(measured) else bundled
    a.heads = [64, 8, 128]
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    out(f"check_kernel_model: {dev}, torch {torch.__version__}, cpsched {cpsched.__version__}; hardware "
        f"{a.hardware}; backend {backend}; {a.tokens} tokens per rank; median of {a.reps}; tolerance {a.tol:.0%}")
    out(f"{'mask':16} {'P':>3} {'pack':>4} {'rank':>4} {'model fwd':>9} {'kern fwd':>8} {'k/m':>5} {'model bwd':>9} "
        f"{'kern bwd':>8} {'k/m':>5} {'stage fwd':>9} {'stage bwd':>9}")
    t0 = time.perf_counter()
    worst, bad = 0.0, []
    for P in a.cp:
        for mask in a.masks:
            for pack in a.packs:
                res = plan(a.hardware, P, mask, pack, a.tokens)
                per = loopback.run(btc._rank_fn, P, res, a, device, torch.bfloat16, backend, a.reps, timeout=1200)
                for r, (f, b, kf, kb) in enumerate(per):
                    pc = res.predicted_compute(r, hardware=a.hardware)
                    mf, mb = pc["fwd"] * 1e3, pc["bwd"] * 1e3
                    rf, rb = kf / max(mf, 1e-12), kb / max(mb, 1e-12)
                    off = max(abs(rf - 1), abs(rb - 1))
                    worst = max(worst, off)
                    if off > a.tol:
                        bad.append((mask, P, pack, r))
                    out(f"{mask:16} {P:>3} {pack:>4} {r:>4} {mf:9.3f} {kf:8.3f} {rf:5.2f} {mb:9.3f} {kb:8.3f} "
                        f"{rb:5.2f} {f:9.3f} {b:9.3f}{'  outside' if off > a.tol else ''}")
    out(f"check_kernel_model: worst |kern / model - 1| {worst:.1%} over every rank and pass; {len(bad)} rank(s) "
        f"outside {a.tol:.0%}; {time.perf_counter() - t0:.0f} s")
    if a.cpu_smoke:
        out("check_kernel_model: --cpu-smoke: CPU times against a GPU model mean nothing; not judged")
        return 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
