"""The agreement (docs/torch.md, "Errors"): ranks that are about to run different things, or where one rank
alone rejects its inputs, all raise the same ValueError before any collective, naming the ranks and what
differs; each case runs in a pool of gloo processes under a fixed timeout, so a hang fails the test."""
import re

import pytest

torch = pytest.importorskip("torch")

from torch_pool import get_pool  # noqa: E402

P = 3


def outcomes(what, **kw):
    return get_pool(P).values("agree_case", timeout=60, what=what, **kw)


def all_raise(what, pattern, own=None, bad_rank=1):
    """Every rank raises; every rank's text matches `pattern`, or the bad rank's matches `own` and the others
    say that it rejected its inputs."""
    out = outcomes(what, bad_rank=bad_rank)
    for r, (kind, msg) in enumerate(out):
        assert kind == "error", (what, r, msg)
        if own is not None and r == bad_rank:
            assert re.search(own, msg), (what, r, msg)
        elif own is not None:
            assert re.search(rf"rank\(s\) \[{bad_rank}\] of the group rejected their inputs", msg), (what, r, msg)
        else:
            assert re.search(pattern, msg), (what, r, msg)
    if own is None:
        assert len({m for _, m in out}) == 1, out  # the same text on every rank
    return out


DIFFER = {
    "mask_same_splits": r"plan \(another mask, solver, Session or plan text\): rank 1 #\w+, ranks \[0, 2\] #\w+",
    "dtype_same_size": r"dtype: rank 1 torch.float16, ranks \[0, 2\] torch.bfloat16",
    "requires_grad_one_rank": r"a backward follows \(inputs that require grad\): rank 1 True, ranks \[0, 2\] False",
    "undispatch_dtype": r"dtype: rank 1 torch.float64, ranks \[0, 2\] torch.float32",
    "undispatch_width": r"the other dims: rank 1 \(6,\), ranks \[0, 2\] \(3,\)",
    "different_calls": r"in different calls.*rank 1 undispatch, ranks \[0, 2\] attention",
    "ingest_heads_mix": r"indices selection heads \(H_kv\): rank 1 2, ranks \[0, 2\] 1",
    "ingest_seqlen_mix": r"session seqlen \(S\): rank 1 99, ranks \[0, 2\] 96",
}


@pytest.mark.parametrize("what", sorted(DIFFER))
def test_ranks_that_would_run_different_things_all_raise_naming_how(what):
    all_raise(what, DIFFER[what])
    assert outcomes("mask_same_splits", bad_rank=-1) == [("ok", pytest.approx(0, abs=1e-5))] * P  # pool alive


ONE_RANK = {
    "invalid_mask": r"mask slice 0: q range \[0, 101\) is outside the sequence \[0, 96\)",
    "scale_complex": r"softmax_scale: expected a finite real number, got 1j",
    "scale_nan": r"softmax_scale: expected a finite real number, got nan",
    "scale_bool": r"softmax_scale: expected a finite real number, got True",
    "undispatch_rows": r"undispatch: rank 1 hosts \d+ tokens of the plan's layout",
    "check_peers_str": r"check_peers: expected True, False or None, got 'no'",
    "return_lse_str": r"return_lse: expected True or False, got 'no'",
}


@pytest.mark.parametrize("what", sorted(ONE_RANK))
def test_an_error_of_one_rank_makes_every_rank_raise(what):
    all_raise(what, None, own=ONE_RANK[what])


def test_every_process_with_session_rank_0_raises_on_every_rank():
    out = outcomes("session_rank_0", bad_rank=-1)
    for r in (1, 2):
        assert out[r][0] == "error" and "builds rank 0's plan only" in out[r][1], out[r]
    assert out[0][0] == "error" and "rank(s) [1, 2] of the group rejected their inputs" in out[0][1], out[0]


def test_a_rank_plan_text_loaded_by_every_rank_makes_every_rank_raise_when_used():
    out = outcomes("rank_plan_text_everywhere", bad_rank=-1)
    for r in (0, 2):
        assert out[r][0] == "error" and "the text holds the plan of rank 1 only" in out[r][1], out[r]
    assert out[1][0] == "error" and "rank(s) [0, 2] of the group rejected their inputs" in out[1][1], out[1]


@pytest.mark.parametrize("what", ["ingest_mixed_dtype", "ingest_uneven_k"])
def test_indices_of_another_dtype_or_width_on_one_rank_are_gathered_alike(what):
    for kind, e in outcomes(what):
        assert kind == "ok" and e < 1e-5, (what, kind, e)


@pytest.mark.parametrize("what", ["rank_plan_relays", "rank_plan_relays_unchecked"])
def test_rank_plans_with_relays_run_with_and_without_the_agreement(what):
    out = get_pool(4).values("agree_case", timeout=90, what=what)
    for kind, e in out:
        assert kind == "ok" and e < 1e-5, (what, kind, e)


def test_create_graph_gives_first_order_gradients_on_every_rank_and_refuses_a_second():
    for kind, (e, second) in outcomes("create_graph", bad_rank=-1):
        assert kind == "ok" and e < 1e-5, e
        assert "differentiable once" in second, second
