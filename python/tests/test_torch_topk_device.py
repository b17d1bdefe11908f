"""Top-k masks counted and written on the rows' device (cpsched.torch.summarize_topk / write_index_rows): the
summary and row runs equal the host's, and the index rows written from the rank's rows equal the pool the C++
builder writes from them. One process, every rank in a loop (the torch ops run on the CPU here)."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cpsched  # noqa: E402
import cpsched.torch as cpt  # noqa: E402


def dsa_like(S, heads, k, seed):
    """Sinks, a local window and random earlier keys per query, unsorted, -1 padded."""
    rng = np.random.default_rng(seed)
    idx = np.full((S, heads, k), -1, dtype=np.int32)
    for q in range(S):
        for h in range(heads):
            keys = set(range(min(2, q + 1))) | set(range(max(0, q - 3), q + 1))
            extra = rng.choice(q + 1, size=min(q + 1, k), replace=False)
            for x in extra:
                if len(keys) >= k:
                    break
                keys.add(int(x))
            keys = list(keys)
            rng.shuffle(keys)
            keys = keys[:k]
            idx[q, h, :len(keys)] = keys
    return idx


def sessions(P, S, bpr, stages):
    return [cpsched.Session(cp_size=P, seqlen=S, heads=(8, 2, 16, "bf16"), solver="balanced_bytes",
                            cost_model="time", rank=r, blocks_per_rank=bpr, stages=stages) for r in range(P)]


@pytest.mark.parametrize("P,heads,bpr,stages", [(2, 1, 1, 1), (3, 2, 1, "auto"), (4, 1, 2, 2), (8, 2, 2, "auto")])
def test_device_summary_and_index_rows_equal_the_hosts(P, heads, bpr, stages):
    S = 40 * P + 5
    idx = dsa_like(S, heads, 9, seed=P * 10 + heads)
    ranges = cpsched._cpsched.sharding_ranges(S, P)
    ss = sessions(P, S, bpr, stages)
    dev = [cpt.summarize_topk(torch.from_numpy(idx[lo:hi]), s) for s, (lo, hi) in zip(ss, ranges)]
    host = [s.summarize_topk_runs(idx[lo:hi]) for s, (lo, hi) in zip(ss, ranges)]
    for (runs, _), h in zip(dev, host):
        assert len(runs.summary.arrays) == 5
        for a, b in zip(runs.summary.arrays, h.summary.arrays):
            assert a.dtype == np.int64 and np.array_equal(a, b), (a, b)
        assert np.array_equal(runs.width, h.width) and np.array_equal(runs.area, h.area)
    summaries = [r.summary for r, _ in dev]
    for r, (lo, hi) in enumerate(ranges):
        by_rows = json.loads(sessions(P, S, bpr, stages)[r].solve_topk_summaries(summaries, idx[lo:hi]).to_json())
        tp = cpt.TorchPlan(ss[r].solve_topk_runs(summaries, dev[r][0]), r)
        assert tp.deferred
        fwd, bwd = cpt.write_index_rows(tp, dev[r][1])
        for pool, p in ((fwd, "fwd"), (bwd, "bwd")):
            assert pool.tolist() == by_rows["ranks"][0][p]["calc"]["indices"]


def test_a_plan_whose_rows_were_not_written_refuses_to_run():
    P, S = 2, 64
    idx = dsa_like(S, 1, 5, seed=1)
    ranges = cpsched._cpsched.sharding_ranges(S, P)
    ss = sessions(P, S, 1, 1)
    runs = [s.summarize_topk_runs(idx[lo:hi]) for s, (lo, hi) in zip(ss, ranges)]
    tp = cpt.TorchPlan(ss[0].solve_topk_runs([x.summary for x in runs], runs[0]), 0)
    assert "none were written on cpu" in tp.index_rows_missing(torch.device("cpu"))


def test_invalid_rows_get_the_hosts_error_from_the_device_summary():
    P, S = 2, 64
    idx = dsa_like(S, 1, 5, seed=2)
    lo, hi = cpsched._cpsched.sharding_ranges(S, P)[1]
    mine = torch.from_numpy(idx[lo:hi].copy())
    mine[3, 0, 1] = int(mine[3, 0, 0]) if int(mine[3, 0, 0]) >= 0 else 0  # a key twice in one row
    mine[3, 0, 0] = mine[3, 0, 1]
    with pytest.raises(ValueError, match=r"selects key \d+ twice in row \[3, 0\]"):
        cpt.summarize_topk(mine, sessions(P, S, 1, 1)[1])
    mine = torch.from_numpy(idx[lo:hi].copy())
    mine[5, 0, 0] = lo + 8  # after its query, lo + 5
    with pytest.raises(ValueError, match=r"\(query token 37\) selects a key after query 37"):
        cpt.summarize_topk(mine, sessions(P, S, 1, 1)[1])


def test_rows_other_than_the_plans_are_refused_when_written():
    P, S = 2, 64
    idx = dsa_like(S, 1, 5, seed=3)
    ranges = cpsched._cpsched.sharding_ranges(S, P)
    ss = sessions(P, S, 1, 1)
    dev = [cpt.summarize_topk(torch.from_numpy(idx[lo:hi]), s) for s, (lo, hi) in zip(ss, ranges)]
    tp = cpt.TorchPlan(ss[1].solve_topk_runs([r.summary for r, _ in dev], dev[1][0]), 1)
    lo, hi = ranges[1]
    mine = idx[lo:hi].copy()
    unused = sorted(set(range(int(ranges[0][1]))) - set(mine[mine >= 0].tolist()))[0]  # rank 0 sends it no row
    mine[0, 0, 0] = unused  # a key of rank 0's block that the plan received no row for
    _, xs = cpt.summarize_topk(torch.from_numpy(mine), ss[1])
    with pytest.raises(ValueError, match="rows other than those it was made from"):
        cpt.write_index_rows(tp, xs)
