"""The Triton index kernels (token top-k args, forward and backward) under Triton's interpreter on CPU tensors
(TRITON_INTERPRET=1), against the torch gather kernel: GQA and MLA's shared latent, dims that are not powers
of two, strided views as the executor passes them, padded (-1) selections and rows without any key, several
head tiles per KV head; and whole DSA plans on loopback ranks with backend='triton' against the dense
reference. On a GPU the same kernels run compiled (test_torch_cuda.py).

Triton's interpreter must be chosen before triton is first imported (its standard library is jitted at
import), so this module sets TRITON_INTERPRET=1 when it is imported, if nothing imported triton yet and there
is no CUDA device (with one, the compiled kernels are what runs, and the interpreter would slow every Triton
kernel of the session); otherwise it skips."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the interpreter tests need TRITON_INTERPRET=1 before triton is imported (and no CUDA device): "
                "run TRITON_INTERPRET=1 pytest python/tests/test_torch_triton.py", allow_module_level=True)
pytest.importorskip("triton")

import torch_cases as tc  # noqa: E402
from cpsched.torch import _kernels as K  # noqa: E402
from cpsched.torch import _triton as T  # noqa: E402
from cpsched.torch import loopback  # noqa: E402
from cpsched.torch._backends import make_backend  # noqa: E402


CASES = [  # (lq, hq, hk, dqk, dv, shared, w, Lk, dtype, block_h)
    (20, 8, 2, 32, 32, False, 19, 40, torch.float32, None),   # GQA, w not a multiple of BLOCK_N
    (16, 4, 1, 48, 32, True, 24, 30, torch.float32, None),    # MLA latent: chunk A (also V) 32, chunk B 16
    (12, 16, 1, 40, 24, True, 37, 50, torch.bfloat16, None),  # dims that are not powers of two, bf16
    (10, 32, 1, 24, 24, False, 21, 25, torch.float32, 16),    # two head tiles per KV head
]


def _data(lq, hq, hk, dqk, dv, shared, w, Lk, dt, g, view):
    if view:  # as the executor passes local rows: a head slice of the rank's tensors, k buffer of one group
        q = torch.randn(lq, 2 * hq, dqk, generator=g).to(dt)[:, hq:]
        kfull = torch.randn(Lk, 2 * hk, dqk, generator=g).to(dt)
        kb = kfull[:, hk:]
    else:
        q = torch.randn(lq, hq, dqk, generator=g).to(dt)
        kb = torch.randn(Lk, hk, dqk, generator=g).to(dt)
    vb = kb[..., :dv] if shared else torch.randn(Lk, hk, dv, generator=g).to(dt)
    idx = torch.randint(-1, Lk, (lq, w), generator=g)
    idx[2] = -1  # a row without any key
    idx[3, : w // 2] = -1
    return q, kb, vb, idx


@pytest.mark.parametrize("view", [False, True], ids=["contiguous", "views"])
@pytest.mark.parametrize("case", CASES, ids=["gqa", "mla-shared", "odd-dims-bf16", "two-head-tiles"])
def test_triton_index_kernels_equal_the_torch_gather_kernel(case, view):
    lq, hq, hk, dqk, dv, shared, w, Lk, dt, bh = case
    g = torch.Generator().manual_seed(lq + hq)
    q, kb, vb, idx = _data(lq, hq, hk, dqk, dv, shared, w, Lk, dt, g, view)
    o, lse = T.index_forward(q, kb, vb, idx, 0.3, block_h=bh)
    o2, lse2 = K.index_forward(q, kb, vb, idx, 0.3)
    assert torch.isinf(lse[2]).all() and (lse[2] < 0).all() and (o[2] == 0).all()
    assert torch.equal(torch.isinf(lse), torch.isinf(lse2))
    assert (o - o2).abs().max() <= 1e-5 and (lse - lse2).nan_to_num(0, 0, 0).abs().max() <= 1e-5
    do = torch.randn(lq, hq, dv, generator=g).to(dt)
    delta = (do.float() * o2).sum(-1)
    grads = []
    for kern in (T.index_backward, K.index_backward):
        dq = torch.randn(lq, hq, dqk, generator=torch.Generator().manual_seed(1))  # the kernels add into it
        dk = torch.zeros(Lk, hk, dqk)
        dvb = dk[..., :dv] if shared else torch.zeros(Lk, hk, dv)
        if kern is T.index_backward:
            kern(q, kb, vb, do, lse2, delta, idx, 0.3, dq, dk, dvb, block_h=bh)
        else:
            kern(q, kb, vb, do, lse2, delta, idx, 0.3, dq, dk, dvb)
        grads.append((dq, dk, dvb))
    for name, a, b in zip(("dq", "dk", "dv"), *grads):
        assert (a - b).abs().max() <= 2e-5 * max(1.0, float(b.abs().max())), name


def test_triton_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    spec = {"mask": "causal_document"}
    tp, _ = tc.solve(spec, 1, 0)
    with pytest.raises(ValueError, match=r"backend='triton': the Triton kernels run on CUDA tensors \(on CPU "
                                         r"tensors only under TRITON_INTERPRET=1\)"):
        make_backend("triton", torch.device("cpu"), torch.float32, tp)


PLANS = [
    (3, {"mask": "topk", "heads": {"q": 4, "kv": 1, "dim": 48, "dim_v": 32, "kv_shared": True}, "spr": 64,
         "topk": 12, "stages": 2, "module": True, "backend": "triton"}),
    (2, {"mask": "topk", "heads": {"q": 4, "kv": 2, "dim": 16}, "spr": 48, "topk": 10, "sel_heads": 2,
         "stages": 2, "module": True, "summaries": True, "backend": "triton"}),
]


# The interpreter runs every program in Python: the P = 3 plan is too slow for every CI run
# (docs/bounds.md#measurements-behind-code-constants), so CI runs the P = 2 one (the MLA latent is in the kernel
# cases above) and CPSCHED_TORCH_SLOW=1 both.
SLOW = os.environ.get("CPSCHED_TORCH_SLOW") == "1"
PLAN_PARAMS = [pytest.param(*PLANS[0], id="P3-mla-shared", marks=pytest.mark.skipif(
                   not SLOW, reason="slow under the interpreter: CPSCHED_TORCH_SLOW=1 runs it")),
               pytest.param(*PLANS[1], id="P2-two-selections-summaries")]


@pytest.mark.parametrize("P,spec", PLAN_PARAMS)
def test_dsa_plans_on_triton_match_the_dense_reference(P, spec):
    before = dict(T.LAUNCHES)
    res = loopback.run(lambda r, g: tc.attn_case(r, P, spec, g), P, timeout=300)
    assert T.LAUNCHES["fwd"] > before["fwd"] and T.LAUNCHES["bwd"] > before["bwd"]  # the index args ran on Triton
    ref = tc.reference(spec, P, res[0]["plan"])
    for key in ("out", "dq", "dk", "dv"):
        if ref[key] is not None:
            assert tc.rel_err(tc.assemble(res, key), ref[key]) <= 1e-5, key
