"""Plan step t + 1's mask while step t runs: the data-loader pattern of Session.solve_async.

    pip install .                       # from the repository root
    python examples/python/plan_ahead.py [--steps 8] [--cp 8] [--step-ms 200]

The data loader knows each step's packing before the step, so its mask can be planned ahead, off the
critical path, with the layout planned (the solver may re-lay out the tokens; the loader then dispatches
the step's tokens as the plan's host_ranges say) and uses="ahead" (the default solver takes its time).
Each step asks for its plan with solve(): the plan made ahead is in the cache, so the call costs a
cache hit. The step itself is a stand-in here (time.sleep of --step-ms); in training it is the
forward and backward of the model, which the Session's background thread runs beside.
"""
import argparse
import time

import numpy as np

import cpsched


def packed_mask(step, seqlen, rng_seed=7):
    """A causal document mask of random document lengths, different every step."""
    rng = np.random.default_rng(rng_seed + step)
    lengths = []
    while sum(lengths) < seqlen:
        lengths.append(int(min(rng.integers(512, 16384), seqlen - sum(lengths))))
    ends = np.cumsum(lengths)
    ranges = np.stack([ends - np.array(lengths), ends], axis=1)
    return ranges, ranges, np.full(len(lengths), 1, dtype=np.int32), len(lengths)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--cp", type=int, default=8)
    ap.add_argument("--step-ms", type=float, default=200.0, help="the stand-in step's duration")
    args = ap.parse_args()
    seqlen = args.cp * 8192
    session = cpsched.Session(cp_size=args.cp, seqlen=seqlen, heads=(64, 8, 128, "bf16"), solver="balanced_bytes",
                              cost_model="time", stages="auto", layout="planned", uses="ahead")
    masks = [packed_mask(t, seqlen) for t in range(args.steps)]
    ahead = session.solve_async(*masks[0][:3])  # before the loop: step 0's plan
    hits = []
    print(f"P = {args.cp}, S = {seqlen}, {args.steps} steps of {args.step_ms:.0f} ms (stand-in)")
    print(f"{'step':>4} {'docs':>5} {'ready':>6} {'solve() us':>11} {'C++ us':>7} {'cached':>7} {'solve ms':>9} "
          f"{'host ranges r0':>15}")
    for t in range(args.steps):
        was_ready = ahead.done()
        ahead.result()  # waits only when planning is slower than a step
        t0 = time.perf_counter()
        plan = session.solve(*masks[t][:3])  # step t's plan: made ahead, now a cache hit
        us = 1e6 * (time.perf_counter() - t0)
        hits.append(us)
        if t + 1 < args.steps:
            ahead = session.solve_async(*masks[t + 1][:3])  # plan step t + 1 while step t runs
        print(f"{t:>4} {masks[t][3]:>5} {str(was_ready):>6} {us:>11.1f} {1e3 * plan.call_ms:>7.1f} {str(plan.cached):>7} "
              f"{plan.solve_ms:>9.1f} {len(plan.host_ranges[0]):>15}")
        time.sleep(args.step_ms / 1e3)  # stand-in: step t's forward and backward
    print(f"median solve() from a plan made ahead: {sorted(hits)[len(hits) // 2]:.1f} us "
          f"(cache hits: {session.cache_stats['hits']}); 'C++ us' is the look-up itself")


if __name__ == "__main__":
    main()
