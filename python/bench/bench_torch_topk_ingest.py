"""What one rank spends to plan a layer's token top-k mask from its own index rows in cpsched.torch
(ingest_topk with per-rank summaries), host side and per rank, the two ways it can go:

  plan    the rows are copied to the host, which summarises them and writes the plan's index pool
          (Session.summarize_topk + solve_topk_summaries + TorchPlan of the plan with its pool);
  device  the rows stay where they are: their summary and row runs are counted with torch ops there
          (cpsched.torch.summarize_topk), the host plans from the summaries alone (Session.solve_topk_runs
          + TorchPlan) and the index rows are written there (cpsched.torch.write_index_rows).

    python python/bench/bench_torch_topk_ingest.py [--seqlen 32768] [--cp 8] [--topk 2048] [--repeats 5]
                                                   [--threads 1]

The rows are synthetic DSA-like selections over one causal sequence (64 sink keys, a local window of 512
and evenly spread keys with jitter between, --topk per query; MLA 128:1). On this CPU-only machine the
"device" is the CPU: its torch ops run here too, so the column is an upper bound of a GPU's host time.
The summaries of the other ranks are made once beforehand (in a run each rank makes its own at once).
Prints per rank the median of each phase and the slowest rank.
"""
import argparse
import statistics
import time

import numpy as np
import torch

import cpsched
import cpsched.torch as cpt


def dsa_rows(S, k, lo, hi, seed):
    """int32 [hi - lo, 1, k]: the rows of queries [lo, hi), -1 padded."""
    rng = np.random.default_rng(seed + lo)
    q = np.arange(lo, hi, dtype=np.int64)[:, None]
    out = np.full((hi - lo, k), -1, dtype=np.int64)
    j = np.arange(k)[None, :]
    short = q[:, 0] < k  # a query with fewer than k earlier keys takes them all
    out[short] = np.where(j <= q[short], j, -1)
    long_ = ~short
    ql = q[long_]
    sink, local = min(64, k // 8), min(512, k // 4)
    spread = k - sink - local
    width = (ql - sink - local) / spread
    # stratum j is [floor(j w), floor((j + 1) w)) with w >= 1: one key from each, all distinct
    edges = np.floor(np.arange(spread + 1)[None, :] * width).astype(np.int64)
    size = edges[:, 1:] - edges[:, :-1]
    mid = sink + edges[:, :-1] + np.floor(rng.random((len(ql), spread)) * size).astype(np.int64)
    out[long_] = np.concatenate([np.broadcast_to(np.arange(sink), (len(ql), sink)), mid,
                                 ql - local + 1 + np.arange(local)[None, :]], 1)
    perm = rng.permuted(out, axis=1)  # an indexer's output is not sorted
    return perm.astype(np.int32)[:, None, :]


def session(S, P, rank):
    return cpsched.Session(cp_size=P, seqlen=S, heads={"q": 128, "kv": 1, "dim_qk": 576, "dim_v": 512,
                                                       "kv_shared": True, "dtype": "bf16"},
                           solver="balanced_bytes", cost_model="time", stages="auto", rank=rank)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--cp", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch's CPU threads (1: no spinning on a busy machine)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    S, P = a.seqlen, a.cp
    ranges = [(int(b), int(e)) for b, e in cpsched._cpsched.sharding_ranges(S, P)]
    rows = [dsa_rows(S, a.topk, lo, hi, 7) for lo, hi in ranges]
    sessions = [session(S, P, r) for r in range(P)]
    summaries = [s.summarize_topk(x) for s, x in zip(sessions, rows)]
    print(f"S = {S}, P = {P}, top-{a.topk}, MLA 128:1; {torch.get_num_threads()} torch threads; median of "
          f"{a.repeats} per rank, ms")
    print(f"{'rank':>4} | {'plan: copy+summarise':>20} {'solve+pool':>10} {'TorchPlan':>9} {'total':>8} | "
          f"{'device: summarise':>17} {'solve':>7} {'TorchPlan':>9} {'write rows':>10} {'total':>8}")
    worst = [0.0, 0.0]
    for r, (lo, hi) in enumerate(ranges):
        mine = torch.from_numpy(rows[r])
        t = {k: [] for k in ("hs", "hp", "ht", "ds", "dp", "dt", "dw")}
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            host_rows = mine.cpu().contiguous().numpy()
            s = sessions[r].summarize_topk(host_rows)
            t1 = time.perf_counter()
            res = sessions[r].solve_topk_summaries(summaries[:r] + [s] + summaries[r + 1:], host_rows)
            t2 = time.perf_counter()
            tp = cpt.TorchPlan(res, r)
            t3 = time.perf_counter()
            t["hs"].append(t1 - t0), t["hp"].append(t2 - t1), t["ht"].append(t3 - t2)
            del tp, res
            t0 = time.perf_counter()
            runs, xs = cpt.summarize_topk(mine, sessions[r])
            t1 = time.perf_counter()
            res = sessions[r].solve_topk_runs(summaries[:r] + [runs.summary] + summaries[r + 1:], runs)
            t2 = time.perf_counter()
            tp = cpt.TorchPlan(res, r)
            t3 = time.perf_counter()
            pools = cpt.write_index_rows(tp, xs)
            t4 = time.perf_counter()
            t["ds"].append(t1 - t0), t["dp"].append(t2 - t1), t["dt"].append(t3 - t2), t["dw"].append(t4 - t3)
            del tp, res, pools
        m = {k: 1e3 * statistics.median(v) for k, v in t.items()}
        host = m["hs"] + m["hp"] + m["ht"]
        dev = m["ds"] + m["dp"] + m["dt"] + m["dw"]
        worst = [max(worst[0], host), max(worst[1], dev)]
        print(f"{r:>4} | {m['hs']:>20.1f} {m['hp']:>10.1f} {m['ht']:>9.1f} {host:>8.1f} | {m['ds']:>17.1f} "
              f"{m['dp']:>7.1f} {m['dt']:>9.1f} {m['dw']:>10.1f} {dev:>8.1f}")
    print(f"slowest rank: plan {worst[0]:.1f} ms, device {worst[1]:.1f} ms")


if __name__ == "__main__":
    main()
