"""cpsched.torch in one process: the kernels against autograd, the merges, a one-rank plan without
torch.distributed, the layouts, and the package without torch."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import cpsched  # noqa: E402
import cpsched.torch as cpt  # noqa: E402
from cpsched.torch import _kernels as K  # noqa: E402
from cpsched.torch.reference import dense_attention, mask_matrix, topk_matrix  # noqa: E402
from torch_pool import get_pool  # noqa: E402


def test_cpsched_imports_without_torch_and_cpsched_torch_says_how_to_get_it():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import cpsched; assert cpsched.Session(cp_size=2, seqlen=64).options['cp_size'] == 2\n"
            "try:\n    import cpsched.torch\nexcept ImportError as e:\n    print('IMPORT-ERROR:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "IMPORT-ERROR:" in out.stdout and "pip install .[torch]" in out.stdout, out.stdout


def _rect(lq, lk, t, hq=4, hk=2, d=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(lq, hq, d, generator=g, dtype=torch.float64)
    k = torch.randn(lk, hk, d, generator=g, dtype=torch.float64)
    v = torch.randn(lk, hk, dv, generator=g, dtype=torch.float64)
    do = torch.randn(lq, hq, dv, generator=g, dtype=torch.float64)
    # the dense mask of the rectangle as one slice (rows then cols offset so that they do not overlap)
    S = lq + lk
    m = mask_matrix([(lk, lk + lq)], [(0, lk)], [t], S)[lk:, :lk]
    return q, k, v, do, m


@pytest.mark.parametrize("t", [0, 1, 2, 3], ids=cpsched.MASK_TYPES)
@pytest.mark.parametrize("lq,lk", [(7, 11), (11, 7), (9, 9)])
def test_range_kernel_matches_autograd(t, lq, lk, monkeypatch):
    monkeypatch.setattr(K, "SCORE_BUDGET", 20)  # a few rows per chunk: the chunked path
    q, k, v, do, m = _rect(lq, lk, t)
    scale = 0.3
    o, lse = K.range_forward(q, k, v, t, scale)
    # reference on the rectangle: rows with no entry give O = 0, lse = -inf
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    S = max(lq, lk)
    full = torch.zeros(S, S, dtype=torch.bool)
    full[:lq, :lk] = m
    pad = lambda x, n: torch.cat([x, torch.zeros((n - x.shape[0],) + x.shape[1:], dtype=x.dtype)])  # noqa: E731
    ref = dense_attention(pad(qq, S), pad(kk, S), pad(vv, S), full, scale)[:lq]
    assert torch.allclose(o, ref, atol=1e-12)
    alive = m.any(1)
    assert torch.isinf(lse[~alive]).all() and torch.isfinite(lse[alive]).all()
    ref.backward(do)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (do * o).sum(-1)
    K.range_backward(q, k, v, do, lse, delta, t, scale, dq, dk, dv)
    for a, b in ((dq, qq.grad), (dk, kk.grad), (dv, vv.grad)):
        assert torch.allclose(a, b, atol=1e-12)


def test_index_kernel_matches_autograd(monkeypatch):
    monkeypatch.setattr(K, "SCORE_BUDGET", 50)
    g = torch.Generator().manual_seed(3)
    S, hq, hk, d, dv, w = 24, 4, 1, 8, 5, 6
    idx = torch.full((S, hk, w), -1, dtype=torch.int64)
    for i in range(S):
        sel = torch.randperm(i + 1, generator=g)[:w]
        idx[i, 0, :len(sel)] = sel
    q = torch.randn(S, hq, d, generator=g, dtype=torch.float64)
    k = torch.randn(S, hk, d, generator=g, dtype=torch.float64)  # a shared latent: V = K[..., :dv]
    do = torch.randn(S, hq, dv, generator=g, dtype=torch.float64)
    o, lse = K.index_forward(q, k, k[..., :dv], idx[:, 0], 0.5)
    qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
    ref = dense_attention(qq, kk, kk[..., :dv], topk_matrix(idx), 0.5)
    assert torch.allclose(o, ref, atol=1e-12)
    ref.backward(do)
    dq, dk = torch.zeros_like(q), torch.zeros_like(k)
    K.index_backward(q, k, k[..., :dv], do, lse, (do * o).sum(-1), idx[:, 0], 0.5, dq, dk, dk[..., :dv])
    assert torch.allclose(dq, qq.grad, atol=1e-12) and torch.allclose(dk, kk.grad, atol=1e-12)


def test_scatter_merge_with_repeated_rows_equals_merging_one_by_one():
    g = torch.Generator().manual_seed(5)
    M, H, D, n = 6, 3, 4, 10
    acc_o = torch.randn(M, H, D, generator=g)
    acc_l = torch.randn(M, H, generator=g)
    acc_l[0] = float("-inf")
    acc_o[0] = 0
    idx = torch.tensor([0, 1, 1, 3, 3, 3, 5, 0, 2, 1])
    po = torch.randn(n, H, D, generator=g)
    pl = torch.randn(n, H, generator=g)
    pl[2, 1] = float("-inf")
    a_o, a_l = acc_o.clone(), acc_l.clone()
    K.scatter_merge(a_o, a_l, idx, po, pl)
    b_o, b_l = acc_o.clone(), acc_l.clone()
    for i in range(n):
        K.merge_into(b_o[idx[i]], b_l[idx[i]], po[i], pl[i])
    assert torch.allclose(a_o, b_o, atol=1e-6) and torch.allclose(a_l, b_l, atol=1e-6)
    assert torch.isinf(a_l[4]).sum() == 0  # untouched rows keep their values


def test_one_rank_plan_runs_without_torch_distributed():
    m = cpsched.mask_from_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "quickstart.yaml"),
                                 {"problem.cp_size": 1, "problem.seqlen_per_rank": 300})
    r = cpsched.Session(cp_size=1, seqlen=m.seqlen, heads=(4, 2, 16, "fp32"), cost_model="area").solve(
        m.q_ranges, m.k_ranges, m.types)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(m.seqlen, 4, 16, generator=g, requires_grad=True)
    k = torch.randn(m.seqlen, 2, 16, generator=g, requires_grad=True)
    v = torch.randn(m.seqlen, 2, 16, generator=g, requires_grad=True)
    out = cpt.attention(q, k, v, r)
    ref = dense_attention(q, k, v, mask_matrix(m.q_ranges, m.k_ranges, m.types, m.seqlen))
    assert (out - ref).abs().max() < 1e-5
    with pytest.raises(ValueError, match="plan is for P = 4 ranks but torch.distributed is not initialized"):
        r4 = cpsched.Session(cp_size=4, seqlen=m.seqlen, heads=(4, 2, 16, "fp32"), cost_model="area").solve(
            m.q_ranges, m.k_ranges, m.types)
        cpt.attention(q, k, v, r4)


def test_flex_block_masks_are_built_once_per_geometry():
    """FlexAttention's block masks are cached by the args' geometry: the head groups of a flattened plan and
    every later call with the plan reuse them, and the results stay the dense reference's."""
    from cpsched.torch import _backends as B
    m = cpsched.mask_from_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "quickstart.yaml"),
                                 {"problem.cp_size": 1, "problem.seqlen_per_rank": 256})
    r = cpsched.Session(cp_size=1, seqlen=m.seqlen, heads=(8, 4, 16, "fp32"), cost_model="area").solve(
        m.q_ranges, m.k_ranges, m.types)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(m.seqlen, h, 16, generator=g) for h in (8, 4, 4))
    ref = dense_attention(q, k, v, mask_matrix(m.q_ranges, m.k_ranges, m.types, m.seqlen))
    B._FLEX_MASKS.items.clear()
    B._FLEX_MASKS.bytes = 0
    built = []
    real = B._FlexMask.__init__

    def counting(self, *a, **kw):
        built.append(1)
        real(self, *a, **kw)
    B._FlexMask.__init__ = counting
    try:
        outs = [cpt.attention(q, k, v, r, backend="flex") for _ in range(3)]
    finally:
        B._FlexMask.__init__ = real
    for out in outs:
        assert (out - ref).abs().max() < 1e-5
    # 4 head groups x 3 calls of flex batches, one geometry each: built once
    assert len(built) == len(B._FLEX_MASKS.items) == 1, (len(built), len(B._FLEX_MASKS.items))


