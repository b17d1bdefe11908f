"""A TorchPlan from a Result reads the plan from the extension's arrays, one from a text parses the JSON: both give
the same prepared plan (every split, send row, arg, reduce point, program and index pool) and the same digest, and
a one-field change of the text changes the digest (docs/torch.md, "Preparation and caching")."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cpsched  # noqa: E402
import cpsched.torch as cpt  # noqa: E402
import torch_cases as tc  # noqa: E402
from test_torch_topk_device import dsa_like, sessions  # noqa: E402

MLA = {"q": 4, "kv": 1, "dim": 48, "dim_v": 32, "kv_shared": True}
CASES = [
    (3, {"mask": "causal", "solver": "owner"}),
    (4, {"mask": "causal_document", "solver": "balanced_bytes", "stages": 2}),
    (4, {"mask": "causal_document", "solver": "static", "relay": 2, "stages": 2}),
    (4, {"mask": "causal", "solver": "owner", "relay": 2}),
    (3, {"mask": "causal_document", "heads": {"q": 4, "kv": 2, "dim": 24, "dim_v": 16}}),
    (3, {"mask": "topk", "heads": MLA, "stages": 2}),
    (4, {"mask": "topk", "sel_heads": 2, "heads": {"q": 4, "kv": 2, "dim": 16}, "relay": 2, "stages": 2}),
    (4, {"mask": "block_topk", "stages": 2}),
]


def result_of(P, spec):
    if spec["mask"] == "block_topk":
        return tc.nsa_session(spec, P).solve_config()
    if spec["mask"] == "topk":
        return tc.session(spec, P).solve_topk(tc.topk_indices(spec, P))
    m = tc.range_mask(spec, P)
    return tc.session(spec, P).solve(m.q_ranges, m.k_ranges, m.types)


def _coll(c):
    return None if c is None else (c.in_splits, c.out_splits, c.send_rows.tolist(), c.n_send, c.n_recv, c.recv_at,
                                   c.active)


def prepared(tp):
    """Everything a TorchPlan holds that the executor reads, as plain values."""
    out = {k: getattr(tp, k) for k in ("cp_size", "seqlen", "hq", "hkv", "dqk", "dv", "kv_shared", "dtype_bytes",
                                       "G", "flattened", "rows", "num_stages", "local_tail", "index_mask",
                                       "blocks_per_rank", "deferred", "relays", "has_index_args", "per_rank",
                                       "metrics", "digest", "split_digests", "own_forwarding_bits", "solver")}
    out["layout"] = tp.layout.host_ranges
    out["mask"] = [a.tolist() for a in tp.mask]
    out["head_masks"] = None if tp.head_masks is None else [[a.tolist() for a in m] for m in tp.head_masks]
    for name, pp in (("fwd", tp.fwd), ("bwd", tp.bwd)):
        out[name] = {
            "stage0": list(pp.stage0), "stages": [list(a) for a in pp.stages], "qo_rows": pp.qo_rows,
            "kv_rows": pp.kv_rows, "indices": None if pp.indices is None else pp.indices.tolist(),
            "reduces": pp.reduces, "program": pp.program, "deferred": pp.deferred_entries,
            "comm": [(st.qo_off, st.kv_off, st.qo_rows, st.kv_rows, st.qo_after, st.kv_after, _coll(st.qo),
                      _coll(st.kv), _coll(st.qo_fwd), _coll(st.kv_fwd)) for st in pp.stages_comm],
            "remote_rows": {k: None if v is None else [t.tolist() for t in v] for k, v in pp.remote_rows.items()},
            "row_global": {k: [t.tolist() for t in v] for k, v in getattr(pp, "row_global", {}).items()},
        }
    return out


@pytest.mark.parametrize("P,spec", CASES, ids=[f"P{P}-{s['mask']}-{i}" for i, (P, s) in enumerate(CASES)])
def test_a_results_plan_and_its_text_prepare_the_same_plan(P, spec):
    r = result_of(P, spec)
    text = r.to_json()
    for rank in range(P):
        a, b = prepared(cpt.TorchPlan(r, rank)), prepared(cpt.TorchPlan.from_json(text, rank))
        assert a.pop("solver") == b.pop("solver") == r.solver
        assert a == b, [k for k in a if a[k] != b[k]]
    # all_ranks reads the plan once and prepares every rank alike
    assert [prepared(tp) for tp in cpt.TorchPlan.all_ranks(r)] == [prepared(cpt.TorchPlan(r, k)) for k in range(P)]


def test_a_ranks_own_plans_agree_with_their_texts():
    s = cpsched.Session(cp_size=3, seqlen=96, heads=(4, 2, 16, "fp32"), rank=1, stages=2)
    r = s.solve([[0, 48], [48, 96]], [[0, 48], [0, 96]], ["causal", "causal"])
    a, b = prepared(cpt.TorchPlan(r, 1)), prepared(cpt.TorchPlan.from_json(r.to_json(), 1))
    assert a["per_rank"] and a == b


def test_a_plan_from_top_k_row_runs_reads_its_remote_rows_from_the_extension():
    """A rank's plan whose index rows the executor writes (no text of it can run): its remote rows come from
    comm_meta, equal to its JSON's."""
    P, S = 3, 125
    idx = dsa_like(S, 1, 7, seed=3)
    ranges = cpsched._cpsched.sharding_ranges(S, P)
    ss = sessions(P, S, 1, 2)
    runs = [s.summarize_topk_runs(idx[lo:hi]) for s, (lo, hi) in zip(ss, ranges)]
    remote = 0
    for rank in range(P):
        r = ss[rank].solve_topk_runs([x.summary for x in runs], runs[rank])
        tp = cpt.TorchPlan(r, rank)
        assert tp.deferred and tp.per_rank
        for p, pp in (("fwd", tp.fwd), ("bwd", tp.bwd)):
            comm = json.loads(r.to_json())["ranks"][0][p]["comm"]
            for kind, total in (("qo", pp.qo_rows), ("kv", pp.kv_rows)):
                runs_json = comm.get(f"remote_{kind}_rows", [])
                rows = getattr(r.comm_meta(rank, p), f"remote_{kind}_rows")
                assert rows.dtype == np.int64 and rows.shape == (len(runs_json), 4)
                assert rows.tolist() == runs_json
                want_g, want_h = np.full(total, -1), np.full(total, -1)
                for b, e, row, grp in runs_json:
                    want_g[row:row + e - b] = np.arange(b, e)
                    want_h[row:row + e - b] = grp
                got = pp.remote_rows[kind]
                assert (got is None) == (not runs_json)
                if got is not None:
                    assert got[0].tolist() == want_g.tolist() and got[1].tolist() == want_h.tolist()
                remote += len(runs_json)
    assert remote > 0  # some rank reads remote keys


