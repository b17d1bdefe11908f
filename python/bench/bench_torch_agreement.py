"""What the agreement (check_peers, docs/torch.md "Errors") costs per cpsched.torch.attention call on gloo.

    python python/bench/bench_torch_agreement.py                 # P = 2 and 4, 64 tokens per rank

P processes on this machine's CPU join a gloo group; every rank makes the same calls of one cached plan
(a causal mask over S = P x --tokens, balanced_bytes, stages 2, heads 8:8 d 16 fp32: every rank casts and
reduces) with the kernels
skipped (backend "none": the plan's collectives and the executor run, the attention math does not), forward
only under no_grad, so that what differs between the two modes is the agreement alone. The calls alternate one
by one between check_peers=False and True (--calls of each); per mode the median, in us, and the exchange alone
(the agreement's all_gather of the claims and their comparison) and a bare gloo all_gather of the claim's size,
measured between them.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, P, port, args, out):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    import cpsched
    import cpsched.torch as cpt
    from cpsched.torch._agree import Claim, exchange
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P)
    S = P * args.tokens
    s = cpsched.Session(cp_size=P, seqlen=S, heads=(8, 8, 16, "fp32"), stages=2)
    tp = cpt.prepare(s.solve([[0, S]], [[0, S]], ["causal"]), rank)
    L = tp.rows
    q, k, v = (torch.randn(L, 8, 16) for _ in range(3))

    def one(check):
        t0 = time.perf_counter()
        cpt.attention(q, k, v, tp, backend="none", check_peers=check)
        return time.perf_counter() - t0

    def exchange_once():
        t0 = time.perf_counter()
        c = Claim("attention").plan(tp)
        c.add("dtype", 0, "dtype")
        exchange(c, None, dist.group.WORLD, rank, P, "cpu")
        return time.perf_counter() - t0

    vec = torch.zeros(3 + 24 + 4 + 2 * P, dtype=torch.int64)  # the claim's size (_agree.Claim.vector)
    parts = [torch.empty_like(vec) for _ in range(P)]

    def gather_once():
        t0 = time.perf_counter()
        dist.all_gather(parts, vec)
        return time.perf_counter() - t0

    with torch.no_grad():
        for check in (False, True):  # warm: the plan's program laid out
            for _ in range(10):
                one(check)
        res = {"off": [], "on": [], "exchange": [], "gather": []}
        for _ in range(args.calls):  # call by call alternating, so that the machine's load drifts over both alike
            res["off"].append(one(False))
            res["on"].append(one(True))
            res["exchange"].append(exchange_once())
            res["gather"].append(gather_once())
        res = {k: statistics.median(v) * 1e6 for k, v in res.items()}
    if rank == 0:
        out.put(res)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--tokens", type=int, default=64, help="tokens per rank")
    ap.add_argument("--calls", type=int, default=500, help="calls per mode, alternating one by one")
    args = ap.parse_args()
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    print(f"{'P':>3} {'check_peers=False us':>21} {'True us':>8} {'difference us':>14} {'exchange alone us':>18} "
          f"{'all_gather alone us':>20}")
    for P in args.ranks:
        q = ctx.Queue()
        port = _port()
        procs = [ctx.Process(target=_worker, args=(r, P, port, args, q)) for r in range(P)]
        for p in procs:
            p.start()
        res = q.get(timeout=1800)
        for p in procs:
            p.join(timeout=60)
        print(f"{P:>3} {res['off']:>21.1f} {res['on']:>8.1f} {res['on'] - res['off']:>14.1f} {res['exchange']:>18.1f} "
              f"{res['gather']:>20.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
