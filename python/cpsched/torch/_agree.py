"""The agreement: before a call's first collective every rank of the group learns what every other rank is about
to run, in one all_gather of a few int64 words per rank, and every rank raises the same ValueError when a rank
rejected its inputs or when the ranks would run different things (docs/torch.md, "Errors").

What a rank claims (`Claim`): which call it is in (attention, undispatch, ingest_topk), named fields that must be
equal on every rank (the plan's digest, the dtype, the shapes, the softmax scale, whether a backward follows; for
an ingestion the Session's S, P and heads and the indices' dtype and shape), and for a plan per peer a digest of
the rows it sends that peer and of the rows it expects from it in every collective of both passes, which must
match the peer's own (a rank's own plan, Session(rank=r), holds no other rank's splits). A rank's own plan also
says in which stages it forwards rows as a relay; the ranks OR these bits, so every rank joins exactly the
forwarding phases some rank uses.

The exchange runs on the CPU when the group has a CPU backend (gloo, or a group made with
init_process_group("cuda:nccl,cpu:gloo") or without a backend): it then never waits for the device. On a group
that has only NCCL it is an all_gather on the device and a copy to the host, which waits for the work queued
before it.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import struct
import weakref

import torch
import torch.distributed as dist

from ._groups import all_gather as _all_gather

MAX_FIELDS = 24
FWD_WORDS = 4            # bits of the forwarding phases a rank's own plan uses: 4 x 63 (pass, stage, kind)
_HEAD = 3                # error flag, call, number of fields
_CALLS = {"attention": 1, "undispatch": 2, "ingest_topk": 3}
_CALL_NAMES = {v: k for k, v in _CALLS.items()}
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
for _n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _n):
        _DTYPES.append(getattr(torch, _n))
_SHAPE_FLAG = 1 << 62
_NONE = -1


def digest(*parts):
    """A signed 64-bit digest of strings / bytes (deterministic across processes, unlike hash())."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(p if isinstance(p, (bytes, bytearray, memoryview)) else str(p).encode())
        h.update(b"\x1f")
    return struct.unpack("<q", h.digest())[0]


def dtype_code(dt):
    if dt is None:
        return _NONE
    try:
        return _DTYPES.index(dt)
    except ValueError:
        return 1000 + (digest(str(dt)) & 0xffff)


def _dtype_text(code):
    if code == _NONE:
        return "none"
    return str(_DTYPES[code]) if 0 <= code < len(_DTYPES) else f"dtype #{code}"


def shape_code(shape):
    """A tensor's shape as one int64: three dims of up to 20 bits packed (readable in the error), else a
    digest of the whole shape."""
    if shape is None:
        return _NONE
    dims = [int(s) for s in shape]
    if len(dims) <= 3 and all(0 <= s < (1 << 20) for s in dims):
        v = _SHAPE_FLAG | (len(dims) << 60)
        for i, s in enumerate(dims):
            v |= s << (20 * i)
        return v
    return digest("shape", dims) & ~_SHAPE_FLAG


def _shape_text(v):
    if v == _NONE:
        return "None"
    if v & _SHAPE_FLAG:
        n = (v >> 60) & 3
        return "(" + ", ".join(str((v >> (20 * i)) & 0xfffff) for i in range(n)) + ("," if n == 1 else "") + ")"
    return f"shape #{v & 0xffffffff:08x}"


def float_code(x):
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _float_text(v):
    return repr(struct.unpack("<d", struct.pack("<q", v))[0])


_TEXT = {"int": str, "dtype": _dtype_text, "shape": _shape_text, "float": _float_text,
         "bool": lambda v: str(bool(v)), "digest": lambda v: f"#{v & 0xffffffff:08x}"}


class Claim:
    """What this rank is about to run: named int64 fields every rank must have equal, and (a plan) the per-peer
    digests of its splits and the forwarding phases its own plan uses."""

    __slots__ = ("call", "fields", "send", "recv", "fwd_bits")

    def __init__(self, call):
        self.call = call
        self.fields = []  # (name, value, kind, hint)
        self.send = self.recv = None
        self.fwd_bits = 0

    def add(self, name, value, kind="int", hint=""):
        self.fields.append((name, int(value), kind, hint))
        return self

    def plan(self, tp):
        """The fields of a TorchPlan: its digest, P and S, and its split digests and forwarding bits."""
        self.add("plan", tp.digest, "digest", " (another mask, solver, Session or plan text)")
        self.add("P", tp.cp_size)
        self.add("S", tp.seqlen)
        self.send, self.recv = tp.split_digests
        self.fwd_bits = tp.own_forwarding_bits
        return self

    def vector(self, size, err):
        if len(self.fields) > MAX_FIELDS:
            raise AssertionError("agreement: too many fields")
        v = [1 if err else 0, _CALLS[self.call], 0 if err else len(self.fields)]
        v += [0 if err else f[1] for f in self.fields] + [0] * (MAX_FIELDS - len(self.fields))
        bits = self.fwd_bits
        v += [(bits >> (63 * i)) & ((1 << 63) - 1) for i in range(FWD_WORDS)]
        for d in (self.send, self.recv):
            v += list(d) if d is not None and not err and len(d) == size else [0] * size
        return v


# id(group) -> (weak reference to the group, its device types). Weak: a group the cache kept alive after
# destroy_process_group kept gloo's worker threads running into the interpreter's exit, where one of them released
# a tensor's Python object without the GIL and aborted the process ("terminate called without an active exception").
_DEVICE_TYPES = {}


