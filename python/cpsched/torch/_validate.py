"""Validation of a plan given as text (`TorchPlan.from_json`) before any rank uses it.

The rules are the plan format's (docs/plan_format.md) and the validator's: every field has its type and range,
every split its range, every collective's outputs are exactly the inputs its sources name it in (to the row
and the head group), args read only rows that have arrived by their stage and are reduced after they ran, and
the args of each pass compute the mask exactly: every unmasked (query, key, head group) entry once, no masked
one. The last is proven with a sketch: with random weights a(q, g) and b(k, g) modulo a prime, the sum over the
args' entries must equal the sum over the mask's (two independent sketches; a plan that differs from the mask
passes with probability below 1e-18). It is linear in the args' rows, so a rank checks every rank's plan: every
rank gets the same text and raises the same error, naming the field.

A plan of a token top-k mask is checked in everything but the last (its selections are not in the text): its
index entries must be rows of the arg's buffer that have arrived, none repeated in a query's row.
"""
from __future__ import annotations

import numpy as np

from . import _program

_TYPES = ("full", "causal", "inv_causal", "bi_causal")
_PRIMES = (2147483647, 2147483629)  # two primes below 2^31: products of residues fit in int64
_MAX = 1 << 40  # no count in a plan comes near this; larger numbers are garbage


class PlanError(ValueError):
    pass


def _fail(path, msg):
    raise PlanError(f"plan: {path}: {msg}")


def _int(x, path, lo=None, hi=None):
    if isinstance(x, bool) or not isinstance(x, int):
        _fail(path, f"expected an integer, got {x!r}")
    if lo is not None and x < lo:
        _fail(path, f"{x} is below {lo}")
    if hi is not None and x > hi:
        _fail(path, f"{x} is above {hi}")
    if abs(x) > _MAX:
        _fail(path, f"{x} is out of range")
    return x


def _bool(x, path):
    if not isinstance(x, bool):
        _fail(path, f"expected true or false, got {x!r}")
    return x


def _list(x, path, n=None):
    if not isinstance(x, list):
        _fail(path, f"expected a list, got {type(x).__name__}")
    if n is not None and len(x) != n:
        _fail(path, f"expected {n} entries, got {len(x)}")
    return x


def _dict(x, path):
    if not isinstance(x, dict):
        _fail(path, f"expected an object, got {type(x).__name__}")
    return x


def _key(d, k, path):
    if k not in d:
        _fail(f"{path}.{k}" if path else k, "missing")
    return d[k]


def _range(x, path, lo, hi, what):
    _list(x, path, 2)
    b = _int(x[0], f"{path}[0]")
    e = _int(x[1], f"{path}[1]")
    if not lo <= b <= e <= hi:
        _fail(path, f"[{b}, {e}) is not a range inside {what} [{lo}, {hi})")
    return b, e


def _ints(x, path, lo=None, hi=None):
    """A list of integers as an int64 array, each checked."""
    _list(x, path)
    for i, v in enumerate(x):
        if isinstance(v, bool) or not isinstance(v, int):
            _fail(f"{path}[{i}]", f"expected an integer, got {v!r}")
    try:
        a = np.array(x, dtype=np.int64)
    except OverflowError:
        _fail(path, "an entry is out of range")
    if len(a):
        if lo is not None and a.min() < lo:
            i = int(np.argmin(a))
            _fail(f"{path}[{i}]", f"{int(a[i])} is below {lo}")
        if hi is not None and a.max() > hi:
            i = int(np.argmax(a))
            _fail(f"{path}[{i}]", f"{int(a[i])} is above {hi}")
    return a


def _slices(lst, path, S):
    out = []
    for i, sl in enumerate(_list(lst, path)):
        p = f"{path}[{i}]"
        _dict(sl, p)
        qb, qe = _range(_key(sl, "q", p), p + ".q", 0, S, "the sequence")
        kb, ke = _range(_key(sl, "k", p), p + ".k", 0, S, "the sequence")
        t = _key(sl, "type", p)
        if t not in _TYPES:
            _fail(p + ".type", f"expected one of {list(_TYPES)}, got {t!r}")
        out.append((qb, qe, kb, ke, _TYPES.index(t)))
    return out


