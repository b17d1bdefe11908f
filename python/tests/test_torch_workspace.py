"""cpsched.torch's memory (docs/torch.md, "Memory"): one workspace per device shared by every plan, laid out
in the mode of no call (a first call under inference_mode leaves a plan that trains), bounded across plans;
FlexAttention's block masks built blockwise; and the local refusals: create_graph, float8 backward,
dispatch's rank."""
import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cpsched  # noqa: E402
import cpsched.torch as cpt  # noqa: E402
from cpsched.torch import _workspace as W  # noqa: E402
from cpsched.torch.reference import dense_attention, mask_matrix  # noqa: E402
from torch_pool import get_pool  # noqa: E402


def session(S, **kw):
    kw.setdefault("heads", (4, 2, 16, "fp32"))
    return cpsched.Session(cp_size=1, seqlen=S, **kw)


def docs(S, n, seed):
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, S), n - 1, replace=False))
    b, e = np.concatenate([[0], cuts]), np.concatenate([cuts, [S]])
    r = np.stack([b, e], 1).astype(np.int64)
    return r, r.copy(), "causal"


def test_a_first_call_under_inference_mode_leaves_a_plan_that_trains():
    S = 64
    attn = cpt.DistAttention(session(S))
    q, k, v = torch.randn(S, 4, 16), torch.randn(S, 2, 16), torch.randn(S, 2, 16)
    mask = ([[0, S]], [[0, S]], ["causal"])
    W.release_workspaces()
    with torch.inference_mode():
        o1 = attn(q, k, v, mask)
    ql = q.clone().requires_grad_(True)
    o2 = attn(ql, k, v, mask)
    o2.sum().backward()
    with torch.no_grad():
        o3 = attn(q, k, v, mask)
    assert torch.equal(o1, o2.detach()) and torch.equal(o1, o3) and ql.grad is not None


def test_every_plan_shares_one_workspace_per_device_that_grows_to_the_largest():
    W.release_workspaces()
    gc.collect()
    a = W.arena("cpu")
    sizes = []
    for i, S in enumerate((256, 64, 512, 128)):
        r = session(S).solve(*docs(S, 3, i))
        q, k, v = (torch.randn(S, h, 16, requires_grad=True) for h in (4, 2, 2))
        cpt.attention(q, k, v, r).sum().backward()
        sizes.append(W.workspace_bytes("cpu"))
    assert W.arena("cpu") is a and [x for x in W._ARENAS] == [("cpu", None)]
    assert sizes[0] == sizes[1] and sizes[2] >= sizes[1] and sizes[3] == sizes[2], sizes
    assert len(a.order) <= W.MAX_BOUND


def test_plans_made_per_step_keep_a_bounded_workspace(monkeypatch):
    """Many plans, one call each: the arena keeps MAX_BOUND laid-out programs at most and its bytes stay
    those of the largest pass."""
    W.release_workspaces()
    S = 256
    s = session(S)
    attn = cpt.DistAttention(s, cache_size=4)
    q, k, v = (torch.randn(S, h, 16) for h in (4, 2, 2))
    held = []
    for step in range(24):
        ql = q.clone().requires_grad_(True)
        attn(ql, k, v, docs(S, 5, step)).sum().backward()
        held.append(W.workspace_bytes("cpu"))
        assert len(W.arena("cpu").order) <= W.MAX_BOUND
    assert held[-1] == max(held) and len(set(held[8:])) == 1, held


def test_a_call_inside_a_call_gets_an_arena_of_its_own():
    S = 64
    r = session(S).solve([[0, S]], [[0, S]], ["causal"])
    q, k, v = (torch.randn(S, h, 16) for h in (4, 2, 2))
    ref = cpt.attention(q, k, v, r)
    a = W.arena("cpu")
    a.busy = True  # as during a pass
    try:
        out = cpt.attention(q, k, v, r)
    finally:
        a.busy = False
    assert torch.equal(out, ref)


def test_layers_that_share_a_mask_share_its_plan():
    S = 128
    s = session(S)
    l1, l2 = cpt.DistAttention(s), cpt.DistAttention(s)
    mask = docs(S, 4, 0)
    assert l1.plan(mask) is l2.plan(mask)


