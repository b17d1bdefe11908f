"""cpsched.torch runs the plan's program (core/include/cpsched/plan/program.hpp) and no order of its own: a plan
text whose program is changed (every reduce moved to the pass end) gives the same results, and the collectives
torch issues follow the changed order. A text's program is validated like its other fields."""
import json

import pytest

torch = pytest.importorskip("torch")

import cpsched.torch as cpt  # noqa: E402
import torch_cases as tc  # noqa: E402
from cpsched.torch import _api, _exec, loopback  # noqa: E402
from test_torch_attention import FP32_TOL  # noqa: E402

P = 4
SPEC = {"mask": "causal_document", "stages": 3, "relay": 2, "solver": "static"}


def _plan_text():
    m = tc.range_mask(SPEC, P)
    return tc.session(SPEC, P).solve(m.q_ranges, m.k_ranges, m.types).to_json()


def _programs(text):
    d = json.loads(text)
    return [(e[p]["program"]) for e in d["ranks"] for p in ("fwd", "bwd")]


def _reduces_at_end(text):
    """The plan with every rank's reduces moved to just before wait_reduces, in their order."""
    d = json.loads(text)
    for e in d["ranks"]:
        for p in ("fwd", "bwd"):
            prog = e[p]["program"]
            red = [x for x in prog if x.startswith("reduce ")]
            rest = [x for x in prog if not x.startswith("reduce ")]
            at = next(j for j, x in enumerate(rest) if x.startswith("wait_reduces"))
            e[p]["program"] = rest[:at] + red + rest[at:]
    return json.dumps(d)


def _expected_collectives(pp, pass_):
    """The all_to_all_single calls (out splits, in splits) a pass issues when it follows its program: a cast's
    forwarding phase leaves at the stage's wait_cast; a collective that moves nothing anywhere is skipped."""
    out = []
    for i in pp.program:
        st = pp.stages_comm[i.stage - 1] if 1 <= i.stage <= len(pp.stages_comm) else None
        if i.op == "cast" and i.phase == "first":
            cs = [(c, False) for c in (st.qo, st.kv)]
        elif i.op == "wait_cast":
            cs = [(c, False) for c in (st.qo_fwd, st.kv_fwd)]
        elif i.op == "reduce" and (i.kind == "qo" or pass_ == "bwd"):
            cs = [(getattr(st, i.kind + ("_fwd" if i.phase == "forwarding" else "")), True)]
        else:
            cs = []
        for c, back in cs:
            if c is not None and c.active:
                out.append((tuple(c.in_splits), tuple(c.out_splits)) if back else
                           (tuple(c.out_splits), tuple(c.in_splits)))
    return out


class _Recording(_exec.Comm):
    calls = {}

    def a2a(self, out, inp, out_splits, in_splits):
        self.calls.setdefault(self.group.rank(), []).append((tuple(out_splits), tuple(in_splits)))
        return super().a2a(out, inp, out_splits, in_splits)


def _run(rank, group, text):
    tp = cpt.TorchPlan.from_json(text, rank)
    q, k, v, do = tc.global_inputs(SPEC, tp.seqlen)
    ql, kl, vl = (cpt.dispatch(x, tp, group).requires_grad_() for x in (q, k, v))
    out = cpt.attention(ql, kl, vl, tp, group, backend="torch")
    out.backward(cpt.dispatch(do, tp, group))
    return {"rows": tp.layout.global_index(rank).numpy(), "out": tc._np(out), "dq": tc._np(ql.grad),
            "dk": tc._np(kl.grad), "dv": tc._np(vl.grad), "plan": text if rank == 0 else None,
            "expected": _expected_collectives(tp.fwd, "fwd") + _expected_collectives(tp.bwd, "bwd")}


def _run_all(text, monkeypatch):
    monkeypatch.setattr(_api, "Comm", _Recording)
    _Recording.calls = {}
    res = loopback.run(lambda r, g: _run(r, g, text), P, timeout=120)
    return res, dict(_Recording.calls)


