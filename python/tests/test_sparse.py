"""Token top-k masks through the Python Session (DSA's indexer output as an array): valid plans with
index args, the config's index masks, and bad input as a ValueError naming the first offending entry."""
import json

import numpy as np
import pytest

import cpsched

from conftest import ROOT


def causal_topk(S, heads, k, seed=0):
    rng = np.random.default_rng(seed)
    idx = np.full((S, heads, k), -1, dtype=np.int32)
    for q in range(S):
        for h in range(heads):
            n = min(k, q + 1)
            idx[q, h, :n] = np.sort(rng.choice(q + 1, size=n, replace=False))
    return idx


def session(**kw):
    return cpsched.Session(cp_size=4, heads=(8, 2, 16, "bf16"), solver="balanced_bytes", cost_model="area",
                           validate=True, **kw)


@pytest.mark.parametrize("heads", [1, 2])
def test_topk_plans_are_valid_index_args(heads):
    r = session().solve_topk(causal_topk(96, heads, 6))
    assert r.validate() == []
    plan = json.loads(r.to_json())
    assert plan["problem"]["index_mask"] == {"causal": True, "kind": "topk", "kv_heads": heads, "shape": [96, heads, 6]}
    args = [a for rank in plan["ranks"] for st in [rank["fwd"]["calc"]["local_attn_args"]] +
            rank["fwd"]["calc"]["remote_attn_args"] for a in st]
    assert args and all(a["index_width"] > 0 for a in args)


def test_int32_and_int64_indices_give_the_same_plan():
    idx = causal_topk(64, 1, 5, seed=3)
    a = json.loads(session().solve_topk(idx).to_json())
    b = json.loads(session().solve_topk(idx.astype(np.int64)).to_json())
    assert a["ranks"] == b["ranks"] and a["problem"] == b["problem"]


def test_bad_indices_name_the_first_offending_entry():
    idx = causal_topk(32, 1, 4)
    idx[7, 0, 2] = 9  # a key after query 7
    with pytest.raises(ValueError, match=r"indices\[7, 0, 2\] = 9"):
        session().solve_topk(idx)
    with pytest.raises(ValueError, match="expected shape"):
        session().solve_topk(idx[:, 0, :])
    with pytest.raises(ValueError, match="int32 or int64"):
        session().solve_topk(idx.astype(np.float32))


def test_the_dsa_config_solves_through_the_session():
    s = cpsched.Session.from_config(ROOT / "configs" / "dsa.yaml",
                                    {"problem.seqlen_per_rank": 256, "problem.mask.topk": 64,
                                     "problem.mask.sink": 4, "problem.mask.local": 16})
    r = s.solve_config()
    assert r.validate() == []
    assert json.loads(r.to_json())["problem"]["index_mask"]["kind"] == "topk"


def rank_sessions(P, S, **kw):
    return [cpsched.Session(cp_size=P, seqlen=S, heads=(8, 2, 16, "bf16"), solver="balanced_bytes",
                            cost_model="time", rank=r, **kw) for r in range(P)]


@pytest.mark.parametrize("P,heads", [(2, 1), (3, 2), (4, 1)])
def test_per_rank_summaries_plan_each_rank_as_the_whole_tensor_does(P, heads):
    import pickle
    S = 32 * P + 3
    idx = causal_topk(S, heads, 6, seed=P)
    whole = json.loads(cpsched.Session(cp_size=P, seqlen=S, heads=(8, 2, 16, "bf16"), solver="owner",
                                       cost_model="time").solve_topk(idx).to_json())
    ranges = cpsched._cpsched.sharding_ranges(S, P)
    sessions = rank_sessions(P, S)
    # what an all-gather would carry: pickled, a few hundred bytes each
    summaries = [pickle.loads(pickle.dumps(s.summarize_topk(idx[lo:hi]))) for s, (lo, hi) in zip(sessions, ranges)]
    assert all(isinstance(x, cpsched.TopkSummary) and x.rank == r and x.nbytes < 4096
               for r, x in enumerate(summaries))
    for r, (lo, hi) in enumerate(ranges):
        res = sessions[r].solve_topk_summaries(summaries, idx[lo:hi].astype(np.int64))
        mine = json.loads(res.to_json())
        assert res.solver == "owner" and mine["solver"]["name"] == "owner"
        assert [e["rank"] for e in mine["ranks"]] == [r]
        assert mine["ranks"][0] == whole["ranks"][r]
        assert mine["problem"]["index_summary"]["kv_heads"] == heads
        assert mine["metrics"] == whole["metrics"]


