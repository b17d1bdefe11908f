"""cpsched.torch on CUDA tensors (skipped without a CUDA device): forward and backward (out, dq, dk, dv) of a
one-rank plan through each kernel backend, against the dense fp64 reference on the CPU. One rank needs no
process group, so this runs on a single GPU; the collectives themselves are covered by the gloo tests (the
same executor code) and, on clusters, by NCCL."""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cpsched.torch as cpt  # noqa: E402
import torch_cases as tc  # noqa: E402
from cpsched.torch._backends import flash_available, flex_available  # noqa: E402

FP32_TOL = 1e-4  # GPU fp32 kernels reduce in another order than the CPU's; still far below any real error
BF16_TOL = 2e-2  # bf16 inputs and kernels' own rounding (the CPU bf16 tests measure 2-4e-3 at 1e-2)

# 'auto' picks flash where flash-attn is installed, else flex: both are listed by name
BACKENDS = ["torch"] + (["flex"] if flex_available() else []) + (["flash"] if flash_available() else [])
RANGE_MASKS = ["causal_document", "full_document", "sliding_window", "prefix_lm", "share_question"]


def run(spec, tol):
    spec = dict(spec, device="cuda")
    res = tc.attn_case(rank=0, P=1, spec=spec)
    ref = tc.reference(spec, 1, res["plan"])
    errs = {}
    for key in ("out", "dq", "dk", "dv"):
        got = tc.assemble([res], key)
        if ref[key] is None:
            assert got is None
            continue
        errs[key] = tc.rel_err(got, ref[key])
    assert max(errs.values()) <= tol, (spec, errs)
    return errs


CASES = []
for backend in BACKENDS:
    for i, mask in enumerate(RANGE_MASKS):
        if backend == "flash":  # flash-attn takes half precision only
            continue
        CASES.append(({"mask": mask, "backend": backend, "stages": [1, 2][i % 2]}, FP32_TOL))
    CASES.append(({"mask": "causal_document", "backend": backend, "dtype": "bf16",
                   "heads": {"q": 8, "kv": 2, "dim": 128}, "spr": 2048}, BF16_TOL))
    CASES.append(({"mask": "sliding_window", "backend": backend, "dtype": "bf16", "heads": {"q": 8, "kv": 2, "dim": 64},
                   "spr": 1536, "stages": 2}, BF16_TOL))
# FlexAttention through torch.compile (its fused kernels): one fp32 and one bf16 case, compiles are slow
if flex_available():
    CASES.append(({"mask": "causal_document", "backend": "flex_compiled", "stages": 2}, FP32_TOL))
    CASES.append(({"mask": "share_question", "backend": "flex_compiled", "dtype": "bf16",
                   "heads": {"q": 8, "kv": 2, "dim": 128}, "spr": 2048}, BF16_TOL))
# index masks: a token top-k through the module (the rows are remapped on the device) and an NSA block top-k
CASES.append(({"mask": "topk", "heads": {"q": 4, "kv": 1, "dim": 48, "dim_v": 32, "kv_shared": True}, "spr": 256,
               "topk": 12, "module": True}, FP32_TOL))
CASES.append(({"mask": "topk", "heads": {"q": 4, "kv": 2, "dim": 16}, "spr": 256, "topk": 10, "sel_heads": 2,
               "module": True, "summaries": True}, FP32_TOL))
CASES.append(({"mask": "block_topk", "heads": {"q": 8, "kv": 4, "dim": 16}, "spr": 512, "stages": 2}, FP32_TOL))
CASES.append(({"mask": "block_topk", "heads": {"q": 8, "kv": 4, "dim": 64}, "spr": 512, "dtype": "bf16",
               "backend": "flex" if flex_available() else "torch"}, BF16_TOL))


def _id(case):
    s, _ = case
    return "-".join(str(x) for x in (s["mask"], s.get("backend", "auto"), s.get("dtype", "fp32"),
                                       f"st{s.get('stages', 1)}", "module" if s.get("module") else ""))


@pytest.mark.parametrize("spec,tol", CASES, ids=[_id(c) for c in CASES])
def test_cuda_matches_dense_reference(spec, tol):
    errs = run(spec, tol)
    if spec.get("dtype") == "bf16":
        assert all(e > 0 for e in errs.values())  # bf16 really ran


def test_cuda_outputs_stay_on_the_device():
    spec = {"mask": "causal_document", "device": "cuda"}
    tp, _ = tc.solve(spec, 1, 0)
    q, k, v, _ = (x.cuda() for x in tc.global_inputs(spec, tp.seqlen))
    q.requires_grad_()
    out = cpt.attention(q, k, v, tp)
    assert out.device.type == "cuda" and out.dtype == q.dtype
    out.sum().backward()
    assert q.grad is not None and q.grad.device.type == "cuda"


def test_cuda_inputs_on_two_devices_are_refused():
    spec = {"mask": "causal_document"}
    tp, _ = tc.solve(spec, 1, 0)
    q, k, v, _ = tc.global_inputs(spec, tp.seqlen)
    with pytest.raises(ValueError, match=r"k: on device cpu, q on cuda:0"):
        cpt.attention(q.cuda(), k, v.cuda(), tp)