def row_spans(t, lq, lk):
    """Per row i < lq of a slice or arg of type t over lq x lk, its columns [lo, hi) (int64 arrays)."""
    i = np.arange(lq, dtype=np.int64)
    d = lk - lq
    if t == 0:
        return np.zeros(lq, np.int64), np.full(lq, lk, np.int64)
    if t == 1:
        return np.zeros(lq, np.int64), np.clip(i + d + 1, 0, lk)
    if t == 2:
        return np.minimum(i, lk), np.full(lq, lk, np.int64)
    return np.minimum(i, lk), np.clip(i + d + 1, np.minimum(i, lk), lk)


class _Weights:
    """The sketch's random weights per token and head group, for one prime."""

    def __init__(self, S, G, p, seed):
        rng = np.random.default_rng(seed)
        self.p = p
        self.a = rng.integers(1, p, S, dtype=np.int64)   # query token
        self.b = rng.integers(1, p, S, dtype=np.int64)   # key token
        self.c = rng.integers(1, p, G, dtype=np.int64)   # query head group
        self.e = rng.integers(1, p, G, dtype=np.int64)   # key head group
        self.bpre = np.concatenate([[0], np.cumsum(self.b)])  # < 2^31 x S: no overflow for S < 2^32


def _mask_sketch(W, slices, S, path):
    """sum over the mask's entries of a(q) b(k) mod p, and its area; slices may not overlap."""
    p = W.p
    qs, los, his = [], [], []
    area = 0
    for qb, qe, kb, ke, t in slices:
        lo, hi = row_spans(t, qe - qb, ke - kb)
        keep = hi > lo
        qs.append(np.arange(qb, qe, dtype=np.int64)[keep])
        los.append(lo[keep] + kb)
        his.append(hi[keep] + kb)
        area += int((hi - lo)[keep].sum())
    if not qs:
        return 0, 0
    q, lo, hi = np.concatenate(qs), np.concatenate(los), np.concatenate(his)
    order = np.lexsort((lo, q))
    q, lo, hi = q[order], lo[order], hi[order]
    same = q[1:] == q[:-1]
    if bool((same & (lo[1:] < hi[:-1])).any()):
        j = int(np.nonzero(same & (lo[1:] < hi[:-1]))[0][0])
        _fail(path, f"two slices overlap in query row {int(q[j])} (keys [{int(lo[j + 1])}, {int(hi[j])})): an entry "
                    f"would count twice")
    rowsum = (W.bpre[hi] - W.bpre[lo]) % p
    return int(((W.a[q] % p) * rowsum % p).sum() % p), area


