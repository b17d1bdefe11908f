"""cpsched.torch.integrations without transformers, in one process (P = 1): ContextParallel in a plain module
(each kind of mask against the dense reference, forward and gradients; solves per distinct mask), and the
errors of its arguments and of the mesh helpers. The transformers and distributed cases are in
test_torch_hf*.py."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cpsched.torch.integrations import ContextParallel, document_mask, resolve_group  # noqa: E402
from cpsched.torch.integrations.mesh import make_mesh  # noqa: E402
from cpsched.torch.reference import dense_attention, mask_matrix  # noqa: E402

torch.set_num_threads(1)
LENGTHS = [9, 1, 20, 14]  # S = 44


def _positions(lengths):
    return torch.cat([torch.arange(n) for n in lengths])


def _qkv(S, seed, hq=4, hkv=2, d=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(S, h, d, generator=g, dtype=torch.float64).requires_grad_() for h in (hq, hkv, hkv)]


@pytest.mark.parametrize("window, causal", [(None, True), (6, True), (1, True), (None, False)])
def test_plain_module_attention_equals_the_dense_reference(window, causal):
    S = sum(LENGTHS)
    cp = ContextParallel()
    cp.set_batch(_positions(LENGTHS))
    q, k, v = _qkv(S, 0)
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    out = cp.attention(qf, kf, vf, window=window, causal=causal)
    bounds = np.concatenate([[0], np.cumsum(LENGTHS)])
    mask = mask_matrix(*document_mask(bounds, window, causal), S)
    ref = dense_attention(q, k, v, mask)
    assert (out.double() - ref).abs().max().item() < 1e-5
    g = torch.Generator().manual_seed(1)
    dout = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    ref.backward(dout)
    out.backward(dout.float())
    for a, b in ((qf, q), (kf, k), (vf, v)):
        assert (a.grad.double() - b.grad).abs().max().item() < 1e-5


def test_one_solve_per_distinct_mask_and_step():
    cp = ContextParallel()
    q, k, v = (x.detach().float() for x in _qkv(sum(LENGTHS), 2))
    for step in range(2):
        cp.set_batch(_positions(LENGTHS if step == 0 else LENGTHS[::-1]))
        for _ in range(3):  # three layers of each kind
            cp.attention(q, k, v)
            cp.attention(q, k, v, window=6)
        # a window longer than every document is the causal mask: its plan, no solve
        cp.attention(q, k, v, window=max(LENGTHS))
    assert cp.stats["solves"] == 4 and cp.stats["calls"] == 14 and cp.stats["step_hits"] == 10, cp.stats
    cp.set_batch(_positions(LENGTHS))  # the first step's batch again: from the cache across steps
    cp.attention(q, k, v)
    assert cp.stats["solves"] == 4 and cp.stats["cache_hits"] == 1, cp.stats


def test_errors_name_the_argument():
    cp = ContextParallel()
    q, k, v = (x.detach().float() for x in _qkv(sum(LENGTHS), 3))
    with pytest.raises(ValueError, match="no batch for this step"):
        cp.attention(q, k, v)
    cp.set_batch(cu_seqlens=[0, 9, 10, 30, 44])
    with pytest.raises(ValueError, match="window: a sliding window is a number of keys >= 1, got 0"):
        cp.attention(q, k, v, window=0)
    with pytest.raises(ValueError, match="window: a sliding window over a bidirectional"):
        cp.attention(q, k, v, window=4, causal=False)
    with pytest.raises(ValueError, match=r"q: expected a tensor \[tokens, heads, dim\]"):
        cp.attention(q[None], k, v)
    with pytest.raises(ValueError, match="position_ids: the model got shape"):
        cp.attention(q, k, v, position_ids=torch.arange(10))
    with pytest.raises(ValueError, match="not this rank's rows"):
        cp.attention(q, k, v, position_ids=torch.arange(44))
    with pytest.raises(ValueError, match="set_batch: give position_ids"):
        cp.set_batch()
    with pytest.raises(ValueError, match="seqlen: ContextParallel sets"):
        ContextParallel(seqlen=64)
    with pytest.raises(ValueError, match="group: torch.distributed is not initialized"):
        ContextParallel(object())
    with pytest.raises(ValueError, match="group: give a group or a mesh, not both"):
        resolve_group(object(), mesh=object())
    with pytest.raises(ValueError, match="dp: expected a positive integer, got 0"):
        make_mesh(0, 2)
    with pytest.raises(ValueError, match="cp: expected a positive integer, got True"):
        make_mesh(2, True)
