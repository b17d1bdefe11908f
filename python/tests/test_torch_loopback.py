"""cpsched.torch.loopback: the P ranks of a plan as threads of one process, the group's collectives made of
copies. Every correctness case of the gloo suite (test_torch_attention.py) runs here too, in process, against
the same dense reference (in CI all but the P = 2 and 3 repeats of P = 4's mask kinds and solvers:
CPSCHED_TORCH_SLOW=1 runs those as well); and the group's own contract: results in rank order, an exception on one rank fails
the run with that rank's error, ranks that do not meet in their collectives stop instead of hanging."""
import os
import threading
import time

import pytest

torch = pytest.importorskip("torch")

import torch_cases as tc  # noqa: E402
from cpsched.torch import loopback  # noqa: E402
from test_torch_attention import BF16_TOL, CASES, FP32_TOL, REMAP, _id  # noqa: E402


def check(P, spec, tol=FP32_TOL, device="cpu"):
    spec = dict(spec, device=device) if device != "cpu" else spec
    res = loopback.run(lambda r, g: tc.attn_case(r, P, spec, g), P, timeout=120)
    return res[0], tc.check_results(res, spec, P, tol)


# CI time (docs/torch.md, "What the tests cover"): CI runs the gloo cases at P = 4 and those at P = 2 and 3 that
# add something of their own (a backend, strides, a tail, MLA without a shared latent, unflattened groups);
# CPSCHED_TORCH_SLOW=1 runs every one (P = 2 and 3 repeat the mask kinds and solvers of P = 4).
SLOW = os.environ.get("CPSCHED_TORCH_SLOW") == "1"


def _in_ci(P, spec):
    heads = spec.get("heads") or {}
    return P == 4 or any(spec.get(k) for k in ("backend", "noncontig", "expect_tail")) or \
        spec.get("flatten") is False or ("dim_v" in heads and not heads.get("kv_shared"))


LOOPBACK_CASES = [pytest.param(P, spec, id=_id((P, spec)),
                               marks=() if _in_ci(P, spec) else pytest.mark.skipif(
                                   not SLOW, reason="a repeat at P = 2 or 3: CPSCHED_TORCH_SLOW=1 runs it"))
                  for P, spec in CASES]


@pytest.mark.parametrize("P,spec", LOOPBACK_CASES)
def test_loopback_matches_dense_reference_fp32(P, spec):
    tc.check_expected_plan(check, P, spec)


@pytest.mark.parametrize("P", [2, 3, 4])
def test_loopback_matches_dense_reference_bf16(P):
    spec = {"mask": ["causal_document", "sliding_window", "share_question"][P % 3], "dtype": "bf16",
            "stages": 2, "relay": 2 if P == 4 else 0, "solver": "static" if P == 4 else "balanced_bytes"}
    _, errs = check(P, spec, BF16_TOL)
    assert all(e > 0 for e in errs.values())


@pytest.mark.parametrize("P,spec", REMAP, ids=["P3-mla-shared", "P4-two-selections-relay"])
def test_loopback_device_remap_of_topk_rows(P, spec):
    counts = loopback.run(lambda r, g: _remap(r, P, spec, g), P, timeout=120)
    assert all(c > 0 for c in counts), counts


def _remap(rank, P, spec, group):
    import cpsched
    import cpsched.torch as cpt
    idx = torch.from_numpy(tc.topk_indices(spec, P))
    lo, hi = (int(x) for x in cpsched._cpsched.sharding_ranges(idx.shape[0], P)[rank])
    tp = cpt.ingest_topk(idx[lo:hi], tc.session(spec, P), group, remap="plan")
    pools = cpt.remap_topk(tp, idx, "cpu")
    n = 0
    for pp, pool in ((tp.fwd, pools[0]), (tp.bwd, pools[1])):
        for args in [pp.stage0] + pp.stages:
            for a in args:
                if a.index_width > 0:
                    m = (a.q1 - a.q0) * a.index_width
                    want = pp.indices[a.index_offset:a.index_offset + m].view(a.q1 - a.q0, -1).sort(1).values
                    got = pool[a.index_offset:a.index_offset + m].view(a.q1 - a.q0, -1).sort(1).values
                    assert torch.equal(want, got)
                    n += 1
    return n


# ---- the group's contract ------------------------------------------------------------------------------


