"""Bad input to cpsched.torch.attention raises a ValueError naming what is wrong on every rank, before any
collective, so that no rank waits in one (each call has a fixed timeout: a hang fails the test)."""
import pytest

torch = pytest.importorskip("torch")

from torch_pool import get_pool  # noqa: E402

P = 3

EXPECT = {
    "shape": r"q: expected shape \(\d+, 4, 16\)",
    "heads": r"k: expected shape \(\d+, 2, 16\)",
    "dtype": r"v: dtype torch.float64 differs from q's torch.float32",
    "dtype_bytes": r"8-byte elements, the plan counts 4-byte elements",
    "device": r"v: on device meta, q on cpu",
    "other_P": r"group: the process group has 3 ranks, the plan was made for P = 4",
    "other_S": r"q: the shard is of a sequence of S = 1023 tokens over P = 3 ranks, the plan was made for S = 1071",
    "other_S_plain": r"q: expected shape \(357, 4, 16\).*got \(341, 4, 16\) \(a plan made for another S",
    "group": r"group: the process group has 2 ranks, the plan was made for P = 3",
    "layout_missing": r"layout: the plan's layout is not the sequential one",
    "layout_mixed": r"q: the shard was laid out as <cpsched.torch.Layout sequential",
    "backend": r"backend='flash': flash-attn runs on CUDA tensors",
}


@pytest.mark.parametrize("what", sorted(EXPECT))
def test_every_rank_raises_before_any_collective(what):
    import re
    out = get_pool(P).values("error_case", timeout=60, what=what)
    for r, msg in enumerate(out):
        if what == "group" and r == P - 1:
            continue  # not a member of the 2-rank group
        assert msg is not None, f"rank {r} accepted the bad input ({what})"
        assert re.search(EXPECT[what], msg), (r, msg)
    # the pool still works: nobody is stuck in a collective
    assert get_pool(P).values("error_case", timeout=60, what="none") == [None] * P


@pytest.mark.parametrize("what", ["shape", "dtype"])
def test_one_bad_rank_makes_every_rank_raise(what):
    out = get_pool(P).values("error_case", timeout=60, what=what, only_rank=1, check_peers=True)
    import re
    assert re.search(EXPECT[what], out[1]), out[1]
    for r in (0, 2):
        assert out[r] is not None and "rank(s) [1] of the group rejected their inputs" in out[r], out[r]
    assert get_pool(P).values("error_case", timeout=60, what="none") == [None] * P


def test_a_rank_with_bad_top_k_rows_makes_every_rank_raise_in_the_summary_exchange():
    out = get_pool(P).values("topk_error_case", timeout=60, bad_rank=1)
    assert "(query token" in out[1] and "selects a key after query" in out[1], out[1]
    for r in (0, 2):
        assert out[r] is not None and "rank(s) [1] of the group rejected their top-k rows" in out[r], out[r]
    assert get_pool(P).values("topk_error_case", timeout=60, bad_rank=-1) == [None] * P
