"""graphs=True on the CPU, with the recording stand-in of capture and replay (_graphs.RECORD_ON_CPU): the same
lifecycle as CUDA graphs (eager, eager + capture, replays), the same checks (host syncs, the workspace
moving), and replay equal to eager. What the captured program reads and writes besides what it made itself
is the workspace, the static inputs and the plan's own tensors, never a call's tensors. Where capture cannot
work the call runs eagerly, correct, with a one-line reason. (The CUDA test of replay == eager is in
test_torch_cuda.py.)"""
import warnings

import pytest

torch = pytest.importorskip("torch")

import cpsched.torch as cpt  # noqa: E402
import fa2_standin  # noqa: E402
import torch_cases as tc  # noqa: E402
from cpsched.torch import _graphs, loopback  # noqa: E402
from cpsched.torch._api import _Attention  # noqa: E402
from cpsched.torch._plan import TorchPlan  # noqa: E402
from cpsched.torch._workspace import arena  # noqa: E402
from torch_pool import get_pool  # noqa: E402


@pytest.fixture(autouse=True)
def record_on_cpu(monkeypatch):
    monkeypatch.setattr(_graphs, "RECORD_ON_CPU", True)


def _inputs(tp, seed, dt=torch.float32):
    g = torch.Generator().manual_seed(seed)
    L = tp.rows
    q = torch.randn(L, tp.hq, tp.dqk, generator=g).to(dt).requires_grad_()
    k = torch.randn(L, tp.hkv, tp.dqk, generator=g).to(dt).requires_grad_()
    v = torch.randn(L, tp.hkv, tp.dv, generator=g).to(dt).requires_grad_()
    do = torch.randn(L, tp.hq, tp.dv, generator=g).to(dt)
    return q, k, v, do


def _call(tp, inputs, backend, comm, graphs):
    q, k, v, do = inputs
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    dp = tp.on("cpu")
    out, lse = _Attention.apply(q, k, v, dp, backend, comm, 1.0 / tp.dqk ** 0.5, graphs)
    out.backward(do)
    return [out.detach(), lse, q.grad, k.grad, v.grad]


def _same(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)


class NoComm:
    """One rank without a group (P = 1)."""
    group = None

    def a2a(self, *a):
        raise AssertionError("a P = 1 plan has no collective")


def _states(tp):
    return sorted(s for s, _ in _graphs.state(tp.on("cpu")).values())


@pytest.mark.parametrize("backend", ["torch", "aten_stub"])
def test_p1_replay_equals_eager(backend):
    spec = {"mask": "causal_document", "stages": 2, "heads": {"q": 4, "kv": 2, "dim": 16}, "spr": 256}
    tp, _ = tc.solve(spec, 1, 0)
    be = tc.backend_of(backend) if backend != "torch" else cpt.TorchBackend()  # one object: its graph key
    ref = cpt.TorchBackend()
    for i in range(4):
        inputs = _inputs(tp, i)
        got = _call(tp, inputs, be, NoComm(), True)
        want = _call(tp, inputs, be, NoComm(), False)
        _same(got, want)
        if backend == "torch":
            _same(got, _call(tp, inputs, ref, NoComm(), False))
        assert _states(tp) == (["warm", "warm"] if i == 0 else ["graph", "graph"]), (i, _states(tp))


def test_p4_relays_replay_equals_eager_and_touches_only_the_workspace():
    """Rank 2 of a P = 4 plan with relays and two stages; its collectives are device copies (a capturable
    stand-in: each receives rows of its own send buffer)."""
    spec = {"mask": "causal", "solver": "static", "stages": 2, "relay": 2, "spr": 128}
    m = tc.range_mask(spec, 4)
    r = tc.session(spec, 4).solve(m.q_ranges, m.k_ranges, m.types)
    tp = TorchPlan(r, 2)
    assert tp.relays
    comm = tc.CopyComm()
    be = cpt.TorchBackend()
    seen = []
    for i in range(4):
        inputs = _inputs(tp, 10 + i)
        got = _call(tp, inputs, be, comm, True)
        _same(got, _call(tp, inputs, be, comm, False))
        seen.append([id(x) for x in inputs])
    dp = tp.on("cpu")
    ws_ptr = arena("cpu").buf.untyped_storage().data_ptr()
    for key, e in dp.graphs.items():
        assert e.state == "graph" and e.checker is not None and e.checker.ops
        statics = {s.untyped_storage().data_ptr() for s in e.static if s is not None}
        assert e.checker.writes <= {ws_ptr} | statics, key  # it writes the workspace (and its static inputs)
        assert ws_ptr in e.checker.writes
        plan_tensors = _plan_storages(dp)
        assert e.checker.reads <= {ws_ptr} | statics | plan_tensors, (key, e.checker.reads - ({ws_ptr} | statics))


def _plan_storages(dp):
    """Storages of the tensors a device plan keeps (row indices, index pools, the batches' cached tensors)."""
    out = set()

    def add(x):
        if isinstance(x, torch.Tensor):
            out.add(x.untyped_storage().data_ptr())
    for pp in (dp.fwd, dp.bwd):
        add(pp.indices)
        for st in pp.comm:
            for c in (st.qo, st.kv, st.qo_fwd, st.kv_fwd):
                if c is not None:
                    add(c.send_rows)
    ar = arena(dp.device)
    for per in ar.bound.values():
        for ws in per.values():
            for fin in ws.finals.values():
                for x in fin[1:]:
                    add(x)
            for relay, first in ws.reduces.values():
                for rr in (relay, first):
                    if rr is not None:
                        add(rr.idx), add(rr.idx_exp)
            for _, idx, _, _ in ws.fill_fields:
                add(idx)
            for hit in ws.merge_idx.values():
                add(hit[1]), add(hit[2])
    return out