def test_flex_mask_cache_keeps_its_byte_budget():
    from cpsched.torch import _backends as B
    lru = B._ByteLru(100)
    for i in range(5):
        lru.put(i, str(i), 40)
    assert list(lru.items) == [3, 4] and lru.bytes == 80
    assert lru.get(3) == "3" and list(lru.items) == [4, 3]  # a hit is the newest
    lru.put("big", "b", 500)  # larger than the budget: kept alone
    assert list(lru.items) == ["big"] and lru.get(0) is None


def test_a_call_leaves_none_of_its_tensors_in_the_cached_plan():
    """The plan's reusable buffers hold no reference to a call's inputs, outputs or graph: they are freed as
    soon as the caller drops them (no cycle through the plan), after forward + backward and after a forward
    alone, while the plan stays cached for the next call."""
    import weakref
    r = cpsched.Session(cp_size=1, seqlen=96, heads=(4, 2, 16, "fp32"), cost_model="area").solve(
        [(0, 96)], [(0, 96)], ["causal"])
    tp = cpt.prepare(r, 0)
    for backward in (True, False):
        q, k, v = (torch.randn(96, h, 16, requires_grad=True) for h in (4, 2, 2))
        out = cpt.attention(q, k, v, tp)
        if backward:
            out.sum().backward()
        refs = [weakref.ref(x) for x in (q, k, v, out)]
        del q, k, v, out
        assert all(x() is None for x in refs), [x() is None for x in refs]
    assert cpt.prepare(r, 0) is tp