def validate_plan(d):
    """Raises PlanError (a ValueError) naming the first field of the plan `d` (parsed JSON) that is wrong."""
    _dict(d, "the plan")
    fmt = d.get("format")
    if fmt is not None and fmt != "cpsched-plan/1":
        _fail("format", f"expected 'cpsched-plan/1', got {fmt!r}")
    pr = _dict(_key(d, "problem", ""), "problem")
    S = _int(_key(pr, "seqlen", "problem"), "problem.seqlen", 1, (1 << 31) - 1)
    P = _int(_key(pr, "cp_size", "problem"), "problem.cp_size", 1, 1 << 16)
    hq = _int(_key(pr, "heads_q", "problem"), "problem.heads_q", 1, 1 << 16)
    hkv = _int(_key(pr, "heads_kv", "problem"), "problem.heads_kv", 1, hq)
    if hq % hkv:
        _fail("problem.heads_q", f"{hq} query heads are not a multiple of the {hkv} KV heads")
    dqk = _int(_key(pr, "head_dim", "problem"), "problem.head_dim", 1, 1 << 16)
    dv = _int(pr.get("head_dim_v", dqk), "problem.head_dim_v", 0, 1 << 16) or dqk
    shared = _bool(pr.get("kv_shared", False), "problem.kv_shared")
    if shared and dv > dqk:
        _fail("problem.head_dim_v", f"a shared latent's V ({dv} dims) must fit in its {dqk} dims")
    b = _int(_key(pr, "dtype_bytes", "problem"), "problem.dtype_bytes")
    if b not in (1, 2, 4, 8):
        _fail("problem.dtype_bytes", f"expected 1, 2, 4 or 8, got {b}")
    G = _int(_key(pr, "head_groups", "problem"), "problem.head_groups", 1, hkv)
    flat = _bool(_key(pr, "flatten_head_groups", "problem"), "problem.flatten_head_groups")
    if G != (hkv if flat else 1):
        _fail("problem.head_groups", f"{G} head groups, but {'flattened' if flat else 'unflattened'} groups of "
                                     f"{hkv} KV heads are {hkv if flat else 1}")
    _int(pr.get("blocks_per_rank", 1), "problem.blocks_per_rank", 1, 1 << 20)
    host = _list(_key(pr, "host_ranges", "problem"), "problem.host_ranges", P)
    hr = []
    for r, rs in enumerate(host):
        hr.append([_range(x, f"problem.host_ranges[{r}][{i}]", 0, S, "the sequence")
                   for i, x in enumerate(_list(rs, f"problem.host_ranges[{r}]"))])
    flat_ranges = sorted((b_, e_, r) for r, rs in enumerate(hr) for b_, e_ in rs if e_ > b_)
    at = 0
    for b_, e_, r in flat_ranges:
        if b_ != at:
            _fail(f"problem.host_ranges[{r}]", f"the ranks' ranges do not cover the sequence once: token {min(at, b_)} "
                                               f"is {'hosted twice' if b_ < at else 'hosted by no rank'}")
        at = e_
    if at != S:
        _fail("problem.host_ranges", f"the ranks' ranges end at token {at}, the sequence has S = {S}")
    mask = _slices(pr.get("mask", []), "problem.mask", S)
    for key in ("index_mask", "index_summary"):
        if pr.get(key) is not None:
            _dict(pr[key], f"problem.{key}")
    head_masks = None
    if pr.get("head_masks") is not None:
        hm = _list(pr["head_masks"], "problem.head_masks", hkv)
        head_masks = [_slices(m, f"problem.head_masks[{h}]", S) for h, m in enumerate(hm)]
        if not flat and any(m != head_masks[0] for m in head_masks):
            _fail("problem.head_masks", "the KV heads' masks differ, but the head groups are not flattened")
    N = _int(_key(d, "stages", ""), "stages", 0, 1 << 12)
    if "local_tail" in d:
        _bool(d["local_tail"], "local_tail")
    ranks = _list(_key(d, "ranks", ""), "ranks")
    if len(ranks) == P:
        which = list(range(P))
    elif len(ranks) == 1:
        _dict(ranks[0], "ranks[0]")
        which = [_int(_key(ranks[0], "rank", "ranks[0]"), "ranks[0].rank", 0, P - 1)]
    else:
        _fail("ranks", f"expected the plans of all P = {P} ranks or of one rank, got {len(ranks)} entries")
    for i, r in enumerate(which):
        e = _dict(ranks[i], f"ranks[{i}]")
        if "rank" in e and _int(e["rank"], f"ranks[{i}].rank") != r:
            _fail(f"ranks[{i}].rank", f"entry {i} of the plans of all ranks names rank {e['rank']}")
    L = [sum(e_ - b_ for b_, e_ in rs) for rs in hr]
    glob = [np.concatenate([np.arange(b_, e_, dtype=np.int64) for b_, e_ in rs]) if rs else np.zeros(0, np.int64)
            for rs in hr]
    gmin = 0 if flat else -1
    cache = {}
    for pass_ in ("fwd", "bwd"):
        passes = {}
        for i, r in enumerate(which):
            passes[r] = _pass(ranks[i], f"ranks[{i}].{pass_}", pass_, r, P, N, L[r], gmin, G)
        full = len(which) == P
        if full:
            _cross(passes, pass_, P, N)
        has_index = False
        for i, r in enumerate(which):
            has_index |= _args(passes[r], f"ranks[{i}].{pass_}", pass_, N, L[r], gmin, G)
        if full and not has_index and pr.get("index_mask") is None and pr.get("index_summary") is None:
            _coverage(passes, pass_, P, S, G, flat, glob, mask if head_masks is None else None, head_masks, cache)