def test_a_host_sync_falls_back_with_its_reason():
    class Syncing(cpt.TorchBackend):
        def forward_stage(self, args, b):
            super().forward_stage(args, b)
            if float(b.lse.max()) > 1e30:  # reads a device value on the host
                raise AssertionError

    spec = {"mask": "causal_document"}
    tp, _ = tc.solve(spec, 1, 0)
    be = Syncing()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(3):
            inputs = _inputs(tp, i)
            _same(_call(tp, inputs, be, NoComm(), True), _call(tp, inputs, cpt.TorchBackend(), NoComm(), False))
    msgs = [str(x.message) for x in w if "graphs=True" in str(x.message)]
    assert len(msgs) == 1 and "a host sync inside the pass (aten._local_scalar_dense" in msgs[0], msgs
    st = _graphs.state(tp.on("cpu"))
    assert any(s == "eager" and "host sync" in (r or "") for s, r in st.values()), st


def test_a_workspace_that_grew_is_laid_out_and_captured_again():
    small = tc.solve({"mask": "causal_document", "spr": 256}, 1, 0)[0]
    big = tc.solve({"mask": "full_document", "spr": 2048, "heads": {"q": 4, "kv": 2, "dim": 64}}, 1, 0)[0]
    be = cpt.TorchBackend()
    for i in range(3):
        _call(small, _inputs(small, i), be, NoComm(), True)
    assert _states(small) == ["graph", "graph"]
    grown = arena("cpu").grown
    _call(big, _inputs(big, 0), be, NoComm(), False)  # needs a larger arena
    assert arena("cpu").grown > grown
    for i in range(3):
        inputs = _inputs(small, 20 + i)
        _same(_call(small, inputs, be, NoComm(), True), _call(small, inputs, be, NoComm(), False))
        assert _states(small) == (["warm", "warm"] if i == 0 else ["graph", "graph"])


def _warned(fn, P):
    """loopback.run(fn, P) and the graphs warnings its ranks gave (recorded in this thread: warnings' state is
    the process's)."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res = loopback.run(fn, P, timeout=120)
    return res, [str(x.message) for x in w if "graphs=True" in str(x.message)]


def test_loopback_and_index_rows_per_call_run_eagerly_with_a_reason():
    spec = {"mask": "topk", "heads": {"q": 4, "kv": 1, "dim": 48, "dim_v": 32, "kv_shared": True}, "spr": 64,
            "topk": 12, "stages": 2, "module": True, "summaries": True}
    res, msgs = _warned(lambda rank, g: tc.attn_case(rank, 2, dict(spec, graphs=True), g), 2)
    ref = tc.reference(spec, 2, res[0]["plan"])
    for key in ("out", "dq", "dk"):
        assert tc.rel_err(tc.assemble(res, key), ref[key]) <= 1e-5
    # per rank, forward and backward: the plan is the rank's own, its rows written per call
    assert len(msgs) == 4 and all("the plan's index rows are written per call" in m for m in msgs), msgs
    _, msgs = _warned(lambda rank, g: tc.attn_case(rank, 2, {"mask": "causal_document", "graphs": True}, g), 2)
    assert len(msgs) == 4 and all("the loopback group's collectives are host rendezvous" in m for m in msgs), msgs


def test_gloo_runs_eagerly_with_a_reason():
    res = get_pool(2).values("attn_case", timeout=120, spec={"mask": "causal_document", "graphs": True,
                                                              "warnings": True})
    ref = tc.reference({"mask": "causal_document"}, 2, res[0]["plan"])
    assert tc.rel_err(tc.assemble(res, "out"), ref["out"]) <= 1e-5
    for r in res:
        assert r["warnings"] and all("run on gloo (host work)" in m for m in r["warnings"]), r["warnings"]


def test_graphs_must_be_a_bool():
    spec = {"mask": "causal_document"}
    tp, _ = tc.solve(spec, 1, 0)
    q, k, v, _ = _inputs(tp, 0)
    with pytest.raises(ValueError, match=r"graphs: expected True or False, got 'yes'"):
        cpt.attention(q, k, v, tp, graphs="yes")


def test_stand_in_kernels_of_the_aten_backend_are_captured_with_it():
    """The aten backend's calls (here the stand-in and the real ops on meta tensors) are part of the captured
    program: replays make no call of the backend's Python."""
    ops = fa2_standin.AtenOps()
    be = cpt.AtenBackend(ops=ops)
    tp, _ = tc.solve({"mask": "prefix_lm", "stages": 2, "spr": 256}, 1, 0)
    for i in range(2):
        _call(tp, _inputs(tp, i), be, NoComm(), True)
    n = len(ops.calls)
    inputs = _inputs(tp, 5)
    got = _call(tp, inputs, be, NoComm(), True)
    assert len(ops.calls) == n  # a replay
    _same(got, _call(tp, inputs, be, NoComm(), False))
