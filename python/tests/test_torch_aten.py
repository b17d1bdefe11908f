"""The `aten` backend (PyTorch's own FlashAttention-2 ops) and the varlen batching it shares with `flash`, on
the CPU: the ops are replaced by a stand-in with their documented semantics (fa2_standin.py), and every call
the backend makes is also run through the real ops on `meta` tensors (the installed torch's schemas and meta
kernels), which fixes the arguments' names and types and the outputs' layouts (the varlen LSE [heads,
total_q]).

What is shown: the mask mapping (full and causal direct, inv_causal as causal on reversed rows joining the
causal batch, bi_causal as the window (Lk - Lq, 0) batched by equal Lk - Lq, a bi_causal arg with Lk < Lq
left out), rows without keys (the stand-in's LSE +inf) merged as no contribution, forward and backward of a
stage equal to the torch kernels on hand-made args of every kind, and whole plans through loopback ranks
against the dense reference."""
import os

import pytest

torch = pytest.importorskip("torch")

import fa2_standin  # noqa: E402
import torch_cases as tc  # noqa: E402
from cpsched.torch import AtenBackend, FlashBackend, TorchBackend, loopback  # noqa: E402
from cpsched.torch._backends import make_backend  # noqa: E402
from cpsched.torch._kernels import BackwardBuffers, ForwardBuffers, scatter_merge  # noqa: E402
from cpsched.torch._plan import Arg, ArgList  # noqa: E402
from cpsched.torch._varlen import VarlenStage, arg_mode  # noqa: E402

FP32_TOL = 1e-5


def A(q0, q1, k0, k1, t, group=-1, qr=False, kr=False):
    return Arg(q0, q1, k0, k1, t, group, qr, kr)


def test_mask_mapping():
    assert arg_mode(A(0, 8, 0, 8, 0)) == ("full", False)
    assert arg_mode(A(0, 8, 0, 12, 1)) == ("causal", False)
    assert arg_mode(A(0, 8, 0, 12, 2)) == ("causal", True)  # inv_causal: causal on reversed rows
    assert arg_mode(A(0, 8, 0, 12, 3)) == (("window", 4), False)  # bi_causal: window (Lk - Lq, 0)
    assert arg_mode(A(0, 8, 0, 8, 3)) == (("window", 0), False)
    assert arg_mode(A(0, 8, 0, 5, 3)) is None  # d < 0: no key at all
    assert arg_mode(A(0, 0, 0, 5, 0)) is None and arg_mode(A(0, 4, 3, 3, 1)) is None
    ix = Arg(0, 4, 0, 4, 0, -1, False, True, 0, 3)
    assert arg_mode(ix) is None  # index args stay on the index kernels


def test_batches_join_inv_causal_with_causal_and_group_windows_by_d():
    args = ArgList([A(0, 4, 0, 6, 1), A(4, 8, 2, 5, 2), A(0, 3, 0, 5, 3), A(3, 6, 1, 3, 3), A(2, 4, 0, 4, 3),
                    A(0, 2, 0, 2, 0), A(0, 4, 0, 2, 3)])
    st = VarlenStage(args, 1, 2, "cpu")
    keys = sorted(str(b.key) for b in st.batches)
    assert keys == ["('window', 2)", "causal", "full"], keys  # one window batch of d = 2 (two args)
    assert st.rest == [args[3], args[6]]  # bi_causal with Lk < Lq: no key, left to the torch kernels
    causal = next(b for b in st.batches if b.key == "causal")
    assert causal.q_idx.tolist() == [0, 1, 2, 3, 7, 6, 5, 4]  # the inv_causal arg's rows run backwards
    assert causal.k_idx.tolist() == [0, 1, 2, 3, 4, 5, 4, 3, 2]
    assert causal.cu_q.tolist() == [0, 4, 8] and causal.cu_k.tolist() == [0, 6, 9] and causal.causal
    win = next(b for b in st.batches if b.key == ("window", 2))
    assert win.window == (2, 0) and not win.causal and win.cu_q.tolist() == [0, 3, 5]


# ---- a stage's forward and backward against the torch kernels -------------------------------------------


def _buffers(L, Nq, Nk, hq, hkv, qpg, kpg, d, dt, g):
    G = hq // qpg
    t = lambda *s: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    b = dict(q=t(L, hq, d), k=t(L, hkv, d), v=t(L, hkv, d), rq=t(Nq, qpg, d), rk=t(Nk, kpg, d), rv=t(Nk, kpg, d))
    b["G"] = G
    return b


