"""What the ranks of a torch_pool run, and the single-process reference the tests compare with.

A case is a dict `spec`; every rank builds the same plan and the same global inputs from it (seeded), takes its
shard, runs cpsched.torch's forward and backward and returns its shard's results as numpy arrays. The test
process rebuilds the mask and the inputs from the same spec and computes the dense reference with autograd.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch
import torch.distributed as dist

import cpsched
import cpsched.torch as cpt
from cpsched.torch import _groups
from cpsched.torch.reference import dense_attention, mask_matrix, plan_mask, topk_matrix

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
QUICKSTART = os.path.join(ROOT, "configs", "quickstart.yaml")
NSA = os.path.join(ROOT, "configs", "nsa.yaml")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _heads(spec):
    h = dict(spec.get("heads") or {"q": 4, "kv": 2, "dim": 16})
    h["dtype"] = spec.get("dtype", "fp32")
    return h


def _spr(spec, P):
    return int(spec.get("spr", 1024 // P))


def range_mask(spec, P):
    if spec.get("ranges"):  # explicit slices (q0, q1, k0, k1, type) as fractions of S
        import types as _types_mod
        S = P * _spr(spec, P)
        rs = [(int(a * S), int(b * S), int(c * S), int(d * S), t) for a, b, c, d, t in spec["ranges"]]
        return _types_mod.SimpleNamespace(q_ranges=np.array([[a, b] for a, b, _, _, _ in rs], dtype=np.int64),
                                          k_ranges=np.array([[c, d] for _, _, c, d, _ in rs], dtype=np.int64),
                                          types=[t for *_, t in rs])
    over = {"problem.cp_size": P, "problem.seqlen_per_rank": _spr(spec, P), "problem.mask.kind": spec["mask"],
            "problem.mask.pack": spec.get("pack", 0)}
    over.update(spec.get("mask_over", {}))
    return cpsched.mask_from_config(QUICKSTART, over)


def topk_indices(spec, P):
    S = P * _spr(spec, P)
    k = int(spec.get("topk", 12))
    H = int(spec.get("sel_heads", 1))
    rng = np.random.default_rng(spec.get("seed", 0))
    idx = np.full((S, H, k), -1, dtype=np.int32)
    for q in range(S):
        for h in range(H):
            n = min(k, q + 1)  # the query itself and n - 1 distinct earlier keys: no row is empty
            sel = rng.choice(q, size=n - 1, replace=False) if n > 1 else np.zeros(0, dtype=np.int64)
            idx[q, h, :n] = np.sort(np.append(sel, q))
    return idx


def session(spec, P, rank=None):
    """The case's Session; with `rank`, that rank's own (per-rank plans: top-k summaries)."""
    kw = dict(cp_size=P, seqlen=P * _spr(spec, P), heads=_heads(spec), solver=spec.get("solver", "balanced_bytes"),
              solver_params=spec.get("solver_params"), cost_model=spec.get("cost", "area"),
              stages=spec.get("stages", 1), relay_node_size=spec.get("relay", 0),
              flatten_head_groups=spec.get("flatten", True))
    # static dispatches, and the time cost model's default may: those cases plan the layout.
    dispatching = kw["solver"] == "static" or kw["cost_model"] == "time"
    kw["layout"] = spec.get("layout", "planned" if dispatching else "fixed")
    if rank is not None:
        kw["rank"] = rank
    return cpsched.Session(**kw)


def nsa_session(spec, P):
    h = _heads(spec)
    over = {"problem.cp_size": P, "problem.seqlen_per_rank": _spr(spec, P), "problem.heads.q": h["q"],
            "problem.heads.kv": h["kv"], "problem.heads.dim": h["dim"], "problem.heads.dtype": h["dtype"],
            "problem.mask.nsa_block": 32, "problem.mask.nsa_top": 4, "problem.mask.kv_heads": h["kv"],
            "solver.name": spec.get("solver", "balanced_bytes"), "cost_model.name": spec.get("cost", "area"),
            "plan.stages": spec.get("stages", 1), "problem.mask.seed": spec.get("seed", 42)}
    if spec.get("relay"):
        over["plan.relay"] = "on"
        over["hardware"] = "h100_8x_nvlink"
    return cpsched.Session.from_config(NSA, over)


def solve(spec, P, rank, group=None):
    """(TorchPlan of this rank, plan JSON text) — the same plan on every rank. `group`: the ranks' group (None:
    the world of gloo processes; a cpsched.torch.loopback group for threads)."""
    kind = spec["mask"]
    if spec.get("solver") == "ilp":  # a time-limited MIP need not be deterministic: rank 0 solves, all run it
        text = [None]
        if rank == 0:
            m = range_mask(spec, P)
            text[0] = session(spec, P).solve(m.q_ranges, m.k_ranges, m.types).to_json()
        _groups.broadcast_object_list(text, 0, group)
        return cpt.TorchPlan.from_json(text[0], rank), text[0]
    if kind == "block_topk":
        r = nsa_session(spec, P).solve_config()
    elif kind == "topk":
        r = session(spec, P).solve_topk(topk_indices(spec, P))
    else:
        m = range_mask(spec, P)
        r = session(spec, P).solve(m.q_ranges, m.k_ranges, m.types)
    return cpt.prepare(r, rank), r.to_json()


def global_inputs(spec, S):
    h = _heads(spec)
    hq, hkv, dqk = h["q"], h["kv"], h["dim"]
    dv = h.get("dim_v") or dqk
    g = torch.Generator().manual_seed(int(spec.get("seed", 0)) + 1234)
    dt = DTYPES[h["dtype"]]
    q = torch.randn(S, hq, dqk, generator=g, dtype=torch.float64).to(dt)
    k = torch.randn(S, hkv, dqk, generator=g, dtype=torch.float64).to(dt)
    v = None if h.get("kv_shared") else torch.randn(S, hkv, dv, generator=g, dtype=torch.float64).to(dt)
    do = torch.randn(S, hq, dv, generator=g, dtype=torch.float64).to(dt)
    return q, k, v, do


def _np(t):
    return None if t is None else t.detach().double().cpu().numpy()


def attn_case(rank, P, spec, group=None):
    """Forward and backward of the case on this rank: its shard's out, dq, dk, dv. `group`: as for solve.
    spec["graphs"]: the calls pass graphs=True (with spec["warnings"], the CPU stand-in of capture is on and
    the warnings the call gave are returned)."""
    if spec.get("warnings"):
        import warnings
        from cpsched.torch import _graphs
        spec = {k: v for k, v in spec.items() if k != "warnings"}
        old = _graphs.RECORD_ON_CPU
        _graphs.RECORD_ON_CPU = True
        try:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                out = attn_case(rank, P, spec, group)
        finally:
            _graphs.RECORD_ON_CPU = old
        out["warnings"] = [str(x.message) for x in w if "graphs=True" in str(x.message)]
        return out
    gkw = {"graphs": True} if spec.get("graphs") else {}
    tp, text = solve(spec, P, rank, group)
    dev = torch.device(spec.get("device", "cpu"))
    q, k, v, do = (None if x is None else x.to(dev) for x in global_inputs(spec, tp.seqlen))
    if spec.get("noncontig"):  # shards with permuted strides (as from a fused projection), layout passed
        sh = lambda x: None if x is None else (  # noqa: E731
            cpt.dispatch(x, tp, group).transpose(0, 1).contiguous().transpose(0, 1).requires_grad_())
    else:
        sh = lambda x: None if x is None else cpt.dispatch(x, tp, group).requires_grad_()  # noqa: E731
    ql, kl, vl = sh(q), sh(k), sh(v)
    if spec.get("noncontig"):
        assert not ql.is_contiguous()
        out = cpt.attention(ql, kl, vl, tp, group, layout=tp.layout, backend=backend_of(spec.get("backend", "auto")),
                            **gkw)
        dol = cpt.dispatch(do, tp, group).transpose(0, 1).contiguous().transpose(0, 1)
        out.backward(dol)
        return {"rows": tp.layout.global_index(rank).numpy(), "out": _np(out), "dq": _np(ql.grad),
                "dk": _np(kl.grad), "dv": _np(vl.grad), "plan": text if rank == 0 else None, "relays": tp.relays,
                "layout_sequential": tp.layout.sequential, "stages": tp.num_stages}
    if spec.get("module"):
        if spec["mask"] == "topk":
            idx = torch.from_numpy(topk_indices(spec, P))[tp.layout.global_index(rank)].to(dev)
            # summaries: the module's Session knows its rank, so ingest_topk exchanges per-rank summaries
            mod = cpt.DistAttention(session(spec, P, rank if spec.get("summaries") else None), group)
            out = mod(ql, kl, vl, idx, backend=spec.get("backend", "auto"), **gkw)
            if spec.get("summaries"):
                assert mod.last_plan.result.solver == "owner" and len(json.loads(mod.last_plan.result.to_json())["ranks"]) == 1
        else:
            m = range_mask(spec, P)
            mod = cpt.DistAttention(session(spec, P), group)
            out = mod(ql, kl, vl, (m.q_ranges, m.k_ranges, m.types), backend=spec.get("backend", "auto"),
                      layout=cpt.layout_of(ql), **gkw)
            out2 = mod(ql, kl, vl, (m.q_ranges, m.k_ranges, m.types), layout=cpt.layout_of(ql), **gkw)
            assert torch.equal(out, out2) and mod.hits == 1 and mod.misses == 1, (mod.hits, mod.misses)
    else:
        out = cpt.attention(ql, kl, vl, tp, group, backend=backend_of(spec.get("backend", "auto")), **gkw)
    out.backward(cpt.dispatch(do, tp, group))
    return {"rows": tp.layout.global_index(rank).numpy(), "out": _np(out), "dq": _np(ql.grad), "dk": _np(kl.grad),
            "dv": _np(vl.grad) if vl is not None else None, "plan": text if rank == 0 else None,
            "relays": tp.relays, "layout_sequential": tp.layout.sequential, "stages": tp.num_stages,
            "local_tail": tp.local_tail}


def _case_mask(spec, P, plan_text, check=True):
    """(S, the case's boolean mask [heads or 1, S, S]) from its spec; with check, a range mask is also compared
    with the plan's own (dense: not at the GPU tests' sizes)."""
    d = json.loads(plan_text)
    S = int(d["problem"]["seqlen"])
    if spec["mask"] == "topk":
        return S, topk_matrix(topk_indices(spec, P))
    if spec["mask"] == "block_topk":
        return S, plan_mask(d)
    m = range_mask(spec, P)
    mask = mask_matrix(m.q_ranges, m.k_ranges, m.types, S).unsqueeze(0)
    assert not check or torch.equal(mask[0], plan_mask(d)[0])
    return S, mask


def reference(spec, P, plan_text):
    """Dense single-process out, dq, dk, dv (fp64, autograd over the whole sequence with the boolean mask)."""
    S, mask = _case_mask(spec, P, plan_text)
    q, k, v, do = (None if x is None else x.double().requires_grad_() for x in global_inputs(spec, S))
    h = _heads(spec)
    vv = k[..., :h["dim_v"]] if h.get("kv_shared") else v
    out = dense_attention(q, k, vv, mask)
    out.backward(do.detach())
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": None if v is None else v.grad}


def reference_on(spec, P, plan_text, device):
    """As reference, computed on `device` in fp32, one KV head at a time (GPU tests at sizes whose dense fp64
    reference would not fit the host): out, dq, dk, dv on the CPU."""
    S, mask = _case_mask(spec, P, plan_text, check=False)
    h = _heads(spec)
    q, k, v, do = (None if x is None else x.to(device).float() for x in global_inputs(spec, S))
    hq, hkv = q.shape[1], k.shape[1]
    r = hq // hkv
    out = torch.empty(S, hq, h.get("dim_v") or h["dim"])
    dq, dk = torch.empty(q.shape), torch.empty(k.shape)
    dv = None if v is None else torch.empty(v.shape)
    for g in range(hkv):
        qs = q[:, g * r:(g + 1) * r].clone().requires_grad_()
        ks = k[:, g:g + 1].clone().requires_grad_()
        vs = None if v is None else v[:, g:g + 1].clone().requires_grad_()
        vv = ks[..., :h["dim_v"]] if h.get("kv_shared") else vs
        mk = (mask[g] if mask.shape[0] > 1 else mask[0]).to(device)
        o = dense_attention(qs, ks, vv, mk, scale=1.0 / float(h["dim"]) ** 0.5)
        o.backward(do[:, g * r:(g + 1) * r])
        out[:, g * r:(g + 1) * r] = o.detach().cpu()
        dq[:, g * r:(g + 1) * r] = qs.grad.cpu()
        dk[:, g:g + 1] = ks.grad.cpu()
        if dv is not None:
            dv[:, g:g + 1] = vs.grad.cpu()
    return {"out": out.double(), "dq": dq.double(), "dk": dk.double(), "dv": None if dv is None else dv.double()}


def assemble(results, key):
    rows = np.concatenate([r["rows"] for r in results])
    parts = [r[key] for r in results]
    if parts[0] is None:
        return None
    cat = np.concatenate(parts)
    out = np.empty_like(cat)
    out[rows] = cat
    return torch.from_numpy(out)


def rel_err(a, b):
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


# ---- byte accounting -----------------------------------------------------------------------------


def bytes_case(rank, P, spec):
    """Bytes this rank's collectives send to other ranks (counted by wrapping dist.all_to_all_single), per
    pass, against the plan: (sent_fwd, sent_bwd, received_fwd, received_bwd)."""
    tp, text = solve(spec, P, rank)
    dev = torch.device(spec.get("device", "cpu"))
    q, k, v, do = (None if x is None else x.to(dev) for x in global_inputs(spec, tp.seqlen))
    counts = {"send": 0, "recv": 0, "calls": 0}
    real = dist.all_to_all_single

    def counting(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        row = int(np.prod(input.shape[1:])) * input.element_size()
        counts["send"] += sum(n for p, n in enumerate(input_split_sizes) if p != rank) * row
        counts["recv"] += sum(n for p, n in enumerate(output_split_sizes) if p != rank) * row
        counts["calls"] += 1
        return real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    sh = lambda x: None if x is None else cpt.dispatch(x, tp).requires_grad_()  # noqa: E731
    ql, kl, vl = sh(q), sh(k), sh(v)
    dist.all_to_all_single = counting
    try:
        out = cpt.attention(ql, kl, vl, tp, backend=spec.get("backend", "torch"))
        fwd = dict(counts)
        counts.update(send=0, recv=0, calls=0)
        out.backward(cpt.dispatch(do, tp))
        bwd = dict(counts)
    finally:
        dist.all_to_all_single = real
    return {"fwd": fwd, "bwd": bwd, "metrics": tp.metrics, "relays": tp.relays, "plan": text if rank == 0 else None,
            "calls": fwd["calls"] + bwd["calls"]}


# ---- errors ----------------------------------------------------------------------------------------


def topk_error_case(rank, P, bad_rank):
    """ingest_topk with per-rank summaries where `bad_rank`'s rows select a key after their query: returns
    this rank's ValueError text (every rank must raise, none may wait in the exchange), or None."""
    spec = {"mask": "topk", "heads": {"q": 4, "kv": 1, "dim": 48, "dim_v": 32, "kv_shared": True}, "spr": 96,
            "topk": 12}
    idx = torch.from_numpy(topk_indices(spec, P))
    lo, hi = (int(x) for x in cpsched._cpsched.sharding_ranges(idx.shape[0], P)[rank])
    mine = idx[lo:hi].clone()
    if rank == bad_rank:
        mine[5, 0, 0] = hi + 3
    try:
        cpt.ingest_topk(mine, session(spec, P, rank))
    except ValueError as e:
        return str(e)
    return None


