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
    with pytest.raises(ValueError, match=r"runs: they are rank 2's, this Session is rank 1's"):
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


# ---- summaries from other ranks are input like any other (docs/hardening.md, "Third round") ---------------

def _three_ranks():
    P, S = 3, 96
    idx = causal_topk(S, 1, 8, seed=11)
    sessions = [cpsched.Session(cp_size=P, seqlen=S, heads=(4, 1, 16, "fp32"), rank=r) for r in range(P)]
    ranges = [tuple(int(x) for x in r) for r in cpsched._cpsched.sharding_ranges(S, P)]
    summaries = [s.summarize_topk(idx[lo:hi]) for s, (lo, hi) in zip(sessions, ranges)]
    return sessions, ranges, idx, summaries


def _with(summary, field, f):
    arrays = [a.copy() for a in summary.arrays]
    i = ("cells", "row_offsets", "rows", "col_offsets", "cols").index(field)
    arrays[i] = f(arrays[i])
    return cpsched.TopkSummary(summary.rank, tuple(arrays), seqlen=summary.seqlen, kv_heads=summary.kv_heads,
                               causal=summary.causal)


def _set(i, j, v):
    def f(a):
        a[i, j] = v
        return a
    return f


# (field, mutation, what the error says): each a summary that no rows of rank 1 could give
LIES = [
    ("cells", _set(0, 3, -5), r"cell 0 \(head 0, qblock 1, kblock 0\): area -5 is outside \["),
    ("cells", _set(0, 3, 0), r"cell 0 \(head 0, qblock 1, kblock 0\): area 0 is outside \["),
    ("cells", _set(0, 3, 1 << 62), r"area 4611686018427387904 is outside \[\d+, \d+\]"),
    ("cells", _set(0, 3, 100000), r"area 100000 is outside \[\d+, \d+\], the pairs its \d+ rows and \d+ keys"),
    ("cells", _set(0, 1, 0), r"qblock 0 is not one of the rank's query blocks \(its queries are \[32, 64\)\)"),
    ("cells", _set(0, 2, 2), r"keys \[\d+, \d+\) reach outside its key block \[64, 96\)"),
    ("cells", _set(0, 0, 5), r"head 5 is outside the 1 selection heads"),
    ("cells", _set(0, 0, -1), r"head -1 is outside the 1 selection heads"),
    ("rows", lambda r: r + 40, r"rows \[\d+, \d+\) reach outside its query block \[32, 64\)"),
    ("rows", lambda r: r - 100, r"rows \[-\d+, -\d+\) reach outside its query block \[32, 64\)"),
    ("rows", lambda r: r[:, ::-1].copy(), r"rows\[0\] = \[\d+, \d+\) of cell 0 is empty"),
    ("cols", lambda c: c + 1000, r"keys \[\d+, \d+\) reach outside its key block"),
    ("cols", lambda c: c - 1000, r"keys \[-\d+, -?\d+\) reach outside its key block"),
    ("cols", lambda c: np.stack([c[:, 0], c[:, 0]], 1), r"cols\[0\] = \[0, 0\) of cell 0 is empty"),
    ("row_offsets", lambda o: o[::-1].copy(), r"row offsets run from \d+ to 0, not from 0 to its \d+ ranges"),
    ("row_offsets", lambda o: o + 1000, r"row offsets run from 1000"),
]


@pytest.mark.parametrize("field,lie,says", LIES)
def test_a_gathered_summary_that_no_rows_could_give_is_refused_alike_by_every_rank(field, lie, says):
    sessions, ranges, idx, summaries = _three_ranks()
    gathered = list(summaries)
    gathered[1] = _with(summaries[1], field, lie)
    errors = []
    for r, (lo, hi) in enumerate(ranges):
        with pytest.raises(ValueError, match=r"summaries\[1\] \(rank 1's top-k summary\): " + f"(.*{says})") as e:
            sessions[r].solve_topk_summaries(gathered, idx[lo:hi])
        errors.append(str(e.value))
        runs = sessions[r].summarize_topk_runs(idx[lo:hi])
        with pytest.raises(ValueError) as e2:
            sessions[r].solve_topk_runs(gathered, runs)
        assert str(e2.value) == errors[0]
    assert errors == [errors[0]] * 3  # every rank stops at the same summary, with the same words