def _coll(c, path, P, r, lo_rows, first, gmin, G):
    """One COLLECTIVE: its lists, sizes equal to ranges inside the buffer, destinations and sources."""
    _dict(c, path)
    sizes = _ints(_key(c, "input_split_sizes", path), path + ".input_split_sizes", 0)
    n = len(sizes)
    ranges = _list(_key(c, "input_ranges", path), path + ".input_ranges", n)
    groups = _ints(_key(c, "input_groups", path), path + ".input_groups", gmin, G - 1)
    _list(c["input_groups"], path + ".input_groups", n)
    dst = _list(_key(c, "dst_indices", path), path + ".dst_indices", n)
    rng = []
    for i in range(n):
        b_, e_ = _range(ranges[i], f"{path}.input_ranges[{i}]", 0, lo_rows,
                        "the local buffer" if first else "the stage's first-phase receive rows")
        if e_ - b_ != sizes[i]:
            _fail(f"{path}.input_split_sizes[{i}]", f"{int(sizes[i])} rows, but its range [{b_}, {e_}) has {e_ - b_}")
        ds = _ints(dst[i], f"{path}.dst_indices[{i}]", 0, P - 1)
        if len(ds) == 0 or (len(ds) > 1 and bool((ds[1:] <= ds[:-1]).any())) or r in ds:
            _fail(f"{path}.dst_indices[{i}]", f"expected ascending ranks other than {r}, at least one, got {ds.tolist()}")
        rng.append((b_, e_, ds.tolist()))
    osz = _ints(_key(c, "output_split_sizes", path), path + ".output_split_sizes", 0)
    src = _ints(_key(c, "src_index", path), path + ".src_index", 0, P - 1)
    _list(c["src_index"], path + ".src_index", len(osz))
    og = _ints(_key(c, "output_groups", path), path + ".output_groups", gmin, G - 1)
    _list(c["output_groups"], path + ".output_groups", len(osz))
    if bool((src == r).any()):
        _fail(path + ".src_index", f"rank {r} receives from itself")
    if len(src) > 1 and bool((src[1:] < src[:-1]).any()):
        _fail(path + ".src_index", "output splits must be ordered by source rank")
    return {"sizes": sizes, "ranges": rng, "groups": groups, "osz": osz, "src": src, "og": og}


