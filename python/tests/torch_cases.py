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


def solve(spec, P, rank):
    """(TorchPlan of this rank, plan JSON text) — the same plan on every rank."""
    kind = spec["mask"]
    if spec.get("solver") == "ilp":  # a time-limited MIP need not be deterministic: rank 0 solves, all run it
        text = [None]
        if rank == 0:
            m = range_mask(spec, P)
            text[0] = session(spec, P).solve(m.q_ranges, m.k_ranges, m.types).to_json()
        dist.broadcast_object_list(text, src=0)
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


def attn_case(rank, P, spec):
    tp, text = solve(spec, P, rank)
    dev = torch.device(spec.get("device", "cpu"))
    q, k, v, do = (None if x is None else x.to(dev) for x in global_inputs(spec, tp.seqlen))
    if spec.get("noncontig"):  # shards with permuted strides (as from a fused projection), layout passed
        sh = lambda x: None if x is None else (  # noqa: E731
            cpt.dispatch(x, tp).transpose(0, 1).contiguous().transpose(0, 1).requires_grad_())
    else:
        sh = lambda x: None if x is None else cpt.dispatch(x, tp).requires_grad_()  # noqa: E731
    ql, kl, vl = sh(q), sh(k), sh(v)
    if spec.get("noncontig"):
        assert not ql.is_contiguous()
        out = cpt.attention(ql, kl, vl, tp, layout=tp.layout, backend=backend_of(spec.get("backend", "auto")))
        dol = cpt.dispatch(do, tp).transpose(0, 1).contiguous().transpose(0, 1)
        out.backward(dol)
        return {"rows": tp.layout.global_index(rank).numpy(), "out": _np(out), "dq": _np(ql.grad),
                "dk": _np(kl.grad), "dv": _np(vl.grad), "plan": text if rank == 0 else None, "relays": tp.relays,
                "layout_sequential": tp.layout.sequential, "stages": tp.num_stages}
    if spec.get("module"):
        if spec["mask"] == "topk":
            idx = torch.from_numpy(topk_indices(spec, P))[tp.layout.global_index(rank)].to(dev)
            # summaries: the module's Session knows its rank, so ingest_topk exchanges per-rank summaries
            mod = cpt.DistAttention(session(spec, P, rank if spec.get("summaries") else None))
            out = mod(ql, kl, vl, idx, backend=spec.get("backend", "auto"))
            if spec.get("summaries"):
                assert mod.last_plan.result.solver == "owner" and len(json.loads(mod.last_plan.result.to_json())["ranks"]) == 1
        else:
            m = range_mask(spec, P)
            mod = cpt.DistAttention(session(spec, P))
            out = mod(ql, kl, vl, (m.q_ranges, m.k_ranges, m.types), backend=spec.get("backend", "auto"),
                      layout=cpt.layout_of(ql))
            out2 = mod(ql, kl, vl, (m.q_ranges, m.k_ranges, m.types), layout=cpt.layout_of(ql))
            assert torch.equal(out, out2) and mod.hits == 1 and mod.misses == 1, (mod.hits, mod.misses)
    else:
        out = cpt.attention(ql, kl, vl, tp, backend=backend_of(spec.get("backend", "auto")))
    out.backward(cpt.dispatch(do, tp))
    return {"rows": tp.layout.global_index(rank).numpy(), "out": _np(out), "dq": _np(ql.grad), "dk": _np(kl.grad),
            "dv": _np(vl.grad) if vl is not None else None, "plan": text if rank == 0 else None,
            "relays": tp.relays, "layout_sequential": tp.layout.sequential, "stages": tp.num_stages,
            "local_tail": tp.local_tail}


def reference(spec, P, plan_text):
    """Dense single-process out, dq, dk, dv (fp64, autograd over the whole sequence with the boolean mask)."""
    d = json.loads(plan_text)
    S = int(d["problem"]["seqlen"])
    if spec["mask"] == "topk":
        mask = topk_matrix(topk_indices(spec, P))
    elif spec["mask"] == "block_topk":
        mask = plan_mask(d)
    else:
        m = range_mask(spec, P)
        mask = mask_matrix(m.q_ranges, m.k_ranges, m.types, S)
        assert torch.equal(mask, plan_mask(d)[0])
    q, k, v, do = (None if x is None else x.double().requires_grad_() for x in global_inputs(spec, S))
    h = _heads(spec)
    vv = k[..., :h["dim_v"]] if h.get("kv_shared") else v
    out = dense_attention(q, k, vv, mask)
    out.backward(do.detach())
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": None if v is None else v.grad}


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


# ---- a torch stand-in for flash-attn's varlen kernels (the flash backend's batching, tested on the CPU) ----


def _seqs(cu):
    c = cu.tolist()
    return list(zip(c[:-1], c[1:]))


def varlen_stub(q, k, v, cu_q, cu_k, mq, mk, scale, causal):
    from cpsched.torch._kernels import range_forward
    o = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype)
    lse = torch.full((q.shape[0], q.shape[1]), float("-inf"))
    for (a, b), (c, d) in zip(_seqs(cu_q), _seqs(cu_k)):
        oo, ll = range_forward(q[a:b], k[c:d], v[c:d], 1 if causal else 0, scale)
        o[a:b], lse[a:b] = oo.to(q.dtype), ll
    return o, lse


def varlen_bwd_stub(do, q, k, v, o, lse, dq, dk, dv, cu_q, cu_k, mq, mk, scale, causal):
    from cpsched.torch._kernels import range_backward
    dq.zero_(), dk.zero_(), dv.zero_()
    for (a, b), (c, d) in zip(_seqs(cu_q), _seqs(cu_k)):
        delta = (do[a:b].float() * o[a:b].float()).sum(-1)
        gq = torch.zeros(b - a, q.shape[1], q.shape[2])
        gk = torch.zeros(d - c, k.shape[1], k.shape[2])
        gv = torch.zeros(d - c, v.shape[1], v.shape[2])
        range_backward(q[a:b], k[c:d], v[c:d], do[a:b], lse[a:b], delta, 1 if causal else 0, scale, gq, gk, gv)
        dq[a:b], dk[c:d], dv[c:d] = gq.to(dq.dtype), gk.to(dk.dtype), gv.to(dv.dtype)


def backend_of(name):
    if name == "flash_stub":
        return cpt.FlashBackend(kernel=varlen_stub, bwd_kernel=varlen_bwd_stub)
    if name == "flex_compiled":
        return cpt.FlexBackend(compile=True)
    return name


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
