"""Measures the attention kernels cpsched.torch runs and writes a hardware profile whose kernel model is fitted to
them (core/include/cpsched/hardware/kernel_model.hpp; docs/bounds.md, "Plans priced as the kernels run them").

    python -m cpsched.torch.calibrate --base h200_8x_nvlink --out configs/hardware/h200_measured.yaml
    python -m cpsched.torch.calibrate --base h100_8x_nvlink --out h100_measured.yaml --lengths 128,1024,8192

What it times: the varlen FlashAttention-2 calls of the `aten` backend (`--backend flash`: flash-attn's), each a
batch of n equal range args of one mask form, built by the backend's own batching (_varlen.py: inv_causal is
the causal kernel on reversed rows, bi_causal a window), forward and backward, with the heads a call has in a
plan: a plan with flattened head groups gives each arg the q heads of one KV head (--heads 64:8 -> 8:1 per
call), D 128, bf16. Per pass the model's length l (the keys forward, the queries backward) takes each of
--lengths; the other side takes l/4, l/2 and l forward (queries), l, 3l/2 and 2l backward (keys); the batches
hold 1, 4 and 16 args, at most --max-tokens rows per call. Times are medians of --iters calls (CUDA events).

The fit, per pass (least squares on relative error): a call of n args of one shape takes
    call_us + n x (entry_us + tiles x tile_q x tile_k x FLOPs per pair / tile rate(form, l)),
the kernel model's own price of a batch, with the pass's tiles (--tiles; default FlashAttention-2's for D = 128
on sm90, the kernel PyTorch's ops run). Each tile rate is written as the profile states rates: TFLOP/s on the
exact area of the table's arg at l (l x l; bi_causal l x 2l), so the model prices every measured batch as the fit
does. It prints each point's model / measured and the worst of them. Index args (token top-k) are not measured:
the profile prices them at attention_tflops, as without a table.

The rest of the profile (peak rates, links, HBM) is --base's, so the compute bound does not move. Exits 77 when
no CUDA device is visible; `calibrate()` and `fit()` take a backend and a timer for other devices (the tests).
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
from dataclasses import dataclass

import numpy as np
import torch

from .. import _cpsched

FORMS = ("full", "causal", "inv_causal", "bi_causal")
# FlashAttention-2 (the kernels behind torch.ops.aten._flash_attention_*), D = 128 on sm90:
# csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_hdim128 (kBlockM 128, kBlockN 64 off sm8x) and
# flash_bwd_launch_template.h, run_mha_bwd_hdim128 (kBlockM 64, kBlockN 128 with >= 144 KB of shared memory).
FA2_TILES = {"fwd": (128, 64), "bwd": (64, 128)}
DEFAULT_LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True)
class Point:
    """One measured call: `n` args of q_len x k_len of `form` in pass `pass_`; `seconds` its median time."""
    pass_: str
    form: str
    q_len: int
    k_len: int
    n: int
    seconds: float = float("nan")

    @property
    def length(self):
        """The kernel model's length of the arg: its keys forward, its queries backward."""
        return self.k_len if self.pass_ == "fwd" else self.q_len