def test_duplicated_cells_and_summaries_of_another_grid_are_refused_by_name():
    sessions, ranges, idx, summaries = _three_ranks()
    lo, hi = ranges[0]
    c, ro, rows, co, cols = summaries[1].arrays
    dup = cpsched.TopkSummary(1, (np.concatenate([c, c[-1:]]), np.concatenate([ro, [ro[-1] + ro[-1] - ro[-2]]]),
                                  np.concatenate([rows, rows[ro[-2]:ro[-1]]]),
                                  np.concatenate([co, [co[-1] + co[-1] - co[-2]]]),
                                  np.concatenate([cols, cols[co[-2]:co[-1]]])))
    with pytest.raises(ValueError, match=r"summaries\[1\] .*: cell \d+ .*repeats cell \d+"):
        sessions[0].solve_topk_summaries([summaries[0], dup, summaries[2]], idx[lo:hi])
    # made for another S: said by the summary itself
    other_S = cpsched.Session(cp_size=3, seqlen=192, heads=(4, 1, 16, "fp32"), rank=1).summarize_topk(
        causal_topk(192, 1, 8)[64:128])
    with pytest.raises(ValueError, match=r"summaries\[1\] \(rank 1's top-k summary\): made with seqlen = 192, "
                                         r"summaries\[0\] \(rank 0's\) with seqlen = 96"):
        sessions[0].solve_topk_summaries([summaries[0], other_S, summaries[2]], idx[lo:hi])
    # ... and without saying so (a summary from an older pickle): its cells do not fit this grid
    bare = cpsched.TopkSummary(1, other_S.arrays)
    with pytest.raises(ValueError, match=r"summaries\[1\] \(rank 1's top-k summary\): cell 0 .*reach outside its"):
        sessions[0].solve_topk_summaries([summaries[0], bare, summaries[2]], idx[lo:hi])
    # another blocks_per_rank
    bpr2 = cpsched.Session(cp_size=3, seqlen=96, heads=(4, 1, 16, "fp32"), rank=1, blocks_per_rank=2).summarize_topk(
        idx[32:64])
    with pytest.raises(ValueError, match=r"summaries\[1\] \(rank 1's top-k summary\): cell 0 \(head 0, qblock 2, "
                                         r"kblock 0\): qblock 2 is not one of the rank's query blocks"):
        sessions[0].solve_topk_summaries([summaries[0], bpr2, summaries[2]], idx[lo:hi])
    # made for other selection heads or causality than the others'
    two = cpsched.TopkSummary(1, summaries[1].arrays, seqlen=96, kv_heads=2, causal=True)
    with pytest.raises(ValueError, match=r"summaries\[1\] .*made with kv_heads = 2, summaries\[0\] .* kv_heads = 1"):
        sessions[0].solve_topk_summaries([summaries[0], two, summaries[2]], idx[lo:hi])
    with pytest.raises(ValueError, match=r"made with causal = True \(summaries\[0\]\), but this call's causal is False"):
        sessions[0].solve_topk_summaries(summaries, idx[lo:hi], causal=False)


@pytest.mark.parametrize("arrays,says", [
    (lambda a: (a[0].astype(np.float64),) + a[1:], r"cells: expected an integer array, got dtype float64"),
    (lambda a: (a[0].astype(bool),) + a[1:], r"cells: expected an integer array, got dtype bool"),
    (lambda a: (a[0].ravel(),) + a[1:], r"cells: expected shape \[n, 4\], got shape \(\d+,\)"),
    (lambda a: (None,) * 5, r"cells: None; expected an integer array of shape \[n, 4\]"),
    (lambda a: a[:4], r"expected the 5 arrays of Session.summarize_topk"),
    (lambda a: a[0], r"expected the tuple of 5 arrays"),
    (lambda a: a[:1] + (a[1][:-1],) + a[2:], r"row_offsets: \d+ entries for \d+ cells"),
    (lambda a: a[:2] + (a[2].astype(np.uint64) + np.uint64(1 << 63),) + a[3:], r"rows: value \d+ is outside int64"),
])
def test_a_summary_of_the_wrong_types_or_shapes_is_refused_by_field(arrays, says):
    _, _, _, summaries = _three_ranks()
    with pytest.raises(ValueError, match=r"TopkSummary\(rank=1\)(: )?" + says):
        cpsched.TopkSummary(1, arrays(summaries[1].arrays))


