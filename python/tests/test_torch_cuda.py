"""cpsched.torch on CUDA tensors (skipped without a CUDA device): forward and backward (out, dq, dk, dv) of a
one-rank plan through each kernel backend (torch, aten: PyTorch's FA2 ops, flash, flex, triton: the index
kernels), against the dense fp64 reference on the CPU; the Triton index kernels compiled against the torch
gather kernel on DSA's shapes; CUDA graphs' replay against eager; and plans of P = 2, 4 and 8 ranks on one GPU
through cpsched.torch.loopback (every kernel real, the collectives device copies) against a dense reference
computed on the GPU."""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cpsched.torch as cpt  # noqa: E402
import torch_cases as tc  # noqa: E402
from cpsched.torch._backends import flash_available, flex_available  # noqa: E402

FP32_TOL = 1e-4  # GPU fp32 kernels reduce in another order than the CPU's; still far below any real error
BF16_TOL = 2e-2  # bf16 inputs and kernels' own rounding (the CPU bf16 tests measure 2-4e-3 at 1e-2)

# 'auto' picks flash where flash-attn is installed, else aten, else torch: each is listed by name
ATEN = torch.backends.cuda.is_flash_attention_available() and torch.cuda.get_device_capability()[0] >= 8
try:
    import triton  # noqa: F401
except ImportError:
    TRITON = False
else:
    TRITON = True
HALF_ONLY = ("flash", "aten")
BACKENDS = ["torch"] + (["flex"] if flex_available() else []) + (["flash"] if flash_available() else []) + \
    (["aten"] if ATEN else [])
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
        if backend in HALF_ONLY:  # FA2 takes half precision only
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
if ATEN:  # every mask kind on PyTorch's FA2 ops (and user slices of inv_causal and bi_causal), bf16
    for i, mask in enumerate(RANGE_MASKS):
        CASES.append(({"mask": mask, "backend": "aten", "dtype": "bf16", "heads": {"q": 16, "kv": 4, "dim": 128},
                       "spr": 2048, "stages": [1, 2][i % 2]}, BF16_TOL))
    CASES.append(({"mask": "custom", "backend": "aten", "dtype": "bf16", "heads": {"q": 8, "kv": 2, "dim": 64},
                   "spr": 1536, "ranges": [(0.0, 0.5, 0.0, 0.3, "causal"), (0.5, 1.0, 0.2, 0.6, "inv_causal"),
                                           (0.1, 0.4, 0.3, 0.9, "bi_causal"), (0.6, 0.9, 0.0, 0.2, "full"),
                                           (0.7, 1.0, 0.6, 1.0, "bi_causal")]}, BF16_TOL))
if TRITON:  # DSA through the module, index args on the Triton kernels (auto picks them on CUDA too)
    for backend in ("triton", "auto"):
        CASES.append(({"mask": "topk", "backend": backend, "dtype": "bf16", "module": True,
                       "heads": {"q": 16, "kv": 1, "dim": 80, "dim_v": 64, "kv_shared": True}, "spr": 1024,
                       "topk": 64}, BF16_TOL))
    CASES.append(({"mask": "topk", "backend": "triton", "module": True, "summaries": True,
                   "heads": {"q": 8, "kv": 2, "dim": 32}, "spr": 512, "topk": 24, "sel_heads": 2}, FP32_TOL))


def _id(case):
    s, _ = case
    return "-".join(str(x) for x in (s["mask"], s.get("backend", "auto"), s.get("dtype", "fp32"),
                                       f"st{s.get('stages', 1)}", "module" if s.get("module") else "",
                                       "summaries" if s.get("summaries") else ""))


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


# ---- the Triton index kernels, compiled, on DSA's shapes ---------------------------------------------------


@pytest.mark.skipif(not TRITON, reason="triton is not installed")
@pytest.mark.parametrize("shape", [(64, 128, 1, 576, 512, True, 512), (48, 32, 4, 128, 128, False, 96)],
                         ids=["dsa-mla-128-heads", "gqa-8-per-kv"])
def test_triton_index_kernels_on_the_gpu(shape):
    from cpsched.torch import _kernels as K, _triton as T
    lq, hq, hk, dqk, dv, shared, w = shape
    Lk = 2048
    g = torch.Generator(device="cuda").manual_seed(3)
    dt = torch.bfloat16
    q = torch.randn(lq, hq, dqk, device="cuda", dtype=dt, generator=g)
    kb = torch.randn(Lk, hk, dqk, device="cuda", dtype=dt, generator=g)
    vb = kb[..., :dv] if shared else torch.randn(Lk, hk, dv, device="cuda", dtype=dt, generator=g)
    idx = torch.randint(-1, Lk, (lq, w), device="cuda", generator=g)
    idx[1] = -1
    o, lse = T.index_forward(q, kb, vb, idx, dqk ** -0.5)
    o2, lse2 = K.index_forward(q, kb, vb, idx, dqk ** -0.5)
    assert torch.isinf(lse[1]).all() and torch.equal(torch.isinf(lse), torch.isinf(lse2))
    assert tc.rel_err(o.double(), o2.double()) <= BF16_TOL
    do = torch.randn(lq, hq, dv, device="cuda", dtype=dt, generator=g)
    delta = (do.float() * o2).sum(-1)
    out = []
    for kern in (T.index_backward, K.index_backward):
        dq = torch.zeros(lq, hq, dqk, device="cuda")
        dk = torch.zeros(Lk, hk, dqk, device="cuda")
        dvb = dk[..., :dv] if shared else torch.zeros(Lk, hk, dv, device="cuda")
        kern(q, kb, vb, do, lse2, delta, idx, dqk ** -0.5, dq, dk, dvb)
        out.append((dq, dk, dvb))
    for a, b in zip(*out):
        assert tc.rel_err(a.double(), b.double()) <= BF16_TOL