def grid(lengths, forms=FORMS, max_tokens=131072, batches=(1, 4, 16)):
    """The shapes measured, per pass (module text): a list of Point without times."""
    pts = []
    for pass_ in ("fwd", "bwd"):
        for form in forms:
            for ell in lengths:
                others = (ell // 4, ell // 2, ell) if pass_ == "fwd" else (ell, ell * 3 // 2, 2 * ell)
                for o in sorted(set(x for x in others if x >= 1)):
                    q_len, k_len = (o, ell) if pass_ == "fwd" else (ell, o)
                    ns = [n for n in batches if n == 1 or n * max(q_len, k_len) <= max_tokens]
                    pts += [Point(pass_, form, q_len, k_len, n) for n in ns]
    return pts


def _form_id(form):
    return FORMS.index(form)


def _flops_per_pair(pass_, heads_q, d, d_v):
    """FLOPs per unmasked pair over a call's q heads: 2 (d + d_v) forward, 6 d + 4 d_v backward (problem.hpp)."""
    per_head = 2.0 * d + 2.0 * d_v if pass_ == "fwd" else 6.0 * d + 4.0 * d_v
    return per_head * heads_q


def _work(p, tile):
    """FLOPs-per-pair units of the tiles the kernel model charges one arg of p: tiles x tile_q x tile_k."""
    return _cpsched.kernel_arg(_form_id(p.form), p.q_len, p.k_len, tile[0], tile[1])["tiles"] * tile[0] * tile[1]


def fit(points, tiles, fpp):
    """Fits one pass's points (module text). `tiles`: (tile_q, tile_k); `fpp`: FLOPs per pair over a call's heads.
    Returns {call_us, entry_us, tile_tflops: {(form, length): TFLOP/s per tile FLOP}, model: [seconds per point]}
    (calibrate() adds worst: the largest |model / measured - 1|).
    Raises ValueError when a rate comes out non-positive (too few or too noisy points)."""
    if not points:
        raise ValueError("points: nothing to fit")
    keys = sorted({(p.form, p.length) for p in points}, key=lambda x: (_form_id(x[0]), x[1]))
    col = {k: 2 + i for i, k in enumerate(keys)}
    A = np.zeros((len(points), 2 + len(keys)))
    t = np.array([p.seconds for p in points], dtype=np.float64)
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("points: every point needs a positive measured time")
    for i, p in enumerate(points):
        A[i, 0] = 1.0
        A[i, 1] = p.n
        A[i, col[(p.form, p.length)]] = p.n * _work(p, tiles) * fpp
    # relative error: each row over its own time; fixed costs that come out negative are held at 0
    free = list(range(A.shape[1]))
    while True:
        w = A[:, free] / t[:, None]
        x, *_ = np.linalg.lstsq(w, np.ones_like(t), rcond=None)
        neg = [j for j, v in zip(free, x) if j < 2 and v < 0]
        if not neg:
            break
        free = [j for j in free if j not in neg]
    sol = np.zeros(A.shape[1])
    sol[free] = x
    bad = [k for k in keys if not sol[col[k]] > 0]
    if bad:
        raise ValueError(f"points: the fit gives no positive rate for {bad}; measure with more --iters")
    return {"call_us": sol[0] * 1e6, "entry_us": sol[1] * 1e6,
            "tile_tflops": {k: 1.0 / sol[col[k]] / 1e12 for k in keys}, "model": list(A @ sol)}


def table_rates(tile_tflops, tiles, lengths, forms=FORMS):
    """The profile's table from tile rates: per form, TFLOP/s of the table's arg at each length (l x l;
    bi_causal l x 2l) counted on its exact area, the inverse of KernelRates::finish()."""
    out = {}
    for form in forms:
        row = []
        for ell in lengths:
            k_len = 2 * ell if form == "bi_causal" else ell
            a = _cpsched.kernel_arg(_form_id(form), ell, k_len, tiles[0], tiles[1])
            row.append(tile_tflops[(form, ell)] * a["area"] / (a["tiles"] * tiles[0] * tiles[1]))
        out[form] = row
    return out


def _num(x):
    """A YAML number that parses back to the same double."""
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


def profile_yaml(base, kernel, comment, name=None, description=None):
    """A hardware profile's YAML text: `base` (a dict as _cpsched.hardware_profile gives) with `kernel` ({fwd,
    bwd: {tile, call_us, entry_us, lengths, tflops}}); `comment` lines go first, as # lines."""
    lines = [f"# {c}" if c else "#" for c in comment]

    def rates(r):
        out = [f"    tile: {{q: {r['tile'][0]}, k: {r['tile'][1]}}}", f"    call_us: {_num(r['call_us'])}",
               f"    entry_us: {_num(r['entry_us'])}",
               f"    lengths: [{', '.join(_num(x) for x in r['lengths'])}]", "    tflops:"]
        for form, row in r["tflops"].items():
            out.append(f"      {form}: {row}" if isinstance(row, str) else
                       f"      {form}: [{', '.join(_num(x) for x in row)}]")
        return out
    lines += [f"name: {name or base['name']}", f"description: {_quote(description or base['description'])}",
              f"attention_tflops: {{fwd: {_num(base['attention_tflops']['fwd'])}, "
              f"bwd: {_num(base['attention_tflops']['bwd'])}}}"]
    if kernel is not None:
        lines += ["kernel:", "  fwd:"] + rates(kernel["fwd"]) + ["  bwd:"] + rates(kernel["bwd"])
    for key in ("intra_node", "inter_node"):
        lk = base[key]
        lines.append(f"{key}: {{bandwidth_gb_s: {_num(lk['bandwidth_gb_s'])}, latency_us: {_num(lk['latency_us'])}}}")
    lines += [f"hbm_gb_s: {_num(base['hbm_gb_s'])}", f"gpus_per_node: {base['gpus_per_node']}",
              f"overlap: {'true' if base['overlap'] else 'false'}"]
    return "\n".join(lines) + "\n"


def _quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'



def cuda_timer(device, iters, warm=2):
    """timer(fn, point): the median seconds of fn() over `iters` calls after `warm` (CUDA events)."""
    def timer(fn, point):  # noqa: ARG001 - the point is for timers that price it (the tests)
        for _ in range(warm):
            fn()
        torch.cuda.synchronize(device)
        ts = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e-3)
        return statistics.median(ts)
    return timer


