"""cpsched.torch across processes (gloo, one process per rank): forward and backward (out, dq, dk, dv) of
every mask kind, solver, layout, stage count and relays against a single-process dense reference (autograd
over the whole sequence with the boolean mask)."""
import pytest

torch = pytest.importorskip("torch")

import torch_cases as tc  # noqa: E402
from torch_pool import get_pool  # noqa: E402

FP32_TOL = 1e-5   # max |a - b| / max(1, max |ref|), per tensor
BF16_TOL = 1e-2   # bf16 inputs, partial results and gradients travel in bf16 (errors: docs/torch.md, "Tolerances")

RANGE_MASKS = ["causal_document", "full_document", "sliding_window", "prefix_lm", "share_question"]
SOLVERS = ["balanced_bytes", "binary_greedy", "usp", "static", "owner", "ilp"]


def check(P, spec, tol=FP32_TOL):
    res = get_pool(P).values("attn_case", timeout=180, spec=spec)
    return res[0], tc.check_results(res, spec, P, tol)


CASES = []
# every mask kind at every P, stages rotating through 1, 2 and auto
for P in (2, 3, 4):
    for i, mask in enumerate(RANGE_MASKS):
        CASES.append((P, {"mask": mask, "solver": "balanced_bytes", "stages": [1, 2, "auto"][(i + P) % 3],
                          "pack": P % 3}))
    CASES.append((P, {"mask": "topk", "heads": {"q": 4, "kv": 1, "dim": 48, "dim_v": 32, "kv_shared": True},
                      "spr": 96, "topk": 12, "stages": [1, 2, "auto"][P % 3], "module": True}))
    CASES.append((P, {"mask": "block_topk", "heads": {"q": 8, "kv": 4, "dim": 16}, "spr": 128,
                      "stages": [2, 1, "auto"][P % 3]}))
    # per-rank ingestion: each rank summarises its own top-k rows, plans its own part from the gathered summaries
    CASES.append((P, {"mask": "topk", "heads": {"q": 4, "kv": 1, "dim": 48, "dim_v": 32, "kv_shared": True},
                      "spr": 96, "topk": 12, "stages": [2, "auto", 1][P % 3], "module": True, "summaries": True}))
CASES.append((4, {"mask": "topk", "heads": {"q": 4, "kv": 2, "dim": 16}, "spr": 64, "topk": 10, "sel_heads": 2,
                  "stages": 2, "module": True, "summaries": True}))
# every solver, fixed layout (area cost model keeps the sequential sharding) and stages 1 / 2 / auto
for P in (3, 4):
    for j, solver in enumerate(SOLVERS):
        if solver == "ilp" and P != 4:
            continue
        CASES.append((P, {"mask": ["causal_document", "full_document"][j % 2], "solver": solver,
                          "stages": [1, 2, "auto"][(j + P) % 3],
                          "solver_params": {"time_limit_s": 2.0} if solver == "ilp" else None,
                          "spr": 64 if solver == "ilp" else None}))
# planned (dispatched) layouts: static's dispatch, and balanced_bytes under the time cost model
for P in (2, 3, 4):
    CASES.append((P, {"mask": "causal", "solver": "static", "stages": 2}))
    # 512 tokens per rank: where the time cost model's default dispatches at P = 2, 3 and 4 (with the kernel
    # model of the hardware profile it keeps the fixed layout at 1024 / P)
    CASES.append((P, {"mask": "causal", "solver": "balanced_bytes", "cost": "time", "stages": "auto", "spr": 512}))
CASES.append((4, {"mask": "causal_document", "solver": "static", "stages": 1, "module": True}))
# a plan for a cluster (the time cost model) with two stages ends with a local tail
for P in (3, 4):
    CASES.append((P, {"mask": "causal_document", "solver": "balanced_bytes", "cost": "time", "stages": 2,
                      "expect_tail": True, "expect_dispatch": False}))
