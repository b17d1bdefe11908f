"""cpsched.torch on one GPU against the kernels it is built on (docs/torch.md, "On a GPU").

    python python/bench/bench_torch_cuda.py --out build/gpu_check/bench_torch_cuda.txt
    python python/bench/bench_torch_cuda.py --tokens 16384 --masks causal_document --iters 10
    python python/bench/bench_torch_cuda.py --cpu-smoke        # every section at toy sizes on the CPU

Heads 64:8, d 128, bf16 (--heads); masks causal, causal_document, full_document, sliding_window of the bundled
histogram (configs/quickstart.yaml) at 8k, 16k and 32k tokens per rank (--tokens). Sections:

1. P = 1, per mask and size, forward and backward ms and TFLOP/s (and the kernel model's ms of the plan's rank,
   on --hardware) of
   * FA2 varlen direct: torch.ops.aten._flash_attention_forward / _backward called directly on the very
     batches cpsched.torch's aten backend builds (recorded from one call: same cu_seqlens, windows, inputs);
   * FlexAttention compiled, called directly on the whole mask (its BlockMask built blockwise from the
     mask's row spans); by default only causal_document at 16k (--flex all: every row; compiles are slow);
   * cpsched.torch at P = 1 per backend: aten, flash (if flash-attn imports), flex compiled (with --flex all),
     torch (up to --torch-max tokens), and auto.
2. Loopback P = 8 (--ranks): the plan of 8 x tokens per rank, the ranks as threads on this GPU
   (cpsched.torch.loopback). One call of every rank fills its buffers; then each rank alone runs its stages'
   kernels (its collectives replaced by nothing: the buffers keep what the real call received), timed with
   CUDA events around each stage. Per rank: its area, its attention ms, and that time over its area at the
   P = 1 rate of the same backend and mask (the issue asks <= 1.25); its kernel calls' ms alone (CUDA events
   around each FA2 call), the kernel model's prediction of them (Result.predicted_compute on --hardware) and
   kernels / model.
3. DSA's index kernel (Triton) on configs/dsa.yaml's shapes: 128 heads on one 576-dim latent (V its first
   512), top-2048, one rank's 4096 queries of S = 32768, DSA-like selections (sink, local window, random
   earlier keys); TFLOP/s counted on the selected pairs: forward 2 hq (d_qk + d_v) per pair, backward
   2 hq (3 d_qk + 2 d_v) (S recomputed, dP, dS K, dS^T Q, P^T dO). --triton-sweep times other tile shapes.
4. Host time per call (forward + backward issued, no sync inside), eager and with graphs=True: P = 1
   causal_document, and a rank of a P = 8 plan whose collectives are single device copies (a capturable
   stand-in of NCCL, one launch each: the host's part of a real P = 8 call), at --host-tokens per rank.

FLOPs of attention count the mask's area only: forward 4 x area x heads_q x d, backward 2.5x that. Times are
medians of --iters calls after warm-ups, CUDA events. Everything printed is also written to --out.
Exits 77 without a CUDA device (unless --cpu-smoke).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import cpsched
import cpsched.torch as cpt
from cpsched.torch import _graphs, loopback
from cpsched.torch._api import _Attention
from cpsched.torch._backends import flash_available, flex_available
from cpsched.torch._plan import TorchPlan
from cpsched.torch._varlen import VarlenBackend

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
QUICKSTART = os.path.join(ROOT, "configs", "quickstart.yaml")
MASKS = ["causal", "causal_document", "full_document", "sliding_window"]


class Out:
    """print() that also appends to a file."""

    def __init__(self, path):
        self.f = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.f = open(path, "a", buffering=1)

    def __call__(self, *a):
        text = " ".join(str(x) for x in a)
        print(text, flush=True)
        if self.f:
            self.f.write(text + "\n")


def timed(fn, iters, device, warm=2):
    """Median ms of fn() over iters calls after `warm` calls (CUDA events; perf_counter on the CPU)."""
    for _ in range(warm):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ts = []
    for _ in range(iters):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def fwd_bwd(call, q, k, v, do, iters, device):
    """(forward ms, backward ms) of out = call(q, k, v); out.backward(do)."""
    def fwd():
        with torch.no_grad():
            call(q, k, v)

    def both():
        for t in (q, k, v):
            t.grad = None
        call(q, k, v).backward(do)
    f = timed(fwd, iters, device)
    fb = timed(both, iters, device)
    return f, max(fb - f, 0.0)


def mask_of(kind, P, tokens):
    return cpsched.mask_from_config(QUICKSTART, {"problem.cp_size": P, "problem.seqlen_per_rank": tokens,
                                                "problem.mask.kind": kind})


def session(P, S, heads, stages=2, relay=0):
    hq, hkv, d = heads
    return cpsched.Session(cp_size=P, seqlen=S, heads={"q": hq, "kv": hkv, "dim": d, "dtype": "bf16"},
                           cost_model="area", layout="fixed", stages=stages, relay_node_size=relay)


def areas(res, hq):
    """Per rank the mask area it computes (the area cost model's load is area x q heads)."""
    return [int(x) // hq for x in res.metrics["load"]]


def inputs(S, heads, device, dt, seed=0):
    hq, hkv, d = heads
    g = torch.Generator(device=device).manual_seed(seed)
    mk = lambda h: torch.randn(S, h, d, device=device, dtype=dt, generator=g)  # noqa: E731
    return mk(hq).requires_grad_(), mk(hkv).requires_grad_(), mk(hkv).requires_grad_(), mk(hq)


def tflops(flops, ms):
    return flops / max(ms, 1e-9) / 1e9


class Recording(cpt.AtenBackend):
    """The aten backend, keeping a copy of each kernel call's arguments (the batches it builds)."""

    def __init__(self):
        super().__init__()
        self.fwd_calls, self.bwd_calls = [], []

    def _fwd(self, *a):
        self.fwd_calls.append(tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in a))
        return super()._fwd(*a)

    def _bwd(self, *a):
        self.bwd_calls.append(tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in a))
        return super()._bwd(*a)