def group_device_types(g):
    """{device type: backend name} of a process group ('gloo', 'nccl', ...), from what torch registers
    (cached per group, weakly); a group that serves its collectives itself says it."""
    if getattr(g, "cpsched_group", False) is True:
        return g.device_types
    hit = _DEVICE_TYPES.get(id(g))
    if hit is not None and hit[0]() is g:
        return hit[1]
    out = _device_types(g)
    try:
        _DEVICE_TYPES[id(g)] = (weakref.ref(g, lambda _r, k=id(g): _DEVICE_TYPES.pop(k, None)), out)
    except TypeError:  # an object without weak references is not cached
        pass
    return out


def _device_types(g):
    out = {}
    for dt in ("cpu", "cuda"):
        try:
            b = g._get_backend(torch.device(dt))
            name = b.name() if hasattr(b, "name") else type(b).__name__
            out[dt] = str(name).lower().replace("processgroup", "")
        except Exception:  # noqa: BLE001 - no backend for that device type (or an older torch)
            pass
    if not out:
        name = str(dist.get_backend(g)).lower()
        for part in name.split(","):
            if ":" in part:
                dt, b = part.split(":", 1)
                out[dt.strip()] = b.strip()
            elif part in ("gloo",):
                out["cpu"] = part
            elif part in ("nccl",):
                out["cuda"] = part
    return out


def default_check(g):
    """check_peers=None: on where the agreement runs on the CPU (the group has a CPU backend), else off (an
    NCCL-only group, where it would make the host wait for the device every call; docs/torch.md)."""
    return g is not None and "cpu" in group_device_types(g)


def _check_flag(v, name):
    if v is None or isinstance(v, bool):
        return v
    raise ValueError(f"{name}: expected True, False or None, got {v!r}")


def exchange(claim, err, g, rank, size, device):
    """The agreement: all_gather every rank's claim; raises the same ValueError on every rank when one rejected
    its inputs or the claims differ. Returns the OR of the ranks' forwarding bits."""
    vec = claim.vector(size, err)
    dev = torch.device("cpu") if "cpu" in group_device_types(g) else torch.device(device)
    t = torch.tensor(vec, dtype=torch.int64, device=dev)
    parts = [torch.empty_like(t) for _ in range(size)]
    _all_gather(parts, t, g)
    rows = torch.stack(parts).cpu().tolist()
    if err:
        raise ValueError(err)
    bad = [r for r in range(size) if rows[r][0]]
    if bad:
        raise ValueError(f"rank(s) {bad} of the group rejected their inputs (their ValueError names what is wrong); "
                         f"rank {rank} stopped before any collective of the call")
    compare(rows, claim, size)
    bits = 0
    at = _HEAD + MAX_FIELDS
    for r in range(size):
        for i in range(FWD_WORDS):
            bits |= rows[r][at + i] << (63 * i)
    return bits


def compare(rows, claim, size):
    """Raises the agreement's ValueError when the ranks' claims (rows of their vectors) differ."""
    calls = [rows[r][1] for r in range(size)]
    if len(set(calls)) > 1:
        raise ValueError("the ranks of the group are in different calls, no collective was issued: " +
                         _groups(calls, lambda c: _CALL_NAMES.get(c, f"call #{c}")))
    msgs = []
    nf = [rows[r][2] for r in range(size)]
    if len(set(nf)) > 1:
        msgs.append("the number of fields: " + _groups(nf, str))
    else:
        for i, (name, _, kind, hint) in enumerate(claim.fields):
            vals = [rows[r][_HEAD + i] for r in range(size)]
            if len(set(vals)) > 1:
                msgs.append(f"{name}{hint}: " + _groups(vals, _TEXT[kind]))
    if not msgs and claim.send is not None:
        at = _HEAD + MAX_FIELDS + FWD_WORDS
        pairs = [(r, p) for r in range(size) for p in range(size)
                 if p != r and rows[r][at + p] != rows[p][at + size + r]]
        if pairs:
            shown = ", ".join(f"{r} -> {p}" for r, p in pairs[:8]) + (" ..." if len(pairs) > 8 else "")
            msgs.append(f"plan: what a rank's plan sends a peer differs from what the peer's plan expects from it "
                        f"(sender -> receiver: {shown}); the ranks' own plans do not belong to one plan")
    if msgs:
        raise ValueError(f"the ranks of the group are not about to run the same {claim.call} (no collective was "
                         f"issued): " + "; ".join(msgs))


def _groups(vals, text):
    """'rank 0 a; ranks [1, 2] b' for the ranks' values, the largest group last."""
    by = {}
    for r, v in enumerate(vals):
        by.setdefault(v, []).append(r)
    parts = sorted(by.items(), key=lambda kv: (len(kv[1]), kv[1][0]))
    return ", ".join((f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs}") + f" {text(v)}" for v, rs in parts)


def scale_value(scale, default):
    """(error text or None, the softmax scale as a float): a finite real number (int, float, a numpy scalar or a
    one-element real tensor; not a bool, complex or NaN), `default` for None."""
    if scale is None:
        return None, float(default)
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or scale.is_complex() or scale.dtype == torch.bool:
            return f"softmax_scale: expected a finite real number, got a tensor of shape {tuple(scale.shape)} " \
                   f"and dtype {scale.dtype}", None
        scale = scale.item()
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        return f"softmax_scale: expected a finite real number, got {scale!r} ({type(scale).__name__})", None
    x = float(scale)
    if not math.isfinite(x):
        return f"softmax_scale: expected a finite real number, got {scale!r}", None
    return None, x