def _fresh(inp, pass_, final=None):
    """Buffers for one stage over copies of the inputs (forward: empty accumulators; backward: the final O and
    lse, dO, zero gradient accumulators)."""
    L, hq, d = inp["q"].shape
    Nq, qpg, _ = inp["rq"].shape
    Nk, kpg, _ = inp["rk"].shape
    hkv = inp["k"].shape[1]
    kw = {n: inp[n] for n in ("q", "k", "v")}
    kw.update(remote_q=inp["rq"], remote_k=inp["rk"], remote_v=inp["rv"], q_per_group=qpg, kv_per_group=kpg,
              shared=False, scale=0.3)
    if pass_ == "fwd":
        kw.update(o=torch.zeros(L, hq, d), lse=torch.full((L, hq), float("-inf")), remote_o=torch.zeros(Nq, qpg, d),
                  remote_lse=torch.full((Nq, qpg), float("-inf")))
        b = ForwardBuffers(**kw)
        b.remote_lse_rows = b.remote_lse.unsqueeze(-1)
    else:
        o, lse, ro, rlse, do, rdo = final
        kw.update(out=o.to(inp["q"].dtype), lse=lse, remote_out=ro.to(inp["q"].dtype), remote_lse=rlse, dout=do,
                  remote_dout=rdo, dq=torch.zeros(L, hq, d), dk=torch.zeros(L, hkv, d), dv=torch.zeros(L, hkv, d),
                  remote_dq=torch.zeros(Nq, qpg, d), remote_dk=torch.zeros(Nk, kpg, d),
                  remote_dv=torch.zeros(Nk, kpg, d),
                  remote_delta=(rdo.float() * ro.to(inp["q"].dtype).float()).sum(-1))
        b = BackwardBuffers(**kw)
    b.take = lambda key, specs, build=None: (build or (lambda x: x))([torch.empty(s, dtype=t) for s, t in specs])
    return b