def test_summaries_in_other_integer_layouts_plan_as_the_originals():
    import pickle
    sessions, ranges, idx, summaries = _three_ranks()
    lo, hi = ranges[0]
    base = json.loads(sessions[0].solve_topk_summaries(summaries, idx[lo:hi]).to_json(solve_ms=0))
    odd = [cpsched.TopkSummary(x.rank, (np.asfortranarray(x.arrays[0].astype(np.int32)),) + x.arrays[1:])
           for x in summaries]
    again = [pickle.loads(pickle.dumps(x)) for x in odd]
    assert all(a.seqlen is None and b.seqlen is None for a, b in zip(odd, again))
    assert pickle.loads(pickle.dumps(summaries[2])).seqlen == 96
    for gathered in (odd, again):
        assert json.loads(sessions[0].solve_topk_summaries(gathered, idx[lo:hi]).to_json(solve_ms=0)) == base
    with pytest.raises(ValueError, match=r"TopkSummary: rank: expected an integer, got True"):
        cpsched.TopkSummary(True, summaries[0].arrays)


def test_row_runs_are_checked_as_input_too():
    sessions, ranges, idx, summaries = _three_ranks()
    lo, hi = ranges[0]
    runs = sessions[0].summarize_topk_runs(idx[lo:hi])
    gathered = [runs.summary, *summaries[1:]]
    ok = sessions[0].solve_topk_runs(gathered, runs)
    assert ok.validate() == []

    def runs_with(**kw):
        a = dict(summary=runs.summary, width=runs.width, area=runs.area, kv_heads=1, causal=True)
        a.update(kw)
        return cpsched.TopkRowRuns(**a)
    for kw, says in [
        (dict(width=runs.width.astype(np.float64)), r"TopkRowRuns: width: expected an integer array, got dtype float64"),
        (dict(area=runs.area.reshape(1, -1)), r"TopkRowRuns: area: expected shape \[runs\]"),
        (dict(kv_heads=0), r"TopkRowRuns: kv_heads: 0 is outside \[1, "),
        (dict(kv_heads=-3), r"TopkRowRuns: kv_heads: -3 is outside"),
        (dict(kv_heads=1.0), r"TopkRowRuns: kv_heads: expected an integer"),
        (dict(causal="no"), r"TopkRowRuns: causal: expected True or False"),
        (dict(causal=False), r"TopkRowRuns: causal = False, but its summary was made with causal = True"),
        (dict(width=runs.width[:-1]), r"TopkRowRuns: width has \d+ entries, area \d+"),
        (dict(summary=runs.summary.arrays), r"TopkRowRuns: summary: expected a TopkSummary"),
    ]:
        with pytest.raises(ValueError, match=says):
            runs_with(**kw)
    for kw, says in [
        (dict(width=runs.width + 100), r"row runs: run 0 .* has width \d+ and \d+ pairs"),
        (dict(width=runs.width * 0 + (1 << 40)), r"runs: width\[0\] = 1099511627776 is outside \[0, 2\^31\)"),
        (dict(area=runs.area * 0 - 1), r"row runs: run 0 .* has width \d+ and -1 pairs"),
        (dict(width=runs.width * 0), r"row runs: run 0 .* has width 0"),
    ]:
        with pytest.raises(ValueError, match=says):
            sessions[0].solve_topk_runs(gathered, runs_with(**kw))
    other = sessions[1].summarize_topk_runs(idx[ranges[1][0]:ranges[1][1]])
    with pytest.raises(ValueError, match=r"runs: they are rank 1's, this Session is rank 0's"):
        sessions[0].solve_topk_runs(gathered, other)