def test_flex_block_masks_are_blockwise_and_exact():
    from cpsched.torch._backends import FlexBackend, _FlexMask
    from cpsched.torch._kernels import chunk_mask
    fb = FlexBackend()
    geoms = [([(0, 300, 0, 300, 1)], (300, 300)),
             ([(0, 100, 0, 100, 1), (100, 260, 100, 260, 0), (100, 260, 0, 50, 2), (260, 300, 0, 300, 3)], (300, 300)),
             ([(5, 40, 0, 500, 0), (40, 300, 7, 200, 3)], (300, 500))]
    g = torch.Generator().manual_seed(0)
    for geom, shape in geoms:
        fm = _FlexMask(None, geom, shape, torch.device("cpu"))
        dense = torch.zeros(shape, dtype=torch.bool)
        for q0, q1, k0, k1, t in geom:
            m = chunk_mask(t, 0, q1 - q0, 0, k1 - k0, q1 - q0, k1 - k0, "cpu")
            dense[q0:q1, k0:k1] |= True if m is None else m
        q = torch.randn(shape[0], 2, 16, generator=g)
        k, v = (torch.randn(shape[1], 2, 16, generator=g) for _ in range(2))
        o, lse = fb._call(q, k, v, fm, 0.25)
        sc = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * 0.25
        p = torch.softmax(sc.masked_fill(~dense[None], float("-inf")), -1).nan_to_num(0.0)
        ref = torch.einsum("hqk,khd->qhd", p, v.double())
        assert (o.double() - ref).abs().max() < 1e-5
        assert torch.equal(torch.isinf(lse), ~dense.any(1)[:, None].expand_as(lse))
    # a long causal batch: row spans and block lists only (never rows x columns)
    L = 32768
    fm = _FlexMask(None, [(0, L, 0, L, 1)], (L, L), torch.device("cpu"))
    assert fm.nbytes < 2 * 2**20, fm.nbytes


def test_create_graph_gives_gradients_that_refuse_a_second_differentiation():
    S = 64
    r = session(S).solve([[0, S]], [[0, S]], ["causal"])
    q = torch.randn(S, 4, 16, requires_grad=True)
    k, v = torch.randn(S, 2, 16), torch.randn(S, 2, 16)
    g, = torch.autograd.grad(cpt.attention(q, k, v, r).sum(), q, create_graph=True)
    qq = q.detach().double().requires_grad_()
    ref, = torch.autograd.grad(dense_attention(qq, k.double(), v.double(), mask_matrix([[0, S]], [[0, S]], ["causal"],
                                                                                      S)).sum(), qq)
    assert (g.detach().double() - ref).abs().max() < 1e-5
    with pytest.raises(RuntimeError, match="differentiable once"):
        g.sum().backward()


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no float8 in this torch")
def test_float8_inputs_run_forward_and_refuse_a_backward_before_any_collective():
    S = 64
    r = cpsched.Session(cp_size=1, seqlen=S, heads=(4, 2, 16, "fp8")).solve([[0, S]], [[0, S]], ["causal"])
    q, k, v = (torch.randn(S, h, 16).to(torch.float8_e4m3fn) for h in (4, 2, 2))
    with torch.no_grad():
        out = cpt.attention(q, k, v, r)
    ref = dense_attention(q.double(), k.double(), v.double(), mask_matrix([[0, S]], [[0, S]], ["causal"], S))
    assert (out.double() - ref).abs().max() < 0.2  # float8's own rounding of the output
    with pytest.raises(ValueError, match="runs float8 plans forward only"):
        cpt.attention(q.requires_grad_(), k, v, r)


@pytest.mark.parametrize("rank", [-1, 1, True, 0.0])
def test_dispatch_refuses_a_rank_outside_the_plan(rank):
    S = 64
    r = session(S).solve([[0, S]], [[0, S]], ["causal"])
    with pytest.raises(ValueError, match=r"^rank: "):
        cpt.dispatch(torch.zeros(S, 3), r, rank=rank)


def test_what_two_layers_keep_between_steps_does_not_grow_with_the_plans():
    """Two DistAttention layers, a new document mask each step, P = 2: the tensors cpsched holds after a step
    (its workspace and its cached plans' row indices) are the same after step 3 and step 12, within half of
    one layer's q, k and v (the cached plans' row indices, about 13 KiB a plan here; a workspace per plan, as
    before, added several times q, k and v a step)."""
    out = get_pool(2).values("memory_case", timeout=240, steps=12, spr=256)
    for held, qkv in out:
        assert max(held[2:]) - held[2] <= 0.5 * qkv, (held, qkv)