def _finish(b, pass_):
    """What the executor does at the end of a pass with the backend's parts of local rows."""
    L, hq = b.q.shape[:2]
    G = hq // b.q_per_group
    if pass_ == "fwd":
        for o, lse, idx in b.local_parts:
            scatter_merge(b.o.view(L * G, b.q_per_group, -1), b.lse.view(L * G, b.q_per_group), idx, o, lse)
    else:
        for name, lst in b.local_grads.items():
            acc = getattr(b, name)
            for g, idx in lst:
                acc.view(acc.shape[0] * (acc.shape[1] // g.shape[1]), g.shape[1], -1).index_add_(0, idx, g.float())


def _run(backend, args, inp, final=None):
    out = {}
    b = _fresh(inp, "fwd")
    backend.forward_stage(args, b)
    _finish(b, "fwd")
    out["fwd"] = (b.o, b.lse, b.remote_o, b.remote_lse)
    if final is not None:
        bb = _fresh(inp, "bwd", final)
        backend.backward_stage(args, bb)
        _finish(bb, "bwd")
        out["bwd"] = (bb.dq, bb.dk, bb.dv, bb.remote_dq, bb.remote_dk, bb.remote_dv)
    return out


def _stage_args(G, L, Nq, Nk):
    """Every kind of arg on local and remote buffers, with rows that see no key (causal / inv_causal with
    Lk < Lq), windows of two different d, a bi_causal arg with Lk < Lq, and args that share rows."""
    grp = lambda i: i % G if G > 1 else -1  # noqa: E731
    return ArgList([
        A(0, 10, 0, 14, 0, grp(0)), A(3, 17, 2, 20, 1, grp(1)), A(5, 20, 8, 14, 1, grp(0)),  # causal Lk < Lq
        A(0, 12, 4, 10, 2, grp(1)), A(8, 14, 0, 16, 2, grp(0)),  # inv_causal, one with Lk < Lq
        A(2, 9, 3, 13, 3, grp(1)), A(10, 16, 1, 7, 3, grp(0)), A(12, 20, 12, 22, 3, grp(1)),  # windows d = 3, 0, 2
        A(0, 6, 0, 4, 3, grp(0)),  # bi_causal with Lk < Lq: no key (left to the torch kernels)
        A(0, 9, 0, 11, 1, grp(0), qr=True), A(4, 12, 2, 9, 2, grp(1), qr=True, kr=True),
        A(0, 7, 5, 12, 3, grp(0), kr=True), A(6, 12, 0, 12, 0, grp(1), qr=True, kr=True),
    ])


@pytest.mark.parametrize("G,dt", [(1, torch.float32), (2, torch.float32), (2, torch.bfloat16)],
                         ids=["one-group-fp32", "two-groups-fp32", "two-groups-bf16"])
@pytest.mark.parametrize("kind", ["aten", "flash"])
def test_stage_forward_and_backward_equal_the_torch_kernels(G, dt, kind):
    g = torch.Generator().manual_seed(7 + G)
    hq, hkv, d = 4 * G, 2 * G, 16
    qpg, kpg = hq // G, hkv // G
    L, Nq, Nk = 24, 12, 14
    inp = _buffers(L, Nq, Nk, hq, hkv, qpg, kpg, d, dt, g)
    args = _stage_args(G, L, Nq, Nk)
    ref = _run(TorchBackend(), args, inp)
    o, lse, ro, rlse = ref["fwd"]
    do, rdo = torch.randn(L, hq, d, generator=g).to(dt), torch.randn(Nq, qpg, d, generator=g).to(dt)
    final = (o, lse, ro, rlse, do, rdo)
    ref = _run(TorchBackend(), args, inp, final)
    if kind == "aten":
        ops = fa2_standin.MetaChecked(fa2_standin.AtenOps())
        be = AtenBackend(ops=ops)
    else:
        fwd, bwd = fa2_standin.flash_kernels()
        be = FlashBackend(kernel=fwd, bwd_kernel=bwd)
    got = _run(be, args, inp, final)
    tol = FP32_TOL if dt == torch.float32 else 2e-2
    for name, a, b in zip(("o", "lse", "ro", "rlse"), got["fwd"], ref["fwd"]):
        assert torch.equal(torch.isinf(a), torch.isinf(b)), name  # rows without keys stay -inf, never +inf
        assert tc.rel_err(a.nan_to_num(0, 0, 0).double(), b.nan_to_num(0, 0, 0).double()) <= tol, name
    for name, a, b in zip(("dq", "dk", "dv", "rdq", "rdk", "rdv"), got["bwd"], ref["bwd"]):
        assert tc.rel_err(a.double(), b.double()) <= tol, (name, tc.rel_err(a.double(), b.double()))
    if kind == "aten":
        assert ops.checked > 0
        calls = set(ops.inner.calls)
        # full, causal (with the reversed inv_causal rows) and the windows of d = 3, 0 and 2, both passes
        assert {("fwd", False, -1, -1), ("fwd", True, -1, -1), ("fwd", False, 3, 0), ("fwd", False, 0, 0),
                ("fwd", False, 2, 0), ("bwd", True, -1, -1), ("bwd", False, 2, 0)} <= calls, calls


def test_rows_without_keys_get_plus_inf_from_fa2_and_merge_as_nothing():
    """The stand-in returns LSE +inf where a causal arg with Lk < Lq has no key (as FA2 does); the backend's
    merged LSE of such a row that no other arg reaches is -inf and its O is 0."""
    ops = fa2_standin.AtenOps()
    q = torch.randn(6, 2, 8)
    k = torch.randn(3, 1, 8)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    cuk = torch.tensor([0, 3], dtype=torch.int32)
    _, lse, *_ = ops._flash_attention_forward(q, k, k, cu, cuk, 6, 3, 0.0, True, False, scale=0.5)
    assert lse.shape == (2, 6) and torch.isinf(lse[:, :3]).all() and (lse[:, :3] > 0).all()
    inp = {"q": q, "k": torch.cat([k, k]), "v": torch.randn(6, 1, 8), "rq": torch.zeros(0, 2, 8),
           "rk": torch.zeros(0, 1, 8), "rv": torch.zeros(0, 1, 8)}
    args = ArgList([A(0, 6, 0, 3, 1)])
    got = _run(AtenBackend(ops=fa2_standin.MetaChecked(fa2_standin.AtenOps())), args, inp)["fwd"]
    o, lse = got[0], got[1]
    assert torch.isinf(lse[:3]).all() and (lse[:3] < 0).all() and (o[:3] == 0).all()
    assert torch.isfinite(lse[3:]).all()


def test_the_real_ops_take_what_the_backend_passes_on_meta_tensors():
    """The installed torch's schemas: the backend's exact argument lists, on meta tensors, for every window
    kind; the varlen LSE is [heads, total_q] fp32 and the backward's gradients have the inputs' shapes."""
    be = AtenBackend()
    q = torch.empty(40, 8, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(50, 2, 128, dtype=torch.bfloat16, device="meta")
    cu_q = torch.empty(3, dtype=torch.int32, device="meta")
    for causal, window in ((False, (-1, -1)), (True, (-1, 0)), (False, (7, 0))):
        o, lse = be._fwd(q, k, k, cu_q, cu_q, 30, 40, 0.1, causal, window)
        assert o.shape == (40, 8, 128) and lse.shape == (40, 8) and lse.dtype == torch.float32
        dq, dk, dv = be._bwd(q, q, k, k, q, lse.transpose(0, 1).contiguous(), cu_q, cu_q, 30, 40, 0.1, causal,
                             window, None, None, None)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape


def test_backend_choice_and_refusals():
    spec = {"mask": "causal_document"}
    tp, _ = tc.solve(spec, 1, 0)
    cpu = torch.device("cpu")
    assert type(make_backend("auto", cpu, torch.float32, tp)) is TorchBackend
    with pytest.raises(ValueError, match=r"backend='aten': PyTorch's FlashAttention-2 ops run on CUDA tensors; q "
                                         r"is on cpu"):
        make_backend("aten", cpu, torch.bfloat16, tp)
    with pytest.raises(ValueError, match=r"expected 'auto', 'torch', 'aten', 'flash', 'flex' or 'triton'"):
        make_backend("fa2", cpu, torch.float32, tp)
    from cpsched.torch._aten import aten_shape_unsupported
    assert aten_shape_unsupported(torch.float32, tp) == "FlashAttention-2 takes float16 or bfloat16, q is torch.float32"
    assert aten_shape_unsupported(torch.bfloat16, tp) == "FlashAttention-2 takes a head dim of at most 256 and a " \
                                                         "multiple of 8, the plan has 16" or tp.dqk % 8 == 0


# ---- whole plans, loopback ranks, against the dense reference ------------------------------------------------

PLAN_CASES = [
    (2, {"mask": "causal_document", "stages": 2}),
    (3, {"mask": "prefix_lm", "stages": 2, "relay": 0}),
    (4, {"mask": "share_question", "stages": "auto", "solver": "static"}),
    (4, {"mask": "sliding_window", "stages": 2, "relay": 2, "solver": "static"}),
    # user slices of every type, rows without keys (causal and inv_causal with Lk < Lq) and bi_causal bands
    (3, {"mask": "custom", "spr": 96, "stages": 2, "ranges": [
        (0.0, 0.5, 0.0, 0.3, "causal"), (0.5, 1.0, 0.2, 0.6, "inv_causal"), (0.1, 0.4, 0.3, 0.9, "bi_causal"),
        (0.6, 0.9, 0.0, 0.2, "full"), (0.7, 1.0, 0.6, 1.0, "bi_causal"), (0.0, 0.1, 0.9, 1.0, "inv_causal")]}),
    (4, {"mask": "custom", "spr": 64, "stages": 1, "heads": {"q": 8, "kv": 2, "dim": 16}, "ranges": [
        (0.0, 1.0, 0.0, 1.0, "bi_causal"), (0.5, 0.75, 0.0, 0.25, "inv_causal")]}),
]


# CI runs every plan on aten's stand-in and the user slices on flash's (its other plans repeat the same batching;
# test_torch_loopback runs flash's stand-in on gloo's cases too); CPSCHED_TORCH_SLOW=1 runs all of them.
_SLOW = os.environ.get("CPSCHED_TORCH_SLOW") == "1"
PLAN_PARAMS = [pytest.param(P, spec, backend, id=f"{backend}-P{P}-{spec['mask']}",
                            marks=() if backend == "aten_stub" or spec["mask"] == "custom" else pytest.mark.skipif(
                                not _SLOW, reason="the same batching as aten's: CPSCHED_TORCH_SLOW=1 runs it"))
               for backend in ("aten_stub", "flash_stub") for P, spec in PLAN_CASES]


@pytest.mark.parametrize("P,spec,backend", PLAN_PARAMS)
def test_plans_through_the_varlen_backends_match_the_dense_reference(P, spec, backend):
    spec = dict(spec, backend=backend)
    res = loopback.run(lambda r, g: tc.attn_case(r, P, spec, g), P, timeout=120)
    ref = tc.reference(spec, P, res[0]["plan"])
    for key in ("out", "dq", "dk", "dv"):
        assert tc.rel_err(tc.assemble(res, key), ref[key]) <= FP32_TOL, key