def error_case(rank, P, what, only_rank=None, check_peers=None):
    """Makes one bad call (on every rank, or only on `only_rank`) and returns the ValueError's text, or None
    when the call went through."""
    spec = {"mask": "causal_document", "solver": "balanced_bytes"}
    tp, _ = solve(spec, P, rank)
    q, k, v, _ = global_inputs(spec, tp.seqlen)
    ql, kl, vl = (cpt.dispatch(x, tp) for x in (q, k, v))
    plan = tp
    group = None
    bad = only_rank is None or only_rank == rank
    kw = {}
    if bad:
        if what == "shape":
            ql = ql[:, :, :-1]
        elif what == "heads":
            kl = torch.cat([kl, kl], dim=1)
        elif what == "dtype":
            vl = vl.double()
        elif what == "dtype_bytes":
            ql, kl, vl = ql.double(), kl.double(), vl.double()
        elif what == "device":
            vl = vl.to("meta")
        elif what == "other_P":
            plan = solve(spec, P + 1, 0)[0]
        elif what == "other_S":
            plan = solve(dict(spec, spr=1024 // P + 16), P, rank)[0]
        elif what == "other_S_plain":  # shards sliced by hand (no layout tag)
            plan = solve(dict(spec, spr=1024 // P + 16), P, rank)[0]
            ql, kl, vl = (x[tp.layout.global_index(rank)] for x in (q, k, v))
        elif what == "group":
            group = dist.new_group(list(range(P - 1))) if rank < P - 1 else None
        elif what in ("layout_missing", "layout_mixed"):
            sp = dict(spec, solver="static", mask="causal")
            plan = solve(sp, P, rank)[0]  # a dispatched layout
            q2, k2, v2, _ = global_inputs(sp, plan.seqlen)
            if what == "layout_missing":  # the right rows, but nothing shows they are
                ql, kl, vl = (x[plan.layout.global_index(rank)] for x in (q2, k2, v2))
            else:  # shards dispatched for another plan (the sequential layout)
                other = solve(dict(sp, solver="balanced_bytes"), P, rank)[0]
                ql, kl, vl = (cpt.dispatch(x, other) for x in (q2, k2, v2))
        elif what == "backend":
            kw["backend"] = "flash"
    elif what == "group":
        group = dist.new_group(list(range(P - 1))) if rank < P - 1 else None
    if what == "group" and rank == P - 1:
        return "not in the group"
    try:
        out = cpt.attention(ql, kl, vl, plan, group=group, check_peers=check_peers, **kw)
    except ValueError as e:
        return str(e)
    return None if out is not None else "no output"


def layout_case(rank, P):
    """dispatch / undispatch round trips and the layout tag."""
    spec = {"mask": "causal", "solver": "static"}
    tp, _ = solve(spec, P, rank)
    S = tp.seqlen
    x = torch.arange(S * 3, dtype=torch.float32).view(S, 3)
    xl = cpt.dispatch(x, tp)
    assert not tp.layout.sequential
    assert torch.equal(xl[:, 0], tp.layout.global_index(rank).float() * 3)
    assert cpt.layout_of(xl) == tp.layout
    back = cpt.undispatch(xl, tp)
    assert torch.equal(back, x)
    # differentiable: the gradient of a replicated loss reaches each rank's shard rows
    xr = x.clone().requires_grad_()
    y = cpt.undispatch(cpt.dispatch(xr, tp) * 2, tp)
    y.sum().backward()
    g = xr.grad.clone()
    dist.all_reduce(g)
    assert torch.equal(g, torch.full_like(x, 2.0)), g
    return True


# ---- the varlen backends on a CPU stand-in with FA2's semantics (fa2_standin.py) ----------------------------


def backend_of(name):
    """A backend object for a case's backend name: 'flash_stub' (the flash backend on the stand-in),
    'aten_stub' (the aten backend on the stand-in, every call also run on the real ops' meta kernels),
    'flex_compiled', or a name cpsched.torch.attention takes."""
    import fa2_standin
    if name == "flash_stub":
        fwd, bwd = fa2_standin.flash_kernels()
        return cpt.FlashBackend(kernel=fwd, bwd_kernel=bwd)
    if name == "aten_stub":
        return cpt.AtenBackend(ops=fa2_standin.MetaChecked(fa2_standin.AtenOps()))
    if name == "aten_stub_triton":  # index args on Triton (TRITON_INTERPRET=1 on the CPU), ranges on the stand-in
        return cpt.AtenBackend(ops=fa2_standin.MetaChecked(fa2_standin.AtenOps()), index="triton")
    if name == "flex_compiled":
        return cpt.FlexBackend(compile=True)
    return name


class CopyComm:
    """Collectives of one rank made of device copies, without peers: each receives the first rows of its own
    send buffer (zeros beyond). Nothing a real plan computes, but a program with every collective's data
    dependency that a CUDA graph (or the CPU stand-in of capture) can hold: tests and benchmarks of
    capture, replay and host time on one device."""

    group = None
    capturable = True

    class _Done:
        def wait(self):
            return None

    def a2a(self, out, inp, out_splits, in_splits):
        n = min(out.shape[0], inp.shape[0])
        out[n:].zero_()
        out[:n].copy_(inp[:n])
        return self._Done()


def remap_case(rank, P, spec):
    """The device-side remap of this rank's top-k rows equals the C++ plan builder's pool, row by row (as
    sets: the order inside a row is free); returns how many index args were compared."""
    idx = torch.from_numpy(topk_indices(spec, P))
    lo, hi = (int(x) for x in cpsched._cpsched.sharding_ranges(idx.shape[0], P)[rank])
    tp = cpt.ingest_topk(idx[lo:hi], session(spec, P), remap="plan")
    pools = cpt.remap_topk(tp, idx, "cpu")
    n = 0
    for pp, pool in ((tp.fwd, pools[0]), (tp.bwd, pools[1])):
        for args in [pp.stage0] + pp.stages:
            for a in args:
                if a.index_width <= 0:
                    continue
                m = (a.q1 - a.q0) * a.index_width
                want = pp.indices[a.index_offset:a.index_offset + m].view(a.q1 - a.q0, -1).sort(1).values
                got = pool[a.index_offset:a.index_offset + m].view(a.q1 - a.q0, -1).sort(1).values
                assert torch.equal(want, got), (rank, a, want, got)
                n += 1
    return n


# ---- the agreement: ranks that disagree, one-rank errors (docs/torch.md, "Errors") -------------------------


def _outcome(fn):
    """'ok' and the call's result, or the ValueError's text (any other exception propagates: a failure)."""
    try:
        return ("ok", fn())
    except ValueError as e:
        return ("error", str(e))


def _dense(q, k, v, mask):
    return dense_attention(q.double(), k.double(), v.double(), mask)


def agree_case(rank, P, what, bad_rank=1):
    """One hostile call of `what` on every rank (rank `bad_rank` differs): ("ok", max error against the
    reference of what this rank was asked) or ("error", the ValueError's text). No rank may wait: the pool's
    timeout fails the test otherwise."""
    S = 96
    g = torch.Generator().manual_seed(5)
    q = torch.randn(S, 4, 16, generator=g)
    k = torch.randn(S, 2, 16, generator=g)
    v = torch.randn(S, 2, 16, generator=g)
    lo, hi = (int(x) for x in cpsched._cpsched.sharding_ranges(S, P)[rank])
    bad = rank == bad_rank
    causal = ([[0, S]], [[0, S]], ["causal"])

    def sess(**kw):
        kw.setdefault("heads", (4, 2, 16, "fp32"))
        return cpsched.Session(cp_size=P, seqlen=S, **kw)

    def err_of(out, mask):
        return rel_err(out.detach().double(), _dense(q, k, v, mask_matrix(*mask, S))[lo:hi])

    if what == "mask_same_splits":  # owner's placement: both masks move 16 KV rows of rank 1 to rank 0
        attn = cpt.DistAttention(sess(solver="owner"))
        m = ([[0, 32]], [[48, 64]], ["full"]) if bad else ([[0, 32]], [[32, 48]], ["full"])
        return _outcome(lambda: err_of(attn(q[lo:hi], k[lo:hi], v[lo:hi], m), m))
    if what == "dtype_same_size":
        tp = cpt.prepare(sess(heads=(4, 2, 16, "bf16")).solve(*causal), rank)
        dt = torch.float16 if bad else torch.bfloat16
        return _outcome(lambda: cpt.attention(q[lo:hi].to(dt), k[lo:hi].to(dt), v[lo:hi].to(dt), tp) is None)
    if what == "invalid_mask":
        attn = cpt.DistAttention(sess())
        m = ([[0, S + 5]], [[0, S]], ["causal"]) if bad else causal
        return _outcome(lambda: err_of(attn(q[lo:hi], k[lo:hi], v[lo:hi], m), causal))
    if what == "session_rank_0":  # every process made Session(rank=0)
        attn = cpt.DistAttention(sess(rank=0))
        return _outcome(lambda: err_of(attn(q[lo:hi], k[lo:hi], v[lo:hi], causal), causal))
    if what in ("scale_complex", "scale_nan", "scale_bool"):
        tp = cpt.prepare(sess().solve(*causal), rank)
        bad_scale = {"scale_complex": 1j, "scale_nan": float("nan"), "scale_bool": True}[what]
        return _outcome(lambda: err_of(cpt.attention(q[lo:hi], k[lo:hi], v[lo:hi], tp,
                                                     softmax_scale=bad_scale if bad else None), causal))
    if what == "requires_grad_one_rank":  # a backward would run on some ranks only
        tp = cpt.prepare(sess().solve(*causal), rank)
        return _outcome(lambda: err_of(cpt.attention(q[lo:hi].requires_grad_(bad), k[lo:hi], v[lo:hi], tp), causal))
    if what in ("undispatch_rows", "undispatch_dtype", "undispatch_width"):
        r = sess(solver="static", layout="planned").solve([[0, 10], [10, 60], [60, S]], [[0, 10], [10, 60], [60, S]],
                                                           ["causal"] * 3)
        x = torch.arange(S, dtype=torch.float32).view(S, 1).expand(S, 3).contiguous()
        xl = cpt.dispatch(x, r)
        if bad:
            xl = {"undispatch_rows": xl[:-1], "undispatch_dtype": xl.double(),
                  "undispatch_width": torch.cat([xl, xl], 1)}[what]
        return _outcome(lambda: bool(torch.equal(cpt.undispatch(xl, r), x)))
    if what == "different_calls":  # rank 1 undispatches while the others run attention
        r = sess().solve(*causal)
        if bad:
            return _outcome(lambda: cpt.undispatch(torch.zeros(hi - lo, 3), r) is None)
        return _outcome(lambda: err_of(cpt.attention(q[lo:hi], k[lo:hi], v[lo:hi], r), causal))
    if what in ("check_peers_str", "return_lse_str"):
        tp = cpt.prepare(sess().solve(*causal), rank)
        kw = {"check_peers": "no"} if what == "check_peers_str" else {"return_lse": "no"}
        return _outcome(lambda: err_of(cpt.attention(q[lo:hi], k[lo:hi], v[lo:hi], tp, **(kw if bad else {})),
                                       causal))
    if what in ("rank_plan_relays", "rank_plan_relays_unchecked"):  # each rank its own plan, relays in nodes of 2
        S2 = 256
        g2 = torch.Generator().manual_seed(6)
        q2, k2, v2, do2 = (torch.randn(S2, h, 16, generator=g2) for h in (4, 2, 2, 4))
        s2 = cpsched.Session(cp_size=P, seqlen=S2, heads=(4, 2, 16, "fp32"), rank=rank, relay_node_size=2, stages=2)
        mask = ([[0, S2]], [[0, S2]], ["full"])
        res = s2.solve(*mask)
        l2, h2 = (int(x) for x in cpsched._cpsched.sharding_ranges(S2, P)[rank])

        def run():
            ql = q2[l2:h2].clone().requires_grad_()
            out = cpt.attention(ql, k2[l2:h2], v2[l2:h2], res,
                                check_peers=False if what == "rank_plan_relays_unchecked" else None)
            out.backward(do2[l2:h2])
            qq = q2.double().requires_grad_()
            ref = _dense(qq, k2, v2, mask_matrix(*mask, S2))
            ref.backward(do2.double())
            return max(rel_err(out.detach().double(), ref.detach()[l2:h2]), rel_err(ql.grad.double(), qq.grad[l2:h2]))
        return _outcome(run)
    if what in ("ingest_mixed_dtype", "ingest_uneven_k"):  # gather="indices": int32 beside int64, k 8 beside 4
        sel = topk_indices({"spr": S // P, "topk": 8}, P)
        mine = torch.from_numpy(sel[lo:hi].astype(np.int64))
        if bad:
            mine = mine.to(torch.int32) if what == "ingest_mixed_dtype" else \
                torch.cat([mine, torch.full((hi - lo, 1, 4), -1, dtype=torch.int64)], 2)  # width 12, same keys
        s1 = sess(heads=(4, 1, 16, "fp32"))
        q1, k1, v1 = q, k[:, :1].contiguous(), v[:, :1].contiguous()

        def run():
            tp = cpt.ingest_topk(mine, s1, gather="indices")
            out = cpt.attention(q1[lo:hi], k1[lo:hi], v1[lo:hi], tp)
            return rel_err(out.double(), _dense(q1, k1, v1, topk_matrix(sel))[lo:hi])
        return _outcome(run)
    if what in ("ingest_heads_mix", "ingest_seqlen_mix"):  # summaries: (1, 2, 1) selection heads; S 99 on a rank
        S1 = 99 if (bad and what == "ingest_seqlen_mix") else S
        s1 = cpsched.Session(cp_size=P, seqlen=S1, heads=(4, 2, 16, "fp32"), rank=rank)
        l1, h1 = (int(x) for x in cpsched._cpsched.sharding_ranges(S1, P)[rank])
        H = 2 if (bad and what == "ingest_heads_mix") else 1
        sel = _topk_rows(S1, H, 8)
        return _outcome(lambda: cpt.ingest_topk(torch.from_numpy(sel[l1:h1]), s1) is None)
    if what == "rank_plan_text_everywhere":  # every rank loads rank 1's own plan as text
        text = sess(rank=1).solve(*causal).to_json()
        tp = cpt.TorchPlan.from_json(text, rank)
        return _outcome(lambda: err_of(cpt.attention(q[lo:hi], k[lo:hi], v[lo:hi], tp), causal))
    if what == "create_graph":  # owner's placement: rank 1 computes nothing of this mask
        mask = ([[0, 32]], [[32, 64]], ["full"])
        tp = cpt.prepare(sess(solver="owner").solve(*mask), rank)

        def run():
            ql = q[lo:hi].clone().requires_grad_()
            out = cpt.attention(ql, k[lo:hi], v[lo:hi], tp)
            gq, = torch.autograd.grad((out * 1.5).sum(), ql, create_graph=True)
            qq = q.double().requires_grad_()
            ref = _dense(qq, k, v, mask_matrix(*mask, S))
            rq, = torch.autograd.grad((ref * 1.5).sum(), qq)
            e = rel_err(gq.detach().double(), rq[lo:hi])
            try:
                gq.sum().backward()
            except RuntimeError as ex:
                return e, str(ex)
            return e, "differentiated twice"
        return _outcome(run)
    raise ValueError(f"agree_case: no case {what!r}")


def _topk_rows(S, H, k, seed=0):
    rng = np.random.default_rng(seed)
    idx = np.full((S, H, k), -1, dtype=np.int32)
    for q in range(S):
        for h in range(H):
            n = min(k, q + 1)
            idx[q, h, :n] = np.sort(rng.choice(q + 1, n, replace=False))
    return idx


# ---- from_json: plans given as text ------------------------------------------------------------------------

_DT_OF_BYTES = {8: torch.float64, 4: torch.float32, 2: torch.bfloat16}


def text_case(rank, P, texts, seed=0):
    """Runs each plan text (validated by from_json) forward and backward on this rank and returns, per text,
    the max relative error of out, dq, dk, dv against the dense reference of the text's own mask and layout,
    or the ValueError's text. The inputs follow the text's problem (heads, dims, dtype)."""
    out = []
    for i, text in enumerate(texts):
        try:
            tp = cpt.TorchPlan.from_json(text, rank)
            d = json.loads(text)
            if tp.dtype_bytes not in _DT_OF_BYTES:  # float8 runs forward only, at float8's precision: not run here
                out.append(("skip", 0.0, f"{tp.dtype_bytes}-byte elements"))
                continue
            dt = _DT_OF_BYTES[tp.dtype_bytes]
            g = torch.Generator().manual_seed(seed + i)
            S = tp.seqlen
            q = torch.randn(S, tp.hq, tp.dqk, generator=g, dtype=torch.float64)
            k = torch.randn(S, tp.hkv, tp.dqk, generator=g, dtype=torch.float64)
            v = None if tp.kv_shared else torch.randn(S, tp.hkv, tp.dv, generator=g, dtype=torch.float64)
            do = torch.randn(S, tp.hq, tp.dv, generator=g, dtype=torch.float64)
            idx = tp.layout.global_index(rank)
            ql, kl = (x[idx].to(dt).requires_grad_() for x in (q, k))
            vl = None if v is None else v[idx].to(dt).requires_grad_()
            o = cpt.attention(ql, kl, vl, tp, layout=tp.layout)
            o.backward(do[idx].to(dt))
            qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
            vv = None if v is None else v.clone().requires_grad_()
            ref = dense_attention(qq, kk, kk[..., :tp.dv] if v is None else vv, plan_mask(d))
            ref.backward(do)
            errs = [rel_err(o.detach().double(), ref.detach()[idx]), rel_err(ql.grad.double(), qq.grad[idx]),
                    rel_err(kl.grad.double(), kk.grad[idx])]
            if v is not None:
                errs.append(rel_err(vl.grad.double(), vv.grad[idx]))
            out.append(("ok", max(errs), str(dt)))
        except ValueError as e:
            out.append(("error", str(e), None))
    return out


# ---- memory ----------------------------------------------------------------------------------------------------


def _live_tensor_bytes():
    import gc
    gc.collect()
    seen, total = set(), 0
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.device.type == "cpu":
                st = o.untyped_storage()
                if st.data_ptr() and st.data_ptr() not in seen:
                    seen.add(st.data_ptr())
                    total += st.nbytes()
        except Exception:  # noqa: BLE001 - objects that are not quite tensors
            pass
    return total


def memory_case(rank, P, steps, spr, layers=2, hq=8, d=32):
    """Bytes of live tensors after each step of `layers` DistAttention layers with a new causal document mask
    per step (the inputs and outputs dropped), beyond those before the first; and q, k, v's bytes."""
    S = P * spr
    s = cpsched.Session(cp_size=P, seqlen=S, heads=(hq, hq, d, "fp32"))
    attns = [cpt.DistAttention(s) for _ in range(layers)]
    lo, hi = (int(x) for x in cpsched._cpsched.sharding_ranges(S, P)[rank])
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(hi - lo, hq, d, generator=g) for _ in range(3))
    rng = np.random.default_rng(0)
    base = _live_tensor_bytes()
    held = []
    for _ in range(steps):
        cuts = np.sort(rng.choice(np.arange(1, S), 7, replace=False))
        r = np.stack([np.concatenate([[0], cuts]), np.concatenate([cuts, [S]])], 1).astype(np.int64)
        for attn in attns:
            ql = q.clone().requires_grad_(True)
            attn(ql, k, v, (r, r.copy(), "causal")).sum().backward()
            del ql
        held.append(_live_tensor_bytes() - base)
    return held, 3 * q.numel() * q.element_size()


def check_results(res, spec, P, tol):
    """Every rank's results (one dict per rank, rank order) against the dense reference of the case: out, dq, dk,
    dv within tol (relative); returns the errors per field."""
    ref = reference(spec, P, res[0]["plan"])
    errs = {}
    for key in ("out", "dq", "dk", "dv"):
        got = assemble(res, key)
        if ref[key] is None:
            assert got is None
            continue
        errs[key] = rel_err(got, ref[key])
    assert max(errs.values()) <= tol, (spec, errs)
    return errs


def check_expected_plan(check, P, spec):
    """A correctness case of the CASES table: check(P, spec) against the dense reference, then what the case
    expects of the plan (relays, a local tail, a dispatched layout)."""
    spec = {k: v for k, v in spec.items() if v is not None}
    expect_relays = spec.pop("expect_relays", False)
    expect_tail = spec.pop("expect_tail", False)
    expect_dispatch = spec.pop("expect_dispatch", spec.get("solver") == "static" or spec.get("cost") == "time")
    r0, _ = check(P, spec)
    if expect_relays:
        assert r0["relays"], "the plan was meant to forward rows through relays"
    if expect_tail:
        assert r0["local_tail"] and r0["stages"] == spec["stages"] + 1, "the plan was meant to end with a local tail"
    if expect_dispatch:
        assert not r0["layout_sequential"], "the plan was meant to dispatch the tokens"