def fa2_direct(tp, q, k, v, do, iters, device):
    """(fwd ms, bwd ms) of the aten FA2 ops alone on the batches the aten backend builds for this plan."""
    rec = Recording()
    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
    cpt.attention(qq, kk, vv, tp, backend=rec).backward(do)
    be = cpt.AtenBackend()

    def fwd():
        for a in rec.fwd_calls:
            be._fwd(*a)

    def bwd():
        for a in rec.bwd_calls:
            be._bwd(*a)
    return timed(fwd, iters, device), timed(bwd, iters, device), len(rec.fwd_calls)


def flex_direct(m, S, q, k, v, do, iters, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from cpsched.torch._backends import _FlexMask
    geo = tuple((int(a), int(b), int(c), int(d), int(t)) for (a, b), (c, d), t in zip(m.q_ranges, m.k_ranges, m.types))
    bm = _FlexMask(create_block_mask, geo, (S, S), device).block_mask
    flex = torch.compile(flex_attention, dynamic=False)

    def call(x, y, z):
        o = flex(x.transpose(0, 1).unsqueeze(0), y.transpose(0, 1).unsqueeze(0), z.transpose(0, 1).unsqueeze(0),
                 block_mask=bm, enable_gqa=True)
        return o[0].transpose(0, 1)
    return fwd_bwd(call, q, k, v, do, iters, device)


def section_p1(a, out, device):
    """Per mask and size: the kernels direct and cpsched.torch's backends at P = 1. Returns the P = 1 rate
    (area per ms) of each (mask, tokens, backend) for section 2."""
    hq, hkv, d = a.heads
    rates = {}
    out(f"\n== 1. P = 1: heads {hq}:{hkv}, d {d}, bf16; median of {a.iters}; TFLOP/s of the mask's area ==")
    out(f"model: the kernel model's compute of the plan's one rank on {a.hardware} (Result.predicted_compute)")
    out(f"{'mask':16} {'S':>6} {'path':34} {'fwd ms':>8} {'bwd ms':>8} {'fwd TF/s':>9} {'bwd TF/s':>9} "
        f"{'model fwd':>9} {'model bwd':>9}")
    dt = torch.bfloat16
    for S in a.tokens:
        for kind in a.masks:
            m = mask_of(kind, 1, S)
            res = session(1, S, a.heads, stages=1).solve(m.q_ranges, m.k_ranges, m.types)
            area = sum(areas(res, hq))
            flops = 4.0 * area * hq * d
            tp = cpt.prepare(res, 0)
            q, k, v, do = inputs(S, a.heads, device, dt, S)
            pc = res.predicted_compute(0, hardware=a.hardware)

            def row(name, f, b):
                out(f"{kind:16} {S:>6} {name:34} {f:8.3f} {b:8.3f} {tflops(flops, f):9.1f} "
                    f"{tflops(2.5 * flops, b):9.1f} {pc['fwd'] * 1e3:9.3f} {pc['bwd'] * 1e3:9.3f}")
            if device.type == "cuda":
                try:
                    f, b, n = fa2_direct(tp, q, k, v, do, a.iters, device)
                    row(f"FA2 varlen direct ({n} calls)", f, b)
                except Exception as e:  # noqa: BLE001 - a path that cannot run here is reported, not fatal
                    out(f"{kind:16} {S:>6} FA2 varlen direct: failed: {type(e).__name__}: {str(e)[:160]}")
            if flex_available() and device.type == "cuda" and (a.flex == "all" or (kind == "causal_document"
                                                                                   and S == 16384)):
                try:
                    row("FlexAttention compiled direct", *flex_direct(m, S, q, k, v, do, a.iters, device))
                except Exception as e:  # noqa: BLE001
                    out(f"{kind:16} {S:>6} FlexAttention direct: failed: {type(e).__name__}: {str(e)[:160]}")
            backends = []
            if device.type == "cuda":
                backends += [("aten", "aten")] + [("flash", "flash")] * flash_available()
                if a.flex == "all" and flex_available():
                    backends.append(("flex compiled", cpt.FlexBackend(compile=True)))
            backends += [("torch", "torch")] * (S <= a.torch_max) + [("auto", "auto")]
            for label, be in backends:
                try:
                    f, b = fwd_bwd(lambda x, y, z, be=be: cpt.attention(x, y, z, tp, backend=be), q, k, v, do,
                                   a.iters, device)
                except Exception as e:  # noqa: BLE001
                    out(f"{kind:16} {S:>6} cpsched.torch {label}: failed: {type(e).__name__}: {str(e)[:160]}")
                    continue
                row(f"cpsched.torch {label}", f, b)
                rates[(kind, S, label)] = (area / max(f, 1e-6), area / max(b, 1e-6))
    return rates


class _Null:
    """Collectives that do nothing: a rank alone, its receive buffers as the last real call left them."""
    group = None

    class _W:
        def wait(self):
            return None

    def a2a(self, *a):
        return self._W()


class Timing:
    """A backend wrapper that times each stage's kernels (CUDA events; perf_counter on the CPU)."""

    def __init__(self, inner, device):
        self.inner, self.device = inner, device
        self.ms = {"fwd": 0.0, "bwd": 0.0}
        self.name = getattr(inner, "name", "?")

    def graph_key(self):
        return ("timing", id(self))

    def _time(self, pass_, fn, args, b):
        if self.device.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn(args, b)
            e1.record()
            e1.synchronize()
            self.ms[pass_] += e0.elapsed_time(e1)
        else:
            t0 = time.perf_counter()
            fn(args, b)
            self.ms[pass_] += (time.perf_counter() - t0) * 1e3

    def forward_stage(self, args, b):
        self._time("fwd", self.inner.forward_stage, args, b)

    def backward_stage(self, args, b):
        self._time("bwd", self.inner.backward_stage, args, b)


class KernelClock:
    """Times a varlen backend's kernel calls (its `_fwd` / `_bwd`: one FA2 call per batch) per pass, CUDA events
    around each (perf_counter on the CPU); what the kernel model predicts, without the stage's gathers and
    merges. `on` is False for a backend without varlen calls (the torch kernels: the stage is all kernels)."""

    def __init__(self, be, device):
        self.device = device
        self.ms = {"fwd": 0.0, "bwd": 0.0}
        self.on = isinstance(be, VarlenBackend)
        if self.on:
            for pass_, name in (("fwd", "_fwd"), ("bwd", "_bwd")):
                setattr(be, name, self._wrap(pass_, getattr(be, name)))

    def _wrap(self, pass_, fn):
        def run(*args):
            if self.device.type == "cuda":
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                out = fn(*args)
                e1.record()
                e1.synchronize()
                self.ms[pass_] += e0.elapsed_time(e1)
            else:
                t0 = time.perf_counter()
                out = fn(*args)
                self.ms[pass_] += (time.perf_counter() - t0) * 1e3
            return out
        return run


def _rank_fn(rank, group, res, a, device, dt, backend, reps):
    """One real call, then each rank alone (in rank order) `reps` times: the medians of its stages' ms per pass
    (fwd, bwd) and of its kernel calls' ms (fwd, bwd; the stages' where the backend has no varlen calls)."""
    tp = cpt.prepare(res, rank)
    q, k, v, do = inputs(tp.layout.rows(rank), a.heads, device, dt, 100 + rank)
    be = cpt._backends.make_backend(backend, device, dt, tp)
    clock = KernelClock(be, device)
    out = cpt.attention(q, k, v, tp, group, backend=be, check_peers=False)
    out.backward(do)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dp = tp.on(device)
    fwd, bwd, kfwd, kbwd = [], [], [], []
    for r in range(tp.cp_size):
        group.barrier()
        if r != rank:
            continue
        for _ in range(reps):
            tb = Timing(be, device)
            clock.ms = {"fwd": 0.0, "bwd": 0.0}
            qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
            o, _ = _Attention.apply(qq, kk, vv, dp, tb, _Null(), 1.0 / tp.dqk ** 0.5, False)
            o.backward(do)
            fwd.append(tb.ms["fwd"])
            bwd.append(tb.ms["bwd"])
            kfwd.append(clock.ms["fwd"] if clock.on else tb.ms["fwd"])
            kbwd.append(clock.ms["bwd"] if clock.on else tb.ms["bwd"])
    group.barrier()
    return tuple(statistics.median(x) for x in (fwd, bwd, kfwd, kbwd))


def section_loopback(a, out, device, rates):
    hq, hkv, d = a.heads
    P = a.ranks
    dt = torch.bfloat16
    backend = "aten" if device.type == "cuda" else "torch"
    out(f"\n== 2. loopback P = {P} on one device: each rank alone, its stages ({backend}), median of {a.reps}; "
        f"ratio = its ms / (its area at the P = 1 rate of the same mask and tokens per rank); kern: its kernel "
        f"calls alone; model: the kernel model's compute of the rank on {a.hardware} (Result.predicted_compute) ==")
    out(f"{'mask':16} {'tok/rank':>8} {'rank':>4} {'area M':>8} {'fwd ms':>8} {'bwd ms':>8} {'fwd ratio':>9} "
        f"{'bwd ratio':>9} {'kern fwd':>8} {'kern bwd':>8} {'model fwd':>9} {'model bwd':>9} {'k/m fwd':>7} "
        f"{'k/m bwd':>7}")
    for tokens in a.loopback_tokens:
        for kind in a.masks:
            rate = rates.get((kind, tokens, backend))
            m = mask_of(kind, P, tokens)
            res = session(P, P * tokens, a.heads, stages=2, relay=0).solve(m.q_ranges, m.k_ranges, m.types)
            ar = areas(res, hq)
            t0 = time.perf_counter()
            per = loopback.run(_rank_fn, P, res, a, device, dt, backend, a.reps, timeout=600)
            wall = time.perf_counter() - t0
            worst = (0.0, 0.0)
            for r, (f, b, kf, kb) in enumerate(per):
                fr = f / (ar[r] / rate[0]) if rate else float("nan")
                br = b / (ar[r] / rate[1]) if rate else float("nan")
                worst = (max(worst[0], fr), max(worst[1], br))
                pc = res.predicted_compute(r, hardware=a.hardware)
                mf, mb = pc["fwd"] * 1e3, pc["bwd"] * 1e3
                out(f"{kind:16} {tokens:>8} {r:>4} {ar[r] / 1e6:8.1f} {f:8.3f} {b:8.3f} {fr:9.2f} {br:9.2f} "
                    f"{kf:8.3f} {kb:8.3f} {mf:9.3f} {mb:9.3f} {kf / max(mf, 1e-9):7.2f} {kb / max(mb, 1e-9):7.2f}")
            out(f"{kind:16} {tokens:>8}  max ratio fwd {worst[0]:.2f}, bwd {worst[1]:.2f} "
                f"({'no P = 1 rate: run section 1 at these tokens' if not rate else 'target <= 1.25'}); "
                f"the loopback run took {wall:.1f} s")


def dsa_rows(S, n, k, device, seed=42):
    """One rank's (the last one's) DSA-like selections: query at global position p selects the 64 first keys
    of the sequence (sink), its 512 most recent keys (local window, itself included) and random earlier keys,
    k in all (fewer for early queries; -1 padded)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    pos = torch.arange(S - n, S)
    idx = torch.full((n, k), -1, dtype=torch.int64)
    for i, p in enumerate(pos.tolist()):
        sink = torch.arange(0, min(64, p + 1))
        local = torch.arange(max(0, p - 511), p + 1)
        base = torch.unique(torch.cat([sink, local]))
        extra = k - base.numel()
        if extra > 0 and p + 1 > base.numel():
            pool = torch.ones(p + 1, dtype=torch.bool)
            pool[base] = False
            cand = torch.nonzero(pool).view(-1)
            pick = cand[torch.randperm(cand.numel(), generator=g)[:extra]]
            base = torch.cat([base, pick])
        base = base[:k]
        idx[i, :base.numel()] = base
    return idx.to(device)


def section_dsa(a, out, device):
    from cpsched.torch import _triton as T
    why = T.triton_unavailable(device, torch.bfloat16)
    if why:
        out(f"\n== 3. DSA index kernel: skipped ({why}) ==")
        return
    hq, dqk, dv, k, S, n = 128, 576, 512, 2048, 32768, 4096
    if device.type != "cuda":
        hq, dqk, dv, k, S, n = 16, 48, 32, 16, 256, 32
    dt = torch.bfloat16
    g = torch.Generator(device=device).manual_seed(7)
    q = torch.randn(n, hq, dqk, device=device, dtype=dt, generator=g)
    kb = torch.randn(S, 1, dqk, device=device, dtype=dt, generator=g)
    vb = kb[..., :dv]
    idx = dsa_rows(S, n, k, device)
    pairs = int((idx >= 0).sum())
    do = torch.randn(n, hq, dv, device=device, dtype=dt, generator=g)
    ffl = 2.0 * pairs * hq * (dqk + dv)
    bfl = 2.0 * pairs * hq * (3 * dqk + 2 * dv)
    out(f"\n== 3. DSA index kernel (Triton): {n} queries, {hq} heads on one latent of {dqk} (V: first {dv}), "
        f"top-{k}, {pairs / 1e6:.2f} M selected pairs; median of {a.iters} ==")
    out(f"{'BLOCK_H':>7} {'BLOCK_N':>7} {'fwd ms':>8} {'bwd ms':>8} {'fwd TF/s':>9} {'bwd TF/s':>9}")
    o, lse = T.index_forward(q, kb, vb, idx, dqk ** -0.5)
    delta = (do.float() * o).sum(-1)
    dq = torch.zeros(n, hq, dqk, device=device)
    dk = torch.zeros(S, 1, dqk, device=device)
    bh0, bn0, _ = T.config(hq, dqk, dv, True)
    configs = [(None, None)]
    if a.triton_sweep and device.type == "cuda":
        configs += [(bh, bn) for bh in (16, 32, 64) for bn in (32, 64) if (bh, bn) != (bh0, bn0)]
    for bh, bn in configs:
        try:
            f = timed(lambda: T.index_forward(q, kb, vb, idx, dqk ** -0.5, block_h=bh, block_n=bn), a.iters, device)
            b = timed(lambda: T.index_backward(q, kb, vb, do, lse, delta, idx, dqk ** -0.5, dq, dk, dk[..., :dv],
                                               block_h=bh, block_n=bn), a.iters, device)
        except Exception as e:  # noqa: BLE001 - a tile shape that does not fit is reported
            out(f"{bh or bh0:>7} {bn or bn0:>7} failed: {type(e).__name__}: {str(e)[:160]}")
            continue
        out(f"{bh or bh0:>7} {bn or bn0:>7} {f:8.3f} {b:8.3f} {tflops(ffl, f):9.1f} {tflops(bfl, b):9.1f}")


def host_us(call, n, device, warm=5):
    """Median host microseconds of call() (what the host spends issuing it; the device is idle at each start)."""
    ts = []
    for i in range(warm + n):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        if i >= warm:
            ts.append((t1 - t0) * 1e6)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return statistics.median(ts)


def section_host(a, out, device):
    hq, hkv, d = a.heads
    dt = torch.bfloat16
    tokens = a.host_tokens
    backend = "aten" if device.type == "cuda" else "torch"
    out(f"\n== 4. host time per call (forward + backward issued), {tokens} tokens per rank, {backend}; median of "
        f"{a.host_calls} calls, us ==")
    out(f"{'plan':34} {'eager us':>9} {'graphs us':>9} {'graph state':>12}")
    cases = []
    m1 = mask_of("causal_document", 1, tokens)
    cases.append(("P = 1 causal_document", TorchPlan(session(1, tokens, a.heads, stages=1).solve(
        m1.q_ranges, m1.k_ranges, m1.types), 0), None))
    m8 = mask_of("causal_document", 8, tokens)
    r8 = session(8, 8 * tokens, a.heads, stages=2).solve(m8.q_ranges, m8.k_ranges, m8.types)
    tps = TorchPlan.all_ranks(r8)
    busiest = max(tps, key=lambda t: sum(len(x) for x in [t.fwd.stage0] + t.fwd.stages))
    cases.append((f"P = 8 rank {busiest.rank}, copy collectives", busiest, _CopyComm()))
    for name, tp, comm in cases:
        dp = tp.on(device)
        be = cpt._backends.make_backend(backend, device, dt, tp)
        q, k, v, do = inputs(tp.rows, a.heads, device, dt, 5)
        scale = 1.0 / tp.dqk ** 0.5

        def call(graphs):
            def run():
                if comm is None:  # the public call (its input checks included)
                    o = cpt.attention(q, k, v, tp, backend=be, graphs=graphs)
                else:
                    err = cpt.check_inputs(tp, q, k, v, tp.cp_size, tp.rank, None, None)
                    assert err is None, err
                    o, _ = _Attention.apply(q, k, v, dp, be, comm, scale, graphs)
                o.backward(do)
            return run
        eager = host_us(call(False), a.host_calls, device)
        graphs = host_us(call(True), a.host_calls, device)
        st = sorted({s for s, _ in _graphs.state(dp).values()})
        out(f"{name:34} {eager:9.1f} {graphs:9.1f} {'/'.join(st):>12}")
        for s, reason in _graphs.state(dp).values():
            if reason:
                out(f"    not captured: {reason}")


class _CopyComm:
    """Each collective one device copy of this rank's send rows into its receive rows (a capturable stand-in
    of NCCL's one launch per collective; the values are not a real exchange)."""
    group = None
    capturable = True

    class _W:
        def wait(self):
            return None

    def a2a(self, out_, inp, out_splits, in_splits):
        n = min(out_.shape[0], inp.shape[0])
        out_[:n].copy_(inp[:n])
        return self._W()


def default_hardware(device):
    """The bundled profile of this GPU: h200_8x_nvlink on an H200, else h100_8x_nvlink."""
    return "h200_8x_nvlink" if device.type == "cuda" and "H200" in torch.cuda.get_device_name(device) \
        else "h100_8x_nvlink"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768], help="tokens per rank (P = 1)")
    ap.add_argument("--masks", nargs="+", default=MASKS, choices=MASKS)
    ap.add_argument("--heads", type=int, nargs=3, default=[64, 8, 128], metavar=("Q", "KV", "D"))
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--torch-max", type=int, default=8192, help="the torch kernels only up to this many tokens")
    ap.add_argument("--flex", choices=["must", "all"], default="must",
                    help="FlexAttention direct only where the issue compares (causal_document at 16k), or all")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--loopback-tokens", type=int, nargs="*", default=[8192])
    ap.add_argument("--reps", type=int, default=3, help="timed calls of each rank alone")
    ap.add_argument("--triton-sweep", action="store_true", help="time other tile shapes of the DSA kernel")
    ap.add_argument("--host-tokens", type=int, default=1024)
    ap.add_argument("--host-calls", type=int, default=50)
    ap.add_argument("--sections", nargs="+", default=["p1", "loopback", "dsa", "host"],
                    choices=["p1", "loopback", "dsa", "host"])
    ap.add_argument("--hardware", default=None,
                    help="the profile whose kernel model predicts each time printed beside it (a bundled name or a "
                         "YAML path, e.g. a measured one: python -m cpsched.torch.calibrate); default: "
                         "h200_8x_nvlink or h100_8x_nvlink by the GPU's name")
    ap.add_argument("--out", default=None, help="also append everything printed to this file")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="every section at toy sizes on the CPU (the script's logic; no number means anything)")
    a = ap.parse_args(argv)
    out = Out(a.out)
    if a.cpu_smoke:
        device = torch.device("cpu")
        a.tokens, a.heads, a.iters, a.loopback_tokens, a.ranks = [256], [4, 2, 16], 1, [256], 4
        a.reps, a.host_tokens, a.host_calls, a.torch_max = 1, 64, 3, 1 << 30
        torch.set_num_threads(1)
        _graphs.RECORD_ON_CPU = True  # the graphs path through its CPU stand-in
    elif not torch.cuda.is_available():
        out("no CUDA device: skipped")
        return 77
    else:
        device = torch.device("cuda")
        out(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cpsched {cpsched.__version__}; "
            f"flash-attn {'yes' if flash_available() else 'no'}")
    a.hardware = a.hardware or default_hardware(device)
    t0 = time.perf_counter()
    rates = section_p1(a, out, device) if "p1" in a.sections else {}
    if "loopback" in a.sections:
        section_loopback(a, out, device, rates)
    if "dsa" in a.sections:
        section_dsa(a, out, device)
    if "host" in a.sections:
        section_host(a, out, device)
    out(f"\nbench_torch_cuda: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