def test_dispatch_undispatch_and_layout_tags_across_ranks():
    assert get_pool(3).values("layout_case", timeout=60) == [True] * 3


def test_plan_preparation_is_cached_per_result_and_rank():
    r = cpsched.Session(cp_size=2, seqlen=64, heads=(2, 1, 8, "fp32"), cost_model="area").solve(
        [(0, 64)], [(0, 64)], ["causal"])
    assert cpt.prepare(r, 1) is cpt.prepare(r, 1)
    assert cpt.prepare(r, 0) is not cpt.prepare(r, 1)
    with pytest.raises(ValueError, match="prepared for rank 1"):
        cpt.prepare(cpt.prepare(r, 1), 0)


class _Recorder:
    """A Comm and a backend that log the program's order instead of moving or computing anything."""

    def __init__(self):
        self.log = []

    def a2a(self, out, inp, out_splits, in_splits):
        rec = self

        class Work:
            def __init__(self, n):
                self.n = n

            def wait(self):
                rec.log.append(("wait", self.n))
        self.log.append(("issue", len(self.log)))
        return Work(len(self.log) - 1)

    def forward_stage(self, args, b):
        self.log.append(("compute", len(args)))

    backward_stage = forward_stage


def test_each_stage_cast_is_in_flight_while_the_stage_before_computes():
    """Overlap by construction (no timing): cast(1) is issued before stage 0 computes, cast(s + 1) before
    stage s computes, and the first wait for a cast comes after the compute it overlaps."""
    from cpsched.torch._exec import run_backward, run_forward
    m = cpsched.mask_from_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "quickstart.yaml"),
                                 {"problem.cp_size": 4, "problem.seqlen_per_rank": 256, "problem.mask.kind": "causal"})
    r = cpsched.Session(cp_size=4, seqlen=m.seqlen, heads=(4, 2, 16, "fp32"), cost_model="area", stages=3,
                        solver="usp").solve(m.q_ranges, m.k_ranges, m.types)
    tps = cpt.TorchPlan.all_ranks(r)
    checked = 0
    for tp in tps:
        for pass_ in ("fwd", "bwd"):
            rec = _Recorder()
            dp = tp.on("cpu")
            L = tp.rows
            q, k, v = torch.zeros(L, 4, 16), torch.zeros(L, 2, 16), torch.zeros(L, 2, 16)
            if pass_ == "fwd":
                run_forward(dp, q, k, v, rec, rec, 0.25)
            else:
                run_backward(dp, q, k, v, torch.zeros(L, 4, 16), torch.zeros(L, 4), torch.zeros(L, 4, 16), rec,
                             rec, 0.25)
            kinds = [e[0] for e in rec.log]
            computes = [i for i, e in enumerate(kinds) if e == "compute"]
            pp = dp.fwd if pass_ == "fwd" else dp.bwd
            waited = {e[1]: i for i, e in enumerate(rec.log) if e[0] == "wait"}
            for s, st in enumerate(pp.comm):  # stage s + 1's cast overlaps the compute of stage s
                if not (st.qo.active or st.kv.active):
                    continue
                c = computes[s]
                in_flight = [i for i, e in enumerate(rec.log[:c]) if e[0] == "issue" and waited.get(i, -1) > c]
                assert in_flight, (pass_, s, rec.log)
                checked += 1
    assert checked >= 8