def test_per_rank_summaries_refuse_what_does_not_fit_by_name():
    P, S = 4, 64
    idx = causal_topk(S, 1, 4)
    sessions = rank_sessions(P, S)
    ranges = cpsched._cpsched.sharding_ranges(S, P)
    summaries = [s.summarize_topk(idx[lo:hi]) for s, (lo, hi) in zip(sessions, ranges)]
    lo, hi = ranges[1]
    no_rank = cpsched.Session(cp_size=P, seqlen=S, heads=(8, 2, 16, "bf16"))
    with pytest.raises(ValueError, match=r"need the Session's rank"):
        no_rank.summarize_topk(idx[lo:hi])
    with pytest.raises(ValueError, match=r"rank 1 hosts the 16 tokens \[16, 32\) of S = 64"):
        sessions[1].summarize_topk(idx[lo:hi + 1])
    bad = idx[lo:hi].copy()
    bad[3, 0, 0] = 60  # a key after query 19
    with pytest.raises(ValueError, match=r"indices\[3, 0, 0\] = 60 \(query token 19\) selects a key after query 19"):
        sessions[1].summarize_topk(bad)
    with pytest.raises(ValueError, match=r"summaries\[0\]: it is rank 2's summary"):
        sessions[1].solve_topk_summaries([summaries[2], summaries[1], summaries[0], summaries[3]], idx[lo:hi])
    with pytest.raises(ValueError, match=r"expected a list of the 4 ranks' TopkSummary"):
        sessions[1].solve_topk_summaries(summaries[:3], idx[lo:hi])
    with pytest.raises(ValueError, match=r"the summary is not of these rows"):
        other = idx[lo:hi].copy()
        other[-1, 0, :] = -1  # the last query selects nothing now
        sessions[1].solve_topk_summaries(summaries, other)


@pytest.mark.parametrize("P,heads,bpr", [(2, 1, 1), (3, 2, 1), (4, 1, 2)])
def test_row_runs_plan_the_summaries_plan_and_leave_the_index_rows_to_the_executor(P, heads, bpr):
    S = 32 * P + 3
    idx = causal_topk(S, heads, 6, seed=P + 7)
    ranges = cpsched._cpsched.sharding_ranges(S, P)
    sessions = rank_sessions(P, S, blocks_per_rank=bpr)
    runs = [s.summarize_topk_runs(idx[lo:hi]) for s, (lo, hi) in zip(sessions, ranges)]
    summaries = [s.summarize_topk(idx[lo:hi]) for s, (lo, hi) in zip(sessions, ranges)]
    for r in range(P):
        assert all(np.array_equal(a, b) for a, b in zip(runs[r].summary.arrays, summaries[r].arrays))
        assert len(runs[r].width) == len(runs[r].summary.arrays[2]) == len(runs[r].area)
    for r, (lo, hi) in enumerate(ranges):
        by_rows = json.loads(rank_sessions(P, S, blocks_per_rank=bpr)[r].solve_topk_summaries(summaries, idx[lo:hi])
                             .to_json())["ranks"][0]
        by_runs = json.loads(sessions[r].solve_topk_runs([x.summary for x in runs], runs[r]).to_json())["ranks"][0]
        for p in ("fwd", "bwd"):
            a, b = by_runs[p], by_rows[p]
            assert "indices" not in a["calc"]
            assert a["calc"]["deferred_index_entries"] == len(b["calc"]["indices"])
            strip = lambda lst: [{k: v for k, v in x.items() if k != "k"} for x in lst]  # noqa: E731
            assert strip(a["calc"]["local_attn_args"]) == strip(b["calc"]["local_attn_args"])
            assert [strip(x) for x in a["calc"]["remote_attn_args"]] == [strip(x) for x in b["calc"]["remote_attn_args"]]
            assert a["comm"]["stages"] == b["comm"]["stages"]
            kv = sum(st["num_remote_kv_tokens"] for st in a["comm"]["stages"])
            assert sum(e - b_ for b_, e, _, _ in a["comm"].get("remote_kv_rows", [])) == kv


def test_row_runs_that_do_not_fit_are_refused_by_name():
    P, S = 4, 64
    idx = causal_topk(S, 1, 4)
    sessions = rank_sessions(P, S)
    ranges = cpsched._cpsched.sharding_ranges(S, P)
    runs = [s.summarize_topk_runs(idx[lo:hi]) for s, (lo, hi) in zip(sessions, ranges)]
    summaries = [x.summary for x in runs]
    with pytest.raises(ValueError, match=r"runs: expected a TopkRowRuns"):
        sessions[1].solve_topk_runs(summaries, summaries[1])
    with pytest.raises(ValueError, match=r"row runs: .* the summary is not of these rows"):
        sessions[1].solve_topk_runs(summaries, runs[2])
    bad = cpsched.TopkRowRuns(runs[1].summary, runs[1].width[:-1], runs[1].area[:-1], 1)
    with pytest.raises(ValueError, match=r"widths and .* areas for the .* runs"):
        sessions[1].solve_topk_runs(summaries, bad)


def test_index_rows_come_as_arrays_and_the_json_can_leave_them_and_the_tasks_out():
    r = session().solve_topk(causal_topk(96, 2, 6))
    full = json.loads(r.to_json())
    lean = json.loads(r.to_json(tasks=False, index_rows=False))
    assert "tasks" in full and "tasks" not in lean
    for rank in range(4):
        for p in ("fwd", "bwd"):
            pool = r.index_rows(rank, p)
            assert pool.dtype == np.int32 and pool.tolist() == full["ranks"][rank][p]["calc"]["indices"]
            assert "indices" not in lean["ranks"][rank][p]["calc"]
            calc = {k: v for k, v in full["ranks"][rank][p]["calc"].items() if k != "indices"}
            assert lean["ranks"][rank][p]["calc"] == calc
    with pytest.raises(ValueError, match="index_rows"):
        r.to_json(index_rows="no")