def _pass(entry, path, pass_, r, P, N, L, gmin, G):
    e = _dict(_key(entry, pass_, path.rsplit(".", 1)[0]), path)
    calc = _dict(_key(e, "calc", path), path + ".calc")
    comm = _dict(_key(e, "comm", path), path + ".comm")
    stages = _list(_key(comm, "stages", path + ".comm"), path + ".comm.stages", N)
    out = {"stages": [], "qo_end": [0], "kv_end": [0]}
    for s, st in enumerate(stages):
        p = f"{path}.comm.stages[{s}]"
        _dict(st, p)
        one = {}
        for kind in ("qo", "kv"):
            n = _int(_key(st, f"num_remote_{kind}_tokens", p), f"{p}.num_remote_{kind}_tokens", 0)
            off = _int(_key(st, f"{kind}_recv_offset", p), f"{p}.{kind}_recv_offset", 0)
            if off != out[f"{kind}_end"][-1]:
                _fail(f"{p}.{kind}_recv_offset", f"{off}, but the stages before end at row "
                                                 f"{out[f'{kind}_end'][-1]} of the remote buffer")
            c = _coll(_key(st, kind, p), f"{p}.{kind}", P, r, L, True, gmin, G)
            first = int(c["osz"].sum())
            fw = None
            if st.get(f"{kind}_fwd") is not None:
                fw = _coll(st[f"{kind}_fwd"], f"{p}.{kind}_fwd", P, r, first, False, gmin, G)
            got = first + (int(fw["osz"].sum()) if fw is not None else 0)
            if got != n:
                _fail(f"{p}.num_remote_{kind}_tokens", f"{n}, but the output splits hold {got} rows")
            after = _int(_key(st, f"{kind}_reduce_after", p), f"{p}.{kind}_reduce_after", 0, N)
            if n and after < s + 1:
                _fail(f"{p}.{kind}_reduce_after", f"{after}: stage {s + 1} receives {kind.upper()} rows, so its reduce "
                                                  f"comes after a stage in [{s + 1}, {N}]")
            one[kind] = (c, fw, off, n, after)
            out[f"{kind}_end"].append(off + n)
        out["stages"].append(one)
    out["program"] = _program_of(e, path, pass_, [one["qo"][4] for one in out["stages"]],
                                 [one["kv"][4] for one in out["stages"]])
    local = _list(_key(calc, "local_attn_args", path + ".calc"), path + ".calc.local_attn_args")
    remote = _list(_key(calc, "remote_attn_args", path + ".calc"), path + ".calc.remote_attn_args", N)
    out["args"] = [local] + [_list(x, f"{path}.calc.remote_attn_args[{s}]") for s, x in enumerate(remote)]
    out["pool"] = calc.get("indices")
    out["deferred"] = _int(calc.get("deferred_index_entries", 0), path + ".calc.deferred_index_entries", 0)
    return out


def _program_of(e, path, pass_, qo_after, kv_after):
    """The pass's program (plan/program.hpp): required (an executor runs the plan's order, it makes none), each
    instruction parsed, and runnable as the core's program_error checks."""
    texts = _list(_key(e, "program", path), path + ".program")
    prog = []
    for k, t in enumerate(texts):
        try:
            prog.append(_program.parse(t))
        except ValueError as err:
            _fail(f"{path}.program[{k}]", str(err))
    bad = _program.error(prog, qo_after, kv_after, pass_)
    if bad is not None:
        _fail(f"{path}.program[{bad[0]}]" if bad[0] < len(prog) else f"{path}.program", bad[1])
    return prog


def _cross(passes, pass_, P, N):
    """Every receiver's output splits from a source are exactly the source's input splits naming it, in order
    (first phase and forwarding phase), and reduce points are the same on every rank."""
    # every rank issues the collectives in the same order (they meet in them)
    order0 = _program.collectives(passes[0]["program"])
    for r in range(1, P):
        order = _program.collectives(passes[r]["program"])
        if order != order0:
            j = next((j for j, (a, b_) in enumerate(zip(order, order0)) if a != b_), min(len(order), len(order0)))
            k = [i for i, x in enumerate(passes[r]["program"]) if x.op in ("cast", "reduce")]
            _fail(f"ranks[{r}].{pass_}.program" + (f"[{k[j]}]" if j < len(k) else ""),
                  f"its collectives are issued in another order than rank 0's: collective {j} is "
                  f"{str(order[j]) if j < len(order) else 'missing'}, rank 0's is "
                  f"{str(order0[j]) if j < len(order0) else 'missing'}")
    for s in range(N):
        for kind in ("qo", "kv"):
            afters = {passes[r]["stages"][s][kind][4] for r in range(P)}
            if len(afters) > 1:
                _fail(f"ranks[*].{pass_}.comm.stages[{s}].{kind}_reduce_after",
                      f"differs between ranks ({sorted(afters)}); every rank reduces a stage at the same point")
            for phase in (0, 1):
                name = kind if phase == 0 else kind + "_fwd"
                sent = {r: [] for r in range(P)}  # receiver -> [(source, size, group)] in the sources' order
                for src in range(P):
                    c = passes[src]["stages"][s][kind][phase]
                    if c is None:
                        continue
                    for (b_, e_, ds), g in zip(c["ranges"], c["groups"]):
                        for t in ds:
                            sent[t].append((src, e_ - b_, int(g)))
                for r in range(P):
                    c = passes[r]["stages"][s][kind][phase]
                    got = [] if c is None else list(zip(c["src"].tolist(), c["osz"].tolist(), c["og"].tolist()))
                    if got != sent[r]:
                        j = next((j for j, (a, b_) in enumerate(zip(got, sent[r])) if a != b_), min(len(got), len(sent[r])))
                        _fail(f"ranks[{r}].{pass_}.comm.stages[{s}].{name}.output_split_sizes",
                              f"rank {r} expects {got[j] if j < len(got) else 'nothing more'} (source, rows, group) "
                              f"as output split {j}, its sources send it "
                              f"{sent[r][j] if j < len(sent[r]) else 'nothing more'}")


