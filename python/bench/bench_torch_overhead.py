"""Host-side time of one cpsched.torch attention call (forward + backward) from a cached plan, kernels
excluded: building the send buffers from the plan's precomputed split lists and row indices, the views of the
receive buffers, the collective launches and the lse merges, with collectives that return at once.

    python python/bench/bench_torch_overhead.py            # P = 8 and 64

Workload: causal_document packs of the bundled histogram, balanced_bytes under the area cost model, stages 1
and 2 (and relays at P = 64 in nodes of 8); per P the rank with the most args is timed, median of --calls
calls. Tensors are on the CPU and small (--tokens per rank, default 64; --heads q kv dim; bf16) so that the
ops' own work is a small part of each op: what remains is the host's dispatch, the same work a GPU launch
costs the host. (At 512 tokens per rank and P = 64 the busiest rank receives about 10k rows per pass and the
CPU's copies and index_adds of them dominate: that is device work on a GPU.) The table also gives the aten ops
one call dispatches, the time of one small op on this machine now, and the floor any torch.autograd.Function
pays here: a Function with the same inputs and outputs that computes nothing, forward + backward.

Backends: `none` is the executor alone (stage kernels skipped); `flash` is the flash backend's host side (its
varlen batches, cu_seqlens cached on the plan, gathers and merges) with the two flash-attn kernels replaced by
functions returning empty tensors. The `torch` reference backend issues about 20 ops per arg; its host
cost grows with the args and is reported per arg.
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
from cpsched.torch._api import _Attention
from cpsched.torch._plan import TorchPlan

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class _Done:
    def wait(self):
        return None


class FakeComm:
    """Collectives that return at once (the receive buffers keep whatever they held)."""

    def __init__(self):
        self.calls = 0

    def a2a(self, out, inp, out_splits, in_splits):
        self.calls += 1
        return _Done()


def _meta_flash(q, k, v, cu_q, cu_k, mq, mk, scale, causal, window=None):
    return q.new_empty(q.shape[0], q.shape[1], v.shape[-1]), q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32)


def _meta_flash_bwd(do, q, k, v, o, lse, dq, dk, dv, cu_q, cu_k, mq, mk, scale, causal, window=None):
    return None


def _inputs(tp, device):
    L = tp.rows
    dt = torch.bfloat16
    q = torch.zeros(L, tp.hq, tp.dqk, dtype=dt, device=device, requires_grad=True)
    k = torch.zeros(L, tp.hkv, tp.dqk, dtype=dt, device=device, requires_grad=True)
    v = torch.zeros(L, tp.hkv, tp.dv, dtype=dt, device=device, requires_grad=True)
    do = torch.zeros(L, tp.hq, tp.dv, dtype=dt, device=device)
    return q, k, v, do


def _calls(tp, backend, n, inputs, comm, device="cpu"):
    """Host time of each of n calls: the checks, forward and backward (grads accumulate into q, k, v)."""
    dp = tp.on(device)
    q, k, v, do = inputs
    scale = 1.0 / tp.dqk ** 0.5
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        err = cpt.check_inputs(tp, q, k, v, tp.cp_size, tp.rank, None, None)
        assert err is None, err
        out, _ = _Attention.apply(q, k, v, dp, backend, comm, scale)
        out.backward(do)
        times.append(time.perf_counter() - t0)
    return times


def time_calls(tp, backend, n, warm=20, device="cpu"):
    comm = FakeComm()
    times = _calls(tp, backend, warm + n, _inputs(tp, device), comm, device)[warm:]
    return statistics.median(times) * 1e6, comm.calls // (warm + n)


def count_ops(tp, backend):
    """aten ops one call (forward + backward, the gradients' accumulation included) dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))
    inputs, comm = _inputs(tp, "cpu"), FakeComm()
    _calls(tp, backend, 2, inputs, comm)  # first-call set-up, and grads that exist (accumulated as every later call)
    with Count():
        _calls(tp, backend, 1, inputs, comm)
    return Count.n


def op_baseline():
    """Median host time of one small aten op (index_select of 32 rows) on this machine now, in us."""
    x = torch.zeros(64, 64)
    idx = torch.arange(32)
    ts = []
    for _ in range(2000):
        t0 = time.perf_counter()
        x.index_select(0, idx)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


class _Empty(torch.autograd.Function):
    """The call's autograd frame alone: same inputs, outputs and saved tensors, no work."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        lse = q.new_empty(q.shape[:2], dtype=torch.float32)
        ctx.mark_non_differentiable(lse)
        return torch.empty_like(q), lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def autograd_floor(L, heads, n=1000):
    """Median us of forward + backward of _Empty on this rank's shapes."""
    hq, hkv, d = heads
    q = torch.zeros(L, hq, d, dtype=torch.bfloat16, requires_grad=True)
    k = torch.zeros(L, hkv, d, dtype=torch.bfloat16, requires_grad=True)
    v = torch.zeros(L, hkv, d, dtype=torch.bfloat16, requires_grad=True)
    do = torch.zeros(L, hq, d, dtype=torch.bfloat16)
    ts = []
    for i in range(n + 50):
        t0 = time.perf_counter()
        out, _ = _Empty.apply(q, k, v)
        out.backward(do)
        if i >= 50:
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="*", default=[8, 64])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per rank")
    ap.add_argument("--heads", type=int, nargs=3, default=[8, 8, 16], help="q, kv, dim")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = os.path.join(ROOT, "configs", "quickstart.yaml")
    print(f"one small aten op (index_select) takes {op_baseline():.1f} us here now, an autograd.Function that "
          f"computes nothing {autograd_floor(args.tokens, args.heads):.0f} us (forward + backward); "
          f"tokens per rank {args.tokens}, heads {args.heads}")
    print(f"{'P':>3} {'stages':>6} {'relay':>5} {'rank':>4} {'args':>5} {'a2a':>4} {'none us':>8} {'ops':>4} "
          f"{'flash us':>8} {'ops':>4}  {'torch us/arg':>12}")
    for P in args.ranks:
        m = cpsched.mask_from_config(cfg, {"problem.cp_size": P, "problem.seqlen_per_rank": args.tokens})
        for stages, relay in ((1, 0), (2, 0)) + (((2, 8),) if P >= 16 else ()):
            s = cpsched.Session(cp_size=P, seqlen=m.seqlen, heads=tuple(args.heads) + ("bf16",), solver="balanced_bytes",
                                cost_model="area", stages=stages, relay_node_size=relay)
            r = s.solve(m.q_ranges, m.k_ranges, m.types)
            tps = TorchPlan.all_ranks(r)

            def weight(tp):
                return sum(len(a) for a in [tp.fwd.stage0] + tp.fwd.stages + [tp.bwd.stage0] + tp.bwd.stages)
            busiest = sorted(tps, key=weight)[-1]
            for tp in (busiest,):
                none_us, calls = time_calls(tp, cpt.NullBackend(), args.calls)
                flash_us, _ = time_calls(tp, cpt.FlashBackend(kernel=_meta_flash, bwd_kernel=_meta_flash_bwd),
                                         args.calls)
                n_args = weight(tp)
                # the torch reference backend: its host cost per arg (on these small tensors)
                torch_us, _ = time_calls(tp, cpt.TorchBackend(), max(10, args.calls // 10), warm=3)
                n_none = count_ops(tp, cpt.NullBackend())
                n_flash = count_ops(tp, cpt.FlashBackend(kernel=_meta_flash, bwd_kernel=_meta_flash_bwd))
                print(f"{P:>3} {stages:>6} {relay:>5} {tp.rank:>4} {n_args:>5} {calls:>4} {none_us:>8.1f} {n_none:>4} "
                      f"{flash_us:>8.1f} {n_flash:>4}  {(torch_us - none_us) / max(1, n_args):>12.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