def test_results_in_rank_order_and_collectives():
    def fn(rank, g, base):
        assert g.rank() == rank and g.size() == 4
        t = torch.full((2, 3), float(rank))
        parts = [torch.empty(2, 3) for _ in range(4)]
        g.all_gather(parts, t)
        objs = [None] * 4
        g.all_gather_object(objs, {"r": rank})
        box = [f"from {rank}"]
        g.broadcast_object_list(box, src=2)
        s = torch.tensor([rank + 1.0])
        g.all_reduce(s)
        b = torch.tensor([rank * 10.0])
        g.broadcast(b, src=3)
        # all_to_all_single with uneven splits: rank r sends p + 1 rows to p, each holding (r, p)
        ins = [p + 1 for p in range(4)]
        inp = torch.cat([torch.tensor([[rank, p]] * (p + 1), dtype=torch.float32) for p in range(4)])
        out = torch.empty(4 * (rank + 1), 2)
        w = g.all_to_all_single(out, inp, [rank + 1] * 4, ins, async_op=True)
        w.wait()
        g.barrier()
        return base + rank, [float(x[0, 0]) for x in parts], [o["r"] for o in objs], box[0], float(s), float(b), \
            out.tolist()

    res = loopback.run(fn, 4, 100)
    for r, (v, gathered, objs, box, s, b, out) in enumerate(res):
        assert v == 100 + r
        assert gathered == [0.0, 1.0, 2.0, 3.0] and objs == [0, 1, 2, 3]
        assert box == "from 2" and s == 10.0 and b == 30.0
        assert out == [[p, r] for p in range(4) for _ in range(r + 1)]


def test_an_exception_fails_the_run_with_that_ranks_error():
    def fn(rank, g):
        if rank == 2:
            raise ValueError("rank two is broken")
        parts = [torch.empty(1) for _ in range(3)]
        g.all_gather(parts, torch.zeros(1))  # the others wait here: they must stop, not hang
        return rank

    t0 = time.monotonic()
    with pytest.raises(ValueError, match="rank two is broken") as ei:
        loopback.run(fn, 3, timeout=60)
    assert time.monotonic() - t0 < 30
    assert any("rank 2" in n for n in getattr(ei.value, "__notes__", ["rank 2"]))


def test_ranks_that_do_not_meet_stop_with_a_loopback_error():
    def early(rank, g):  # rank 0 returns while the others wait in a barrier
        if rank:
            g.barrier()
        return rank

    with pytest.raises(loopback.LoopbackError, match=r"rank 0 returned .* collective #0 \(barrier\)|"
                                                     r"after rank\(s\) \[0\] returned"):
        loopback.run(early, 3, timeout=60)

    def different(rank, g):
        if rank == 1:
            g.barrier()
        else:
            g.all_gather_object([None] * 2, rank)

    with pytest.raises(loopback.LoopbackError, match="different collectives as collective #0"):
        loopback.run(different, 2, timeout=60)

    def splits(rank, g):
        out = torch.empty(3 if rank == 0 else 2, 1)
        g.all_to_all_single(out, torch.zeros(2, 1), [2, 1] if rank == 0 else [1, 1], [1, 1])

    with pytest.raises(loopback.LoopbackError, match="rank 0 expects 2 rows from rank 0, which sends it 1"):
        loopback.run(splits, 2, timeout=60)


def test_a_timeout_bounds_every_wait():
    release = threading.Event()

    def slow(rank, g):
        if rank == 1:
            release.wait(1.5)  # late, but not forever: rank 0 stops waiting at its timeout, 0.5 s
        g.barrier()

    t0 = time.monotonic()
    with pytest.raises(loopback.LoopbackError, match=r"rank 0 waited 0.5 s in collective #0 \(barrier\); ranks \[1\]"):
        loopback.run(slow, 2, timeout=0.5)
    release.set()
    assert time.monotonic() - t0 < 5


def test_a_bad_call_raises_on_every_rank_through_the_agreement():
    """One rank's wrong shape: every rank raises (the agreement runs on the loopback group), none waits."""
    def fn(rank, g):
        import cpsched.torch as cpt
        spec = {"mask": "causal_document"}
        tp, _ = tc.solve(spec, 3, rank, g)
        q, k, v, _ = tc.global_inputs(spec, tp.seqlen)
        ql, kl, vl = (cpt.dispatch(x, tp, g) for x in (q, k, v))
        if rank == 1:
            ql = ql[:, :, :-1]
        try:
            cpt.attention(ql, kl, vl, tp, g)
        except ValueError as e:
            return str(e)
        return None

    res = loopback.run(fn, 3, timeout=60)
    assert "q: expected shape" in res[1]
    assert all(r is not None and "rank(s) [1]" in r for i, r in enumerate(res) if i != 1), res


def test_each_rank_has_its_own_workspace_and_it_is_released():
    import cpsched.torch as cpt
    before = cpt.workspace_bytes("cpu")

    def fn(rank, g):
        spec = {"mask": "causal_document", "stages": 2}
        out = tc.attn_case(rank, 2, spec, g)
        return cpt.workspace_bytes("cpu"), out

    res = loopback.run(fn, 2, timeout=60)
    assert all(b > before for b, _ in res)  # each rank's arena existed during the run
    assert cpt.workspace_bytes("cpu") == before  # and is released with it