def _remote_rows(passes, r, kind, P, glob, G):
    """(global token, head group) of each row of rank r's remote buffer of `kind`, from every rank's
    collectives (validated by _cross): first-phase rows are the sources' local rows, forwarded rows are rows of
    the relay's receive of the same stage."""
    st_all = passes[r]["stages"]
    total = passes[r][f"{kind}_end"][-1]
    tok = np.full(total, -1, np.int64)
    grp = np.full(total, -1, np.int64)
    first_cache = {}

    def first_rows(rr, s):
        key = (rr, s)
        hit = first_cache.get(key)
        if hit is None:
            parts_t, parts_g = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
            for src in range(P):
                c = passes[src]["stages"][s][kind][0]
                for (b_, e_, ds), g in zip(c["ranges"], c["groups"]):
                    if rr in ds:
                        parts_t.append(glob[src][b_:e_])
                        parts_g.append(np.full(e_ - b_, int(g), np.int64))
            hit = first_cache[key] = (np.concatenate(parts_t), np.concatenate(parts_g))
        return hit
    for s, one in enumerate(st_all):
        c, fw, off, n, _ = one[kind]
        ft, fg = first_rows(r, s)
        parts_t, parts_g = [ft], [fg]
        if fw is not None:
            for src in range(P):
                cf = passes[src]["stages"][s][kind][1]
                if cf is None:
                    continue
                st_, sg = first_rows(src, s)
                for (b_, e_, ds), g in zip(cf["ranges"], cf["groups"]):
                    if r in ds:
                        if bool((sg[b_:e_] != g).any()):
                            _fail(f"ranks[{src}].*.comm.stages[{s}].{kind}_fwd.input_groups",
                                  f"forwards rows of another head group than {int(g)}")
                        parts_t.append(st_[b_:e_])
                        parts_g.append(sg[b_:e_])
        t, g = np.concatenate(parts_t), np.concatenate(parts_g)
        tok[off:off + len(t)] = t
        grp[off:off + len(g)] = g
    return tok, grp