# relays: P = 4 in nodes of 2 ranks
for j, (mask, solver) in enumerate([("causal", "owner"), ("causal", "balanced_bytes"), ("full_document", "static"),
                                    ("causal_document", "static")]):
    CASES.append((4, {"mask": mask, "solver": solver, "relay": 2, "stages": [1, 2][j % 2], "expect_relays": True}))
CASES.append((4, {"mask": "full", "solver": "usp", "relay": 2, "stages": 2}))  # usp's plan forwards nothing here
CASES.append((4, {"mask": "block_topk", "heads": {"q": 8, "kv": 4, "dim": 16}, "spr": 128, "stages": 2,
                  "relay": 2, "solver": "owner"}))
# head geometry: MLA without a shared latent, head groups not flattened
CASES.append((3, {"mask": "causal_document", "heads": {"q": 4, "kv": 2, "dim": 24, "dim_v": 16}}))
CASES.append((2, {"mask": "prefix_lm", "flatten": False, "solver": "binary_greedy"}))
# inputs and output gradient with permuted strides (not contiguous), through the torch and flash paths
CASES.append((3, {"mask": "full_document", "stages": 2, "noncontig": True}))
CASES.append((4, {"mask": "causal", "solver": "static", "stages": 2, "relay": 2, "noncontig": True,
                  "backend": "flash_stub"}))
# the other backends' batching: FlexAttention's forward (eager on the CPU; its backward is the torch kernels
# there), and the flash backend with a torch stand-in for flash-attn's varlen kernels
CASES.append((2, {"mask": "share_question", "backend": "flex", "stages": 2}))
CASES.append((3, {"mask": "causal_document", "backend": "flash_stub", "stages": 2}))
CASES.append((4, {"mask": "prefix_lm", "backend": "flash_stub", "relay": 2, "solver": "static", "stages": 1}))


def _id(case):
    P, s = case
    bits = [f"P{P}", s["mask"], s.get("solver", "balanced_bytes"), f"st{s.get('stages', 1)}"]
    if s.get("cost"):
        bits.append(s["cost"])
    if s.get("relay"):
        bits.append("relay")
    if s.get("module"):
        bits.append("module")
    if s.get("noncontig"):
        bits.append("noncontig")
    if s.get("backend"):
        bits.append(s["backend"])
    if s.get("flatten") is False:
        bits.append("unflat")
    if "dim_v" in (s.get("heads") or {}):
        bits.append("mla")
    return "-".join(map(str, bits))


@pytest.mark.parametrize("P,spec", CASES, ids=[_id(c) for c in CASES])
def test_matches_dense_reference_fp32(P, spec):
    tc.check_expected_plan(check, P, spec)


@pytest.mark.parametrize("P", [2, 3, 4])
def test_matches_dense_reference_bf16(P):
    spec = {"mask": ["causal_document", "sliding_window", "share_question"][P % 3], "dtype": "bf16",
            "stages": 2, "relay": 2 if P == 4 else 0, "solver": "static" if P == 4 else "balanced_bytes"}
    _, errs = check(P, spec, BF16_TOL)
    assert all(e > 0 for e in errs.values())  # bf16 really ran: not bit-exact with the fp64 reference


REMAP = [(3, {"mask": "topk", "heads": {"q": 4, "kv": 1, "dim": 48, "dim_v": 32, "kv_shared": True}, "spr": 96,
              "topk": 12, "stages": 2}),
         (4, {"mask": "topk", "heads": {"q": 4, "kv": 2, "dim": 16}, "spr": 64, "topk": 10, "sel_heads": 2,
              "stages": 2, "relay": 2})]


@pytest.mark.parametrize("P,spec", REMAP, ids=["P3-mla-shared", "P4-two-selections-relay"])
def test_device_remap_of_topk_rows_equals_the_plan_builders(P, spec):
    counts = get_pool(P).values("remap_case", timeout=120, spec=spec)
    assert all(c > 0 for c in counts), counts
    if spec.get("sel_heads"):  # and it runs: the DistAttention path remaps on the device by default
        check(P, dict(spec, module=True))
