"""python -m cpsched.torch.calibrate (the kernel model measured, issue 48's item 4) without a GPU.

What is shown: the fit recovers a known kernel model (fixed costs per call and per arg, a tile rate per form and
length) from batch times priced by that model; the profile it writes parses back to the same values through the
core's parser; the core's kernel model, on that profile, prices a plan's rank as the fit priced the batch of its
args (so a measured profile predicts what was measured); the measurement runs the aten backend's own varlen
batching and kernel calls (here on the FA2 stand-in); bad input raises ValueError / exits 2 naming the argument."""
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import cpsched  # noqa: E402
import fa2_standin  # noqa: E402
from cpsched import _cpsched  # noqa: E402
from cpsched.torch import AtenBackend  # noqa: E402
from cpsched.torch import calibrate as cal  # noqa: E402

TILES = {"fwd": (128, 64), "bwd": (64, 128)}
CALL, ENTRY = 7e-6, 1.5e-6  # seconds


def true_tile_tflops(form, ell):
    """A known model: tile rates rising with the length, lower for each later form."""
    return 300.0 + 80.0 * math.log2(ell) - 20.0 * cal.FORMS.index(form)


def priced(p, tiles=TILES, heads_q=8, d=128, rate=None):
    """The known model's seconds of point p: call + n (entry + tile FLOPs / tile rate)."""
    fpp = cal._flops_per_pair(p.pass_, heads_q, d, d)
    rate = rate or true_tile_tflops(p.form, p.length)
    return CALL + p.n * (ENTRY + cal._work(p, tiles[p.pass_]) * fpp / (rate * 1e12))