# ---- CUDA graphs: replay equals eager ----------------------------------------------------------------------


def _graph_calls(tp, backend, comm, n=4, dt=torch.bfloat16):
    from cpsched.torch import _graphs
    from cpsched.torch._api import _Attention
    dp = tp.on("cuda")
    res = []
    for i in range(n):
        g = torch.Generator(device="cuda").manual_seed(i)
        L = tp.rows
        x = [torch.randn(L, h, d, device="cuda", dtype=dt, generator=g)
             for h, d in ((tp.hq, tp.dqk), (tp.hkv, tp.dqk), (tp.hkv, tp.dv), (tp.hq, tp.dv))]
        pair = []
        for graphs in (True, False):
            q, k, v = (t.clone().requires_grad_() for t in x[:3])
            out, lse = _Attention.apply(q, k, v, dp, backend, comm, tp.dqk ** -0.5, graphs)
            out.backward(x[3])
            pair.append((out.detach(), lse, q.grad, k.grad, v.grad))
        res.append(pair)
    return res, _graphs.state(dp)


@pytest.mark.parametrize("backend", ["torch"] + (["aten"] if ATEN else []) + (["triton"] if TRITON else []))
def test_cuda_graphs_replay_equals_eager(backend):
    from cpsched.torch._backends import make_backend
    spec = {"mask": "causal_document", "stages": 2, "dtype": "bf16", "heads": {"q": 16, "kv": 4, "dim": 128},
            "spr": 2048 if backend != "torch" else 1024}
    if backend == "triton":  # index args (a plan with its pool: nothing written per call)
        spec.update(mask="topk", heads={"q": 16, "kv": 1, "dim": 128}, topk=64)
    tp, _ = tc.solve(spec, 1, 0)

    class NoComm:
        group = None

    be = make_backend(backend, torch.device("cuda"), torch.bfloat16, tp)
    res, states = _graph_calls(tp, be, NoComm())
    assert sorted(s for s, _ in states.values()) == ["graph", "graph"], states
    for i, (got, want) in enumerate(res):
        # equal up to the order of atomic adds (the merges' index_add, FA2's and the index kernels' backward)
        for a, b in zip(got, want):
            assert tc.rel_err(a.double(), b.double()) <= BF16_TOL, i


def test_cuda_graphs_of_a_rank_of_a_p8_plan_with_device_copy_collectives():
    from cpsched.torch._plan import TorchPlan
    spec = {"mask": "causal_document", "stages": 2, "dtype": "bf16", "heads": {"q": 16, "kv": 4, "dim": 128},
            "spr": 1024, "relay": 4, "solver": "static"}
    m = tc.range_mask(spec, 8)
    tp = TorchPlan(tc.session(spec, 8).solve(m.q_ranges, m.k_ranges, m.types), 3)
    be = cpt.AtenBackend() if ATEN else cpt.TorchBackend()
    res, states = _graph_calls(tp, be, tc.CopyComm())
    assert sorted(s for s, _ in states.values()) == ["graph", "graph"], states
    for got, want in res:
        for a, b in zip(got, want):
            assert tc.rel_err(a.double().nan_to_num(0, 0, 0), b.double().nan_to_num(0, 0, 0)) <= BF16_TOL


# ---- loopback: P = 2, 4, 8 ranks on one GPU ----------------------------------------------------------------


LOOPBACK = [(P, {"mask": mask, "dtype": "bf16", "heads": {"q": 16, "kv": 4, "dim": 128}, "spr": 1024,
                 "stages": 2, "relay": 4 if P == 8 else 0, "solver": "static" if P == 8 else "balanced_bytes"})
            for P in (2, 4, 8) for mask in ("causal_document", "sliding_window")]
if TRITON:
    LOOPBACK.append((4, {"mask": "topk", "dtype": "bf16", "module": True, "summaries": True, "spr": 512,
                         "topk": 64, "heads": {"q": 16, "kv": 1, "dim": 80, "dim_v": 64, "kv_shared": True}}))


@pytest.mark.parametrize("P,spec", LOOPBACK, ids=[f"P{p}-{s['mask']}" for p, s in LOOPBACK])
def test_loopback_ranks_on_one_gpu_match_the_dense_reference(P, spec):
    from cpsched.torch import loopback
    spec = dict(spec, device="cuda")
    res = loopback.run(lambda r, g: tc.attn_case(r, P, spec, g), P, timeout=300)
    ref = tc.reference_on(spec, P, res[0]["plan"], "cuda")
    for key in ("out", "dq", "dk", "dv"):
        if ref[key] is not None:
            assert tc.rel_err(tc.assemble(res, key), ref[key]) <= BF16_TOL, key