def measure(backend, p, heads, d, device, dtype, timer, seed=0):
    """The median seconds of one call of point p through `backend`'s varlen kernels (`_fwd` / `_bwd`)."""
    from ._plan import Arg
    from ._varlen import VarlenBatch, arg_mode
    # n args of one rank's local rows, one after the other, head group 0 (one KV head per row: G = 1)
    args = [Arg(i * p.q_len, (i + 1) * p.q_len, i * p.k_len, (i + 1) * p.k_len, _form_id(p.form), 0, False, False)
            for i in range(p.n)]
    mode = arg_mode(args[0])
    if mode is None:
        raise ValueError(f"point {p}: FA2 cannot run this arg")
    x = VarlenBatch(mode[0], args, 1, device)
    hq, hk = heads
    g = torch.Generator(device=device).manual_seed(seed)
    mk = lambda rows, h: torch.randn(rows, h, d, device=device, dtype=dtype, generator=g)  # noqa: E731
    q, k, v = mk(p.n * p.q_len, hq), mk(p.n * p.k_len, hk), mk(p.n * p.k_len, hk)
    scale = 1.0 / math.sqrt(d)

    def fwd():
        return backend._fwd(q, k, v, x.cu_q, x.cu_k, x.max_q, x.max_k, scale, x.causal, x.window)
    if p.pass_ == "fwd":
        return timer(fwd, p)
    o, lse = fwd()
    lse_hn = lse.transpose(0, 1).contiguous()
    do = torch.randn(o.shape, device=device, dtype=dtype, generator=g)
    grads = [torch.empty_like(t) for t in (q, k, v)] if backend.grads_in_place else [None] * 3
    return timer(lambda: backend._bwd(do, q, k, v, o, lse_hn, x.cu_q, x.cu_k, x.max_q, x.max_k, scale, x.causal,
                                      x.window, *grads), p)


def calibrate(backend, base, *, lengths=DEFAULT_LENGTHS, forms=FORMS, heads=(8, 1), d=128, device=None,
              dtype=torch.bfloat16, timer=None, tiles=None, max_tokens=131072, batches=(1, 4, 16), log=print,
              source=""):
    """Measures the grid through `backend` and fits it. Returns (profile YAML text, {pass: fit}, points).
    `base`: a bundled profile name or a YAML path (its peak rates, links and HBM are kept); `heads`: (q, kv)
    heads of one call; `timer(fn, point)` -> median seconds of fn, the call of `point` (default: CUDA events, 5
    calls)."""
    tiles = tiles or FA2_TILES
    lengths = sorted({int(x) for x in lengths})
    if not lengths or lengths[0] < 1:
        raise ValueError(f"lengths: expected positive whole numbers, got {lengths!r}")
    device = torch.device(device) if device is not None else torch.device("cuda")
    timer = timer or cuda_timer(device, 5)
    base_dict = _cpsched.hardware_profile(str(base))
    pts = [Point(**{**vars(p), "seconds": measure(backend, p, heads, d, device, dtype, timer)})
           for p in grid(lengths, forms, max_tokens, batches)]
    fits, kernel = {}, {}
    for pass_ in ("fwd", "bwd"):
        mine = [p for p in pts if p.pass_ == pass_]
        f = fit(mine, tiles[pass_], _flops_per_pair(pass_, heads[0], d, d))
        fits[pass_] = f
        table = table_rates(f["tile_tflops"], tiles[pass_], lengths, forms)
        if "causal" in table:  # forms not measured take causal's rates, as in the bundled profiles
            table.update({x: "causal" for x in FORMS if x not in table})
        kernel[pass_] = {"tile": tiles[pass_], "call_us": f["call_us"], "entry_us": f["entry_us"],
                         "lengths": lengths, "tflops": table}
        f["worst"] = max(abs(m / p.seconds - 1) for m, p in zip(f["model"], mine))
        log(f"{pass_}: call {f['call_us']:.2f} us, entry {f['entry_us']:.2f} us, {len(mine)} points, "
            f"model / measured within {100 * f['worst']:.1f} %")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    comment = [f"Measured by python -m cpsched.torch.calibrate ({when}){': ' + source if source else ''}.",
               f"Kernels: cpsched.torch's {getattr(backend, 'name', '?')} backend (varlen FlashAttention-2), "
               f"{heads[0]}:{heads[1]} heads per call, D {d}, {str(dtype).replace('torch.', '')}; "
               f"tiles {tiles['fwd'][0]} x {tiles['fwd'][1]} forward, {tiles['bwd'][0]} x {tiles['bwd'][1]} backward.",
               f"Everything but `kernel` is {base_dict['name']}'s ({base_dict['source']}).",
               "Fit: a call of n args takes call_us + n (entry_us + tiles x tile area x FLOPs per pair / tile rate);",
               "rates: TFLOP/s on the exact area of one l x l arg (bi_causal l x 2l), as the bundled profiles'.",
               f"Fit: every point's model / measured within {100 * fits['fwd']['worst']:.1f} % forward, "
               f"{100 * fits['bwd']['worst']:.1f} % backward."]
    text = profile_yaml(base_dict, kernel, comment, name=f"{base_dict['name']}_measured",
                        description=base_dict["description"] + "; kernel model measured")
    return text, fits, pts


