"""cpsched.torch.remap_topk (ingest_topk's default: gather="indices", remap="device") for any grid: on random
token top-k masks (blocks per rank 1-3, grids the solver chose itself, padded -1 rows, rows of uneven widths,
one or two selection heads) the pools it computes on the device equal, row by row, the pools the C++ plan
builder writes, on every rank. In process: each rank's TorchPlan of one plan."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cpsched  # noqa: E402
import cpsched.torch as cpt  # noqa: E402


def random_rows(rng, S, H, k, pad_tail, causal=True):
    idx = np.full((S, H, k), -1, dtype=np.int64)
    for q in range(S - pad_tail):
        for h in range(H):
            hi = q + 1 if causal else S
            n = int(rng.integers(0, min(k, hi) + 1))  # uneven: 0 to k keys
            keys = np.sort(rng.choice(hi, n, replace=False))
            slots = np.sort(rng.choice(k, n, replace=False))  # -1 padding anywhere in the row
            idx[q, h, slots] = keys
    return idx


def compare(tp, full):
    pools = cpt.remap_topk(tp, torch.from_numpy(full), "cpu")
    n = 0
    for pp, pool in ((tp.fwd, pools[0]), (tp.bwd, pools[1])):
        for args in [pp.stage0] + pp.stages:
            for a in args:
                if a.index_width <= 0:
                    continue
                m = (a.q1 - a.q0) * a.index_width
                want = pp.indices[a.index_offset:a.index_offset + m].view(a.q1 - a.q0, -1).sort(1).values
                got = pool[a.index_offset:a.index_offset + m].view(a.q1 - a.q0, -1).sort(1).values
                assert torch.equal(want, got), (tp.rank, a)
                n += 1
    return n


CASES = [(P, bpr, pad, H, seed) for seed, (P, bpr, pad, H) in enumerate(
    [(3, 1, 0, 1), (3, 2, 0, 1), (3, 3, 0, 1), (3, 1, 16, 1), (4, 1, 84, 1), (2, 2, 9, 2), (4, 2, 0, 2),
     (3, 1, 40, 2), (2, 1, 0, 1), (4, 3, 30, 1)])]


@pytest.mark.parametrize("P,bpr,pad,H,seed", CASES)
def test_device_remap_equals_the_plan_builders_pool_on_any_grid(P, bpr, pad, H, seed):
    rng = np.random.default_rng(seed)
    S = 96 if P != 4 else 128
    full = random_rows(rng, S, H, 8, pad)
    s = cpsched.Session(cp_size=P, seqlen=S, heads=(4, 2, 16, "fp32"), blocks_per_rank=bpr)
    r = s.solve_topk(full.astype(np.int32))
    n = sum(compare(cpt.TorchPlan(r, rank), full) for rank in range(P))
    assert n > 0


def test_the_grids_of_the_issue_remap():
    """The issue's reproduction: blocks_per_rank = 2, and the default solver's re-grid of padded rows."""
    rng = np.random.default_rng(0)
    full = np.full((96, 1, 8), -1, dtype=np.int64)
    for q in range(96):  # min(8, q + 1) keys per row, as the issue's reproduction
        n = min(8, q + 1)
        full[q, 0, :n] = np.sort(rng.choice(q + 1, n, replace=False))
    for kw, pad in (({"blocks_per_rank": 2}, 0), ({}, 16)):
        f = full.copy()
        if pad:
            f[-pad:] = -1
        r = cpsched.Session(cp_size=3, seqlen=96, heads=(4, 1, 16, "fp32"), **kw).solve_topk(f.astype(np.int32))
        tps = [cpt.TorchPlan(r, rank) for rank in range(3)]
        assert max(tp.blocks_per_rank for tp in tps) > 1  # the grid is finer than the shards
        assert sum(compare(tp, f) for tp in tps) > 0