def table_rate(lengths, form, ell):
    """The known tile rate as a table at `lengths` gives it at `ell`: linear in log2 of the length between two
    points (kernel_model.hpp)."""
    if ell in lengths:
        return true_tile_tflops(form, ell)
    hi = min(x for x in lengths if x > ell)
    lo = max(x for x in lengths if x < ell)
    w = (math.log2(ell) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return true_tile_tflops(form, lo) + w * (true_tile_tflops(form, hi) - true_tile_tflops(form, lo))


def fitted(lengths):
    pts = [cal.Point(**{**vars(p), "seconds": priced(p)}) for p in cal.grid(lengths)]
    return {ps: cal.fit([p for p in pts if p.pass_ == ps], TILES[ps], cal._flops_per_pair(ps, 8, 128, 128))
            for ps in ("fwd", "bwd")}


def test_grid_puts_the_model_length_on_each_table_length():
    pts = cal.grid([128, 1024], max_tokens=4096)
    for p in pts:
        assert p.length in (128, 1024)
        assert p.n == 1 or p.n * max(p.q_len, p.k_len) <= 4096
        if p.pass_ == "fwd":
            assert p.k_len == p.length and p.q_len <= p.k_len  # bi_causal needs k >= q
        else:
            assert p.q_len == p.length and p.k_len >= p.q_len
    # batches of 1 and more at every short shape: the fixed costs are told apart
    assert {p.n for p in pts if p.length == 128} == {1, 4, 16}


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_fit_recovers_a_known_model(pass_):
    f = fitted([128, 256, 1024, 4096])[pass_]
    assert f["call_us"] == pytest.approx(CALL * 1e6, rel=1e-5)
    assert f["entry_us"] == pytest.approx(ENTRY * 1e6, rel=1e-5)
    assert len(f["tile_tflops"]) == 4 * 4
    for (form, ell), r in f["tile_tflops"].items():
        assert r == pytest.approx(true_tile_tflops(form, ell), rel=1e-5)


def test_profile_parses_back_and_prices_a_plan_as_the_fit(tmp_path):
    lengths = [128, 256, 1024, 4096]
    fits = fitted(lengths)
    kernel = {ps: {"tile": TILES[ps], "call_us": fits[ps]["call_us"], "entry_us": fits[ps]["entry_us"],
                   "lengths": lengths, "tflops": cal.table_rates(fits[ps]["tile_tflops"], TILES[ps], lengths)}
              for ps in ("fwd", "bwd")}
    base = _cpsched.hardware_profile("h200_8x_nvlink")
    path = tmp_path / "measured.yaml"
    path.write_text(cal.profile_yaml(base, kernel, ["a comment"], name="h200_measured"))
    back = _cpsched.hardware_profile(str(path))
    assert back["name"] == "h200_measured"
    for key in ("attention_tflops", "hbm_gb_s", "gpus_per_node", "intra_node", "inter_node", "overlap"):
        assert back[key] == base[key]
    for ps in ("fwd", "bwd"):
        got = back["kernel"][ps]
        assert got["tile"] == TILES[ps] and got["lengths"] == lengths
        assert got["call_us"] == fits[ps]["call_us"] and got["entry_us"] == fits[ps]["entry_us"]
        for form in cal.FORMS:
            assert got["tflops"][form] == [float(x) for x in kernel[ps]["tflops"][form]]
    # P = 1, one slice: each of the 8 KV head groups is one arg of 8:1 heads, one call per pass: the batch of
    # n = 8 the fit priced, at table lengths and between them (2048 backward)
    for form, q, k in [("causal", 1024, 1024), ("full", 256, 1024), ("causal", 512, 4096), ("bi_causal", 512, 1024),
                       ("inv_causal", 1024, 1024), ("full", 1024, 2048)]:
        s = cpsched.Session(cp_size=1, seqlen=max(q, k), heads=(64, 8, 128, "bf16"))
        pc = s.solve([(0, q)], [(0, k)], [cal.FORMS.index(form)]).predicted_compute(0, hardware=str(path))
        for ps in ("fwd", "bwd"):
            p = cal.Point(ps, form, q, k, 8)
            assert pc[ps] == pytest.approx(priced(p, rate=table_rate(lengths, form, p.length)), rel=1e-5), \
                (form, q, k, ps)


def test_calibrate_measures_the_backends_kernel_calls(tmp_path):
    """calibrate() on the CPU: the aten backend with the FA2 stand-in as its ops; the timer runs each call (its
    output checked) and returns the known model's price of the point, so the fit must find that model."""
    ops = fa2_standin.AtenOps()
    calls = []

    class Counting:
        def __getattr__(self, name):
            op = getattr(ops, name)

            def run(*a, **kw):
                at = 3 if name == "_flash_attention_forward" else 6  # cu_seqlens of q, then of k
                calls.append((name, a[at].tolist(), a[at + 1].tolist()))
                return op(*a, **kw)
            return run
    tiles = {"fwd": (16, 8), "bwd": (8, 16)}
    seen = []

    def timer(fn, p):
        before = len(calls)
        out = fn()
        assert len(calls) == before + 1  # one kernel call per batch
        name, cu_q, cu_k = calls[-1]
        assert name == ("_flash_attention_forward" if p.pass_ == "fwd" else "_flash_attention_backward")
        assert cu_q == [i * p.q_len for i in range(p.n + 1)] and cu_k == [i * p.k_len for i in range(p.n + 1)]
        assert out[0].shape[0] == p.n * p.q_len
        seen.append(p)
        return priced(p, tiles, heads_q=2, d=8)
    lengths = [16, 32, 64]
    text, fits, pts = cal.calibrate(AtenBackend(ops=Counting()), "h100_8x_nvlink", lengths=lengths, heads=(2, 1),
                                    d=8, device="cpu", dtype=torch.float32, timer=timer, tiles=tiles,
                                    max_tokens=512, log=lambda *a: None, source="test")
    assert len(seen) == len(pts) == len(cal.grid(lengths, max_tokens=512))
    for ps in ("fwd", "bwd"):
        assert fits[ps]["call_us"] == pytest.approx(CALL * 1e6, rel=1e-5)
        assert fits[ps]["entry_us"] == pytest.approx(ENTRY * 1e6, rel=1e-5)
    path = tmp_path / "p.yaml"
    path.write_text(text)
    back = _cpsched.hardware_profile(str(path))
    assert back["name"] == "h100_8x_nvlink_measured"
    assert back["attention_tflops"] == _cpsched.hardware_profile("h100_8x_nvlink")["attention_tflops"]
    assert back["kernel"]["fwd"]["tile"] == (16, 8) and back["kernel"]["bwd"]["lengths"] == lengths
    assert text.startswith("# Measured by python -m cpsched.torch.calibrate")


def test_forms_not_measured_take_causal(tmp_path):
    def timer(fn, p):
        fn()
        return priced(p, {"fwd": (16, 8), "bwd": (8, 16)}, heads_q=2, d=8)
    text, _, _ = cal.calibrate(AtenBackend(ops=fa2_standin.AtenOps()), "h200_8x_nvlink", lengths=[16, 32],
                               forms=("full", "causal"), heads=(2, 1), d=8, device="cpu", dtype=torch.float32,
                               timer=timer, tiles={"fwd": (16, 8), "bwd": (8, 16)}, max_tokens=256,
                               log=lambda *a: None)
    path = tmp_path / "p.yaml"
    path.write_text(text)
    tf = _cpsched.hardware_profile(str(path))["kernel"]["fwd"]["tflops"]
    assert tf["inv_causal"] == "causal" and tf["bi_causal"] == "causal" and isinstance(tf["full"], list)


def test_bad_input():
    with pytest.raises(ValueError, match="points"):
        cal.fit([], TILES["fwd"], 1.0)
    with pytest.raises(ValueError, match="points: every point needs a positive"):
        cal.fit([cal.Point("fwd", "full", 128, 128, 1, 0.0)], TILES["fwd"], 1.0)
    # a longer batch measured faster: no positive rate
    pts = [cal.Point("fwd", "full", 128, 128, 1, 1e-3), cal.Point("fwd", "full", 128, 128, 4, 1e-6),
           cal.Point("fwd", "full", 64, 128, 1, 2e-3), cal.Point("fwd", "full", 64, 128, 16, 1e-6)]
    with pytest.raises(ValueError, match="no positive rate"):
        cal.fit(pts, TILES["fwd"], 1.0)
    with pytest.raises(ValueError, match="lengths"):
        cal.calibrate(None, "h200_8x_nvlink", lengths=[0, 16], device="cpu")
    with pytest.raises(ValueError, match="nope.yaml"):
        _cpsched.hardware_profile("nope.yaml")
    for argv, what in [(["--out", "x.yaml", "--lengths", "12,a"], "--lengths"),
                       (["--out", "x.yaml", "--tile-fwd", "128"], "--tile-fwd"),
                       (["--out", "x.yaml", "--heads", "64:7"], "--heads"),
                       (["--out", "x.yaml", "--forms", "causal,index"], "--forms"),
                       (["--out", "x.yaml", "--iters", "0"], "--iters"),
                       (["--out", "x.yaml", "--base", "no_such_profile"], "--base")]:
        with pytest.raises(SystemExit) as e:
            cal.main(argv)
        assert e.value.code == 2, what


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip without a CUDA device")
def test_main_skips_without_cuda(tmp_path):
    out = tmp_path / "never.yaml"
    assert cal.main(["--out", str(out)]) == 77
    assert not out.exists()


BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench")


@pytest.mark.parametrize("script,args,expect", [
    ("check_kernel_model.py", ["--cpu-smoke"], "worst |kern / model - 1|"),
    ("bench_torch_cuda.py", ["--cpu-smoke", "--sections", "p1", "loopback"], "model fwd"),
])
def test_gpu_benchmarks_run_on_the_cpu(script, args, expect):
    """The GPU check's scripts (python/bench/gpu_check_torch.sh) at toy sizes on the CPU: each time printed
    beside the kernel model's prediction (their logic; the CPU's times mean nothing)."""
    r = subprocess.run([sys.executable, os.path.join(BENCH, script)] + args, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert expect in r.stdout
    if script == "check_kernel_model.py":  # a row per rank: P = 2 and 4, two masks, one pack
        rows = [ln for ln in r.stdout.splitlines() if ln.split()[:1] in (["causal_document"], ["full_document"])]
        assert len(rows) == 2 * (2 + 4)
