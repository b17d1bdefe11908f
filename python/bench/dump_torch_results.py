"""Every torch test case's results and bytes on the wire, in one .npz: run it before and after a change to
cpsched.torch's executor and compare the two files bitwise (`--compare`), so that a refactoring that must not
change a single bit shows that it did not.

Cases: every correctness case of the attention suite (python/tests/test_torch_attention.py CASES, the ilp ones
excepted: a time-limited MIP need not give the same plan twice) and the loopback suite's bf16 cases, run on
cpsched.torch.loopback with every all_to_all_single counted per rank (bytes sent and received, per call, in
order); the byte suite's cases (test_torch_bytes.py) and a few relay and stride cases on gloo processes.

  python python/bench/dump_torch_results.py OUT.npz            (from the repository root, cpsched installed)
  python python/bench/dump_torch_results.py --compare A.npz B.npz
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

RESULT_KEYS = ("out", "dq", "dk", "dv")


def _key(prefix, P, spec):
    return f"{prefix}/P{P}/" + json.dumps(spec, sort_keys=True, separators=(",", ":"))


class _Wire:
    """Wraps cpsched.torch._groups.all_to_all_single: per rank, (bytes sent to others, bytes received from
    others) of each call, in order."""

    def __init__(self):
        from cpsched.torch import _groups
        self.groups = _groups
        self.real = _groups.all_to_all_single
        self.calls = {}
        self.lock = threading.Lock()

    def __enter__(self):
        real = self.real

        def counting(out, inp, out_splits, in_splits, g, async_op=True):
            rank = g.rank()
            row = int(np.prod(inp.shape[1:])) * inp.element_size()
            sent = sum(n for p, n in enumerate(in_splits) if p != rank) * row
            got = sum(n for p, n in enumerate(out_splits) if p != rank) * row
            with self.lock:
                self.calls.setdefault(rank, []).append((sent, got))
            return real(out, inp, out_splits, in_splits, g, async_op)
        self.groups.all_to_all_single = counting
        return self

    def __exit__(self, *exc):
        self.groups.all_to_all_single = self.real


def loopback_cases():
    from test_torch_attention import CASES
    cases = [(P, {k: v for k, v in spec.items() if v is not None and not k.startswith("expect_")})
             for P, spec in CASES if spec.get("solver") != "ilp"]
    for P in (2, 3, 4):  # test_torch_loopback.py's bf16 cases
        cases.append((P, {"mask": ["causal_document", "sliding_window", "share_question"][P % 3], "dtype": "bf16",
                          "stages": 2, "relay": 2 if P == 4 else 0,
                          "solver": "static" if P == 4 else "balanced_bytes"}))
    return cases


def run_loopback(out):
    import torch_cases as tc
    from cpsched.torch import loopback
    n = 0
    for P, spec in loopback_cases():
        with _Wire() as wire:
            res = loopback.run(lambda r, g: tc.attn_case(r, P, spec, g), P, timeout=300)
        key = _key("loopback", P, spec)
        for r, x in enumerate(res):
            for name in RESULT_KEYS:
                if x.get(name) is not None:
                    out[f"{key}/r{r}/{name}"] = x[name]
            out[f"{key}/r{r}/wire"] = np.array(wire.calls.get(r, []), dtype=np.int64).reshape(-1, 2)
        n += 1
        print(f"loopback {n}: P={P} {spec}", flush=True)
    return n


GLOO_ATTN = [
    (4, {"mask": "causal", "solver": "owner", "relay": 2, "stages": 1}),
    (4, {"mask": "causal_document", "solver": "static", "relay": 2, "stages": 2}),
    (3, {"mask": "full_document", "stages": 2, "noncontig": True}),
    (4, {"mask": "causal_document", "solver": "balanced_bytes", "stages": 2, "pack": 1}),
]


def run_gloo(out):
    from test_torch_bytes import CASES as BYTES, RELAY_CASES
    from torch_pool import get_pool
    n = 0
    for P, spec in [(P, s) for P, s in BYTES] + [(4, s) for s in RELAY_CASES]:
        res = get_pool(P).values("bytes_case", timeout=300, spec=spec)
        key = _key("gloo-bytes", P, spec)
        for r, x in enumerate(res):
            out[f"{key}/r{r}/bytes"] = np.array([x[p][f] for p in ("fwd", "bwd") for f in ("send", "recv", "calls")],
                                                dtype=np.int64)
        n += 1
        print(f"gloo bytes {n}: P={P} {spec}", flush=True)
    for P, spec in GLOO_ATTN:
        res = get_pool(P).values("attn_case", timeout=300, spec=spec)
        key = _key("gloo", P, spec)
        for r, x in enumerate(res):
            for name in RESULT_KEYS:
                if x.get(name) is not None:
                    out[f"{key}/r{r}/{name}"] = x[name]
        n += 1
        print(f"gloo attn {n}: P={P} {spec}", flush=True)
    return n


def compare(a_path, b_path):
    a, b = np.load(a_path), np.load(b_path)
    ka, kb = set(a.files), set(b.files)
    bad = sorted(k for k in ka & kb if a[k].shape != b[k].shape or not np.array_equal(a[k], b[k]))
    cases = {k.rsplit("/", 2)[0] for k in ka | kb}
    print(f"{len(cases)} cases, {len(ka & kb)} arrays in both; only in {a_path}: {len(ka - kb)}, only in "
          f"{b_path}: {len(kb - ka)}; differing: {len(bad)}")
    for k in sorted(ka ^ kb)[:20] + bad[:20]:
        print("  ", k)
    return 0 if not bad and ka == kb else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    import torch
    torch.manual_seed(0)
    out = {}
    n = run_loopback(out) + run_gloo(out)
    np.savez(args.out, **out)
    print(f"{n} cases, {len(out)} arrays -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