def test_torch_follows_a_changed_program(monkeypatch):
    text = _plan_text()
    d = json.loads(text)
    assert any(st.get("qo_fwd") or st.get("kv_fwd")
               for e in d["ranks"] for st in e["bwd"]["comm"]["stages"]), "the plan was meant to have relays"
    # the precondition: some reduce comes before the last stage's compute, so that moving it changes the order
    N = d["stages"]
    early = [prog for prog in _programs(text)
             if min(j for j, x in enumerate(prog) if x.startswith("reduce ")) < prog.index(f"compute {N}")]
    assert early, "the plan was meant to reduce some stage before the last"
    moved = _reduces_at_end(text)
    assert _programs(moved) != _programs(text)

    base, base_calls = _run_all(text, monkeypatch)
    res, calls = _run_all(moved, monkeypatch)
    # (a) the same results as the unchanged plan's (bitwise: the same arithmetic, later) and the dense reference
    for r in range(P):
        for key in ("out", "dq", "dk", "dv"):
            assert (res[r][key] == base[r][key]).all(), (r, key)
    tc.check_results(res, SPEC, P, FP32_TOL)
    # (b) the collectives torch issued follow each program, and the changed program's order is another
    for r in range(P):
        assert base_calls[r] == base[r]["expected"]
        assert calls[r] == res[r]["expected"]
    assert any(calls[r] != base_calls[r] for r in range(P)), "moving the reduces changed no collective's order"


def _edit(text, fn):
    d = json.loads(text)
    fn(d)
    return json.dumps(d)


@pytest.fixture(scope="module")
def text():
    return _plan_text()


def test_a_text_without_program_is_refused(text):
    bad = _edit(text, lambda d: d["ranks"][1]["bwd"].pop("program"))
    with pytest.raises(ValueError, match=r"ranks\[1\]\.bwd\.program: missing"):
        cpt.TorchPlan.from_json(bad, 0)


def test_a_program_that_cannot_run_is_refused_naming_the_instruction(text):
    def early_reduce(d):  # stage 1's first QO reduce before anything was computed
        prog = d["ranks"][2]["fwd"]["program"]
        prog.remove("reduce 1 qo forwarding")
        prog.insert(0, "reduce 1 qo forwarding")
    with pytest.raises(ValueError, match=r"ranks\[2\]\.fwd\.program\[0\]: reduce 1 qo forwarding: a reduce before"):
        cpt.TorchPlan.from_json(_edit(text, early_reduce), 3)

    def garbage(d):
        d["ranks"][0]["bwd"]["program"][4] = "cast two first"
    with pytest.raises(ValueError, match=r"ranks\[0\]\.bwd\.program\[4\]: 'cast two first' is not an instruction"):
        cpt.TorchPlan.from_json(_edit(text, garbage), 1)


def test_ranks_that_would_issue_their_collectives_in_another_order_are_refused(text):
    moved = json.loads(_reduces_at_end(text))
    d = json.loads(text)
    d["ranks"][3]["bwd"]["program"] = moved["ranks"][3]["bwd"]["program"]  # one rank only: they would not meet
    with pytest.raises(ValueError, match=r"ranks\[3\]\.bwd\.program\[\d+\]: its collectives are issued in another "
                                         r"order than rank 0's"):
        cpt.TorchPlan.from_json(json.dumps(d), 0)


def test_the_extensions_program_is_the_texts():
    """Result.program's rows (the codes of the core's Op, RowKind, Phase) are the plan text's instructions."""
    from cpsched.torch import _program
    m = tc.range_mask(SPEC, P)
    r = tc.session(SPEC, P).solve(m.q_ranges, m.k_ranges, m.types)
    d = json.loads(r.to_json())
    for rank in range(P):
        tp = cpt.TorchPlan(r, rank)
        for p, pp in (("fwd", tp.fwd), ("bwd", tp.bwd)):
            rows = r._r.program(rank, p)
            assert rows.dtype.name == "int32" and rows.shape == (len(d["ranks"][rank][p]["program"]), 4)
            assert [str(i) for i in _program.from_array(rows)] == d["ranks"][rank][p]["program"]
            assert pp.program == _program.from_array(rows)