def test_the_extension_gives_every_field_of_the_plans_problem():
    r = result_of(3, {"mask": "topk", "heads": MLA})
    pr, js = r._r.problem(), json.loads(r.to_json())["problem"]
    assert js["index_mask"]["kind"] == "topk" and "head_dim_v" in js
    for k, v in js.items():
        got = pr[k]
        if k == "host_ranges":
            got = [a.tolist() for a in got]
        elif k == "mask":
            got = [{"q": q, "k": kk, "type": cpsched.MASK_TYPES[t]}
                   for q, kk, t in zip(got["q_ranges"].tolist(), got["k_ranges"].tolist(), got["mask_types"].tolist())]
        assert got == v, k
    ca = r.calc_meta(1)
    args = json.loads(r.to_json())["ranks"][1]["fwd"]["calc"]["local_attn_args"]
    assert ca.local_attn_args.index_widths.tolist() == [a.get("index_width", 0) for a in args]
    assert ca.local_attn_args.index_offsets.tolist() == [a.get("index_offset", -1) for a in args]
    assert ca.deferred_index_entries == 0


def _tampered(text, path, value):
    d = json.loads(text)
    x = d
    for k in path[:-1]:
        x = x[k]
    x[path[-1]] = value
    return json.dumps(d)


@pytest.mark.parametrize("path,value", [
    (("problem", "dtype_bytes"), 2),
    (("problem", "blocks_per_rank"), 2),
    (("problem", "layout"), "planned"),
    (("ranks", 0, "fwd", "program"), None),  # replaced below by the program with two instructions swapped
    (("ranks", 1, "fwd", "calc", "local_attn_args"), None),  # replaced below by the same args in another order
])
def test_a_one_field_change_of_the_text_changes_the_digest(path, value):
    P = 3
    r = cpsched.Session(cp_size=P, seqlen=96, heads=(4, 2, 16, "fp32"), solver="balanced_bytes", stages=2).solve(
        [[0, 96]], [[0, 96]], ["causal"])
    text = r.to_json()
    d = json.loads(text)
    if path[-1] == "program":
        prog = d["ranks"][0]["fwd"]["program"]
        i = next(i for i in range(len(prog) - 1) if prog[i].startswith("cast") and prog[i + 1].startswith("compute"))
        value = prog[:i] + [prog[i + 1], prog[i]] + prog[i + 2:]
    elif path[-1] == "local_attn_args":
        args = d["ranks"][1]["fwd"]["calc"]["local_attn_args"]
        assert len(args) > 1
        value = args[1:] + args[:1]
    base = [cpt.TorchPlan.from_json(text, k).digest for k in range(P)]
    assert base == [cpt.TorchPlan(r, k).digest for k in range(P)]
    changed = _tampered(text, path, value)
    assert changed != text
    try:
        digests = [cpt.TorchPlan.from_json(changed, k).digest for k in range(P)]
    except ValueError as e:  # the validator refused the change: then it is no test of the digest
        pytest.fail(f"the changed text does not load: {e}")
    assert len(set(digests)) == 1 and digests[0] != base[0]