def _args(pp, path, pass_, N, L, gmin, G):
    """Every arg's fields, its rows inside its buffers as they stand at its stage, its reduce after it, and an
    index arg's entries. Parses the args into tuples (kept in pp['parsed'])."""
    pool = pp["pool"]
    pool_a = None
    if pool is not None:
        pool_a = _ints(pool, f"{path}.calc.indices", -1)
    parsed = []
    has_index = False
    for s, lst in enumerate(pp["args"]):
        for j, a in enumerate(lst):
            p = f"{path}.calc." + ("local_attn_args" if s == 0 else f"remote_attn_args[{s - 1}]") + f"[{j}]"
            _dict(a, p)
            t = _key(a, "type", p)
            if t not in _TYPES:
                _fail(p + ".type", f"expected one of {list(_TYPES)}, got {t!r}")
            bufs = []
            for side, kind in (("q", "qo"), ("k", "kv")):
                buf = _key(a, f"{side}_buf", p)
                if buf not in ("local", "remote"):
                    _fail(f"{p}.{side}_buf", f"expected 'local' or 'remote', got {buf!r}")
                if s == 0 and buf == "remote":
                    _fail(f"{p}.{side}_buf", "a stage 0 arg reads the local buffer only (nothing has arrived yet)")
                hi = L if buf == "local" else pp[f"{kind}_end"][s]
                what = "the local buffer" if buf == "local" else f"the remote {kind.upper()} rows received by stage {s}"
                bufs.append((buf == "remote",) + _range(_key(a, side, p), f"{p}.{side}", 0, hi, what))
            g = _int(_key(a, "group", p), p + ".group", gmin, G - 1)
            if gmin == 0 and g < 0:
                _fail(p + ".group", "-1 (all heads) in a plan with flattened head groups")
            w = _int(a.get("index_width", 0), p + ".index_width", 0, 1 << 30)
            off = _int(a.get("index_offset", -1), p + ".index_offset", -1)
            (qr, q0, q1), (kr, k0, k1) = bufs
            if w:
                has_index = True
                if pool_a is None:
                    if pp["deferred"]:
                        _fail(f"{path}.calc.deferred_index_entries",
                              "the plan's index rows are written from the rank's own top-k rows on their device by "
                              "cpsched.torch.ingest_topk: a plan given as text cannot be run")
                    _fail(f"{path}.calc.indices", "the plan has index args but no index pool (it was exported with "
                                                  "index_rows=False; export it with Result.to_json() to run it)")
                if t != "full":
                    _fail(p + ".type", "an index arg's type is 'full'")
                n = q1 - q0
                if off < 0 or off + n * w > len(pool_a):
                    _fail(p + ".index_offset", f"entries [{off}, {off + n * w}) are outside the pool's {len(pool_a)}")
                rows = pool_a[off:off + n * w].reshape(n, w)
                kb = L if not kr else pp["kv_end"][s]
                if len(rows) and int(rows.max(initial=-1)) >= kb:
                    _fail(f"{path}.calc.indices", f"arg {p}'s entries reach row {int(rows.max())} of a k buffer of {kb} rows")
                srt = np.sort(rows, 1)
                if bool(((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any()):
                    _fail(f"{path}.calc.indices", f"arg {p} reads a key twice in one query's row")
            parsed.append((s, qr, q0, q1, kr, k0, k1, _TYPES.index(t), g, w, off))
            # the rows it reads are reduced after it runs
            for remote, lo, hi, kind in ((qr, q0, q1, "qo"), (kr, k0, k1, "kv")):
                if not remote or hi <= lo or (pass_ == "fwd" and kind == "kv"):
                    continue
                ends = pp[f"{kind}_end"]
                for t_ in range(1, s + 1):
                    if lo < ends[t_] and hi > ends[t_ - 1]:
                        after = pp["stages"][t_ - 1][kind][4]
                        if after < s:
                            _fail(f"{path}.comm.stages[{t_ - 1}].{kind}_reduce_after",
                                  f"{after}, but {p} reads rows of stage {t_} in stage {s}")
    pp["parsed"] = parsed
    pp["pool_a"] = pool_a
    return has_index


def _row_spans_many(t, lq, lk):
    """row_spans of many args at once: per row of every arg (args in order) its arg's index, its row i and
    its columns [lo, hi)."""
    n = lq.astype(np.int64)
    arg = np.repeat(np.arange(len(n)), n)
    first = np.concatenate([[0], np.cumsum(n)[:-1]]) if len(n) else np.zeros(0, np.int64)
    i = np.arange(int(n.sum()), dtype=np.int64) - first[arg]
    tt, q, k = t[arg], lq[arg].astype(np.int64), lk[arg].astype(np.int64)
    d = k - q
    lo = np.where((tt == 2) | (tt == 3), np.minimum(i, k), 0)
    hi = np.where((tt == 1) | (tt == 3), np.clip(i + d + 1, 0, None), k)
    hi = np.maximum(np.minimum(hi, k), lo)
    return arg, i, lo, hi


def _coverage(passes, pass_, P, S, G, flat, glob, mask, head_masks, cache):
    """The pass's args over all ranks compute the mask exactly (the sketch, two primes), and read remote rows
    of their own head group. Per rank the args' rows are expanded at once (numpy), the k side summed by prefix
    sums over the local buffer (per head group) and the remote KV buffer laid end to end."""
    remote = {r: {k: _remote_rows(passes, r, k, P, glob, G) for k in ("qo", "kv")} for r in range(P)}
    arrays = {}
    for r in range(P):
        parsed = passes[r]["parsed"]
        a = np.array([x[1:9] for x in parsed], dtype=np.int64).reshape(-1, 8)
        qr, q0, q1, kr, k0, k1, t, g = a.T
        keep = (q1 > q0) & (k1 > k0)
        qr, q0, q1, kr, k0, k1, t, g = (x[keep] for x in (qr, q0, q1, kr, k0, k1, t, g))
        if not flat:
            g = np.zeros_like(g)
        arg, i, lo, hi = _row_spans_many(t, q1 - q0, k1 - k0)
        qrow = q0[arg] + i
        qtok_r, qgrp_r = remote[r]["qo"]
        is_r = qr[arg] == 1
        qtok = np.where(is_r, qtok_r[np.where(is_r, qrow, 0)] if len(qtok_r) else 0, glob[r][np.where(is_r, 0, qrow)]
                        if len(glob[r]) else 0)
        qgrp = np.where(is_r, qgrp_r[np.where(is_r, qrow, 0)] if len(qgrp_r) else 0, g[arg])
        # remote rows an arg reads are of its head group
        if flat and len(qrow):
            kgrp_r = remote[r]["kv"][1]
            for j in np.nonzero(kr == 1)[0]:  # an arg's remote KV rows, over its whole k range
                if bool((kgrp_r[k0[j]:k1[j]] != g[j]).any()):
                    _fail(f"ranks[{r}].{pass_}.calc", f"an arg of head group {int(g[j])} reads remote KV rows "
                                                      f"[{int(k0[j])}, {int(k1[j])}) of another group")
            bad = is_r & (qgrp != g[arg])
            if bool(bad.any()):
                j = int(arg[np.nonzero(bad)[0][0]])
                _fail(f"ranks[{r}].{pass_}.calc", f"an arg of head group {int(g[j])} reads remote QO rows "
                                                  f"[{int(q0[j])}, {int(q1[j])}) of another group")
        arrays[r] = (arg, lo, hi, qtok, qgrp, kr, k0, g)
    for seed, p in enumerate(_PRIMES):
        W = cache.get(("w", seed))
        if W is None:
            W = cache[("w", seed)] = _Weights(S, G, p, 7 + seed)
        want = 0
        for gg in range(G):
            sl = head_masks[gg] if head_masks is not None else mask
            key = ("m", seed, id(sl))
            m = cache.get(key)
            if m is None:
                m = cache[key] = _mask_sketch(W, sl, S, "problem.head_masks" if head_masks is not None else
                                              "problem.mask")[0]
            want = (want + m * (int(W.c[gg]) * int(W.e[gg]) % p)) % p
        got = 0
        for r in range(P):
            arg, lo, hi, qtok, qgrp, kr, k0, g = arrays[r]
            if not len(arg):
                continue
            # the k side's prefix sums: the local buffer per head group, then the remote KV buffer
            ktok, kgrp = remote[r]["kv"]
            parts = [np.concatenate([[0], np.cumsum(W.b[glob[r]] * int(W.e[gg]) % p)]) for gg in range(G)]
            parts.append(np.concatenate([[0], np.cumsum(W.b[ktok] * W.e[kgrp] % p)]) if len(ktok) else np.zeros(1, np.int64))
            base = np.concatenate([[0], np.cumsum([len(x) for x in parts])[:-1]])
            pre = np.concatenate(parts)
            off = np.where(kr == 1, base[G], base[np.clip(g, 0, G - 1)] if G else 0) + k0
            o = off[arg]
            rs = (pre[o + hi] - pre[o + lo]) % p
            A = W.a[qtok] * W.c[qgrp] % p
            got = (got + int((A * rs % p).sum() % p)) % p
        if got != want:
            _fail(f"ranks[*].{pass_}.calc", "the args do not compute the mask exactly: some entry of the mask is "
                                            "missing or computed twice, or an entry outside it is computed")