def _lengths_arg(s):
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {s!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive lengths, got {s!r}")
    return out


def _tile_arg(s):
    try:
        q, k = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected QxK, e.g. 128x64, got {s!r}") from None
    if q < 1 or k < 1:
        raise argparse.ArgumentTypeError(f"expected positive tile sides, got {s!r}")
    return q, k


def _heads_arg(s):
    try:
        q, kv = (int(x) for x in s.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected Q:KV, e.g. 64:8, got {s!r}") from None
    if q < 1 or kv < 1 or q % kv:
        raise argparse.ArgumentTypeError(f"expected q heads a multiple of kv heads, got {s!r}")
    return q, kv


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m cpsched.torch.calibrate", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=None, help="the profile whose peak rates, links and HBM the output keeps "
                    "(bundled name or YAML path; default: h200_8x_nvlink or h100_8x_nvlink by the GPU's name)")
    ap.add_argument("--out", required=True, help="the profile YAML to write")
    ap.add_argument("--backend", default="aten", choices=("aten", "flash"))
    ap.add_argument("--heads", type=_heads_arg, default=(64, 8), help="q:kv heads of the model (64:8); a call "
                    "has q/kv of them with flattened head groups, q:kv with --no-flatten")
    ap.add_argument("--no-flatten", action="store_true", help="plans without flattened head groups")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--lengths", type=_lengths_arg, default=list(DEFAULT_LENGTHS))
    ap.add_argument("--forms", default=",".join(FORMS), help="mask forms to measure (the others alias causal)")
    ap.add_argument("--tile-fwd", type=_tile_arg, default=FA2_TILES["fwd"])
    ap.add_argument("--tile-bwd", type=_tile_arg, default=FA2_TILES["bwd"])
    ap.add_argument("--max-tokens", type=int, default=131072, help="rows of one call at most (batches of 4, 16)")
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args(argv)
    forms = [f.strip() for f in a.forms.split(",") if f.strip()]
    bad = [f for f in forms if f not in FORMS]
    if bad or not forms:
        ap.error(f"--forms: expected some of {','.join(FORMS)}, got {a.forms!r}")
    for name, v in (("--iters", a.iters), ("--max-tokens", a.max_tokens), ("--dim", a.dim)):
        if v < 1:
            ap.error(f"{name}: expected a positive number, got {v}")
    if a.base is not None:
        try:
            _cpsched.hardware_profile(a.base)
        except ValueError as e:
            ap.error(f"--base: {e}")
    if not torch.cuda.is_available():
        print("calibrate: no CUDA device visible: skipped")
        return 77
    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name(device)
    base = a.base or ("h200_8x_nvlink" if "H200" in gpu else "h100_8x_nvlink")
    from ._aten import AtenBackend
    from ._backends import FlashBackend, flash_available
    if a.backend == "flash" and not flash_available():
        ap.error("--backend flash: flash_attn does not import")
    backend = AtenBackend() if a.backend == "aten" else FlashBackend()
    hq, hkv = a.heads
    heads = (hq, hkv) if a.no_flatten else (hq // hkv, 1)
    text, fits, pts = calibrate(
        backend, base, lengths=a.lengths, forms=forms, heads=heads, d=a.dim, device=device,
        timer=cuda_timer(device, a.iters), tiles={"fwd": a.tile_fwd, "bwd": a.tile_bwd}, max_tokens=a.max_tokens,
        source=f"{gpu}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    for pass_ in ("fwd", "bwd"):
        print(f"\n{pass_}: {'form':10} {'q':>6} {'k':>6} {'n':>3} {'ms':>9} {'model ms':>9} {'TFLOP/s':>8}")
        fpp = _flops_per_pair(pass_, heads[0], a.dim, a.dim)
        for p, m in zip([p for p in pts if p.pass_ == pass_], fits[pass_]["model"]):
            area = _cpsched.kernel_arg(_form_id(p.form), p.q_len, p.k_len, 1, 1)["area"]
            print(f"{'':5} {p.form:10} {p.q_len:>6} {p.k_len:>6} {p.n:>3} {p.seconds * 1e3:9.4f} {m * 1e3:9.4f} "
                  f"{p.n * area * fpp / p.seconds / 1e12:8.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    _cpsched.hardware_profile(os.path.abspath(a.out))  # parses back, or raises naming the file and key
    print(f"\ncalibrate: wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
