"""cpsched.torch.attention, dispatch / undispatch and the checks every call makes before any collective."""
from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.distributed as dist

from ._backends import make_backend
from ._exec import Comm, run_backward, run_forward
from ._plan import Layout, TorchPlan

_PLANS: "OrderedDict[tuple, tuple]" = OrderedDict()
_PLAN_CACHE_SIZE = 32
_LAYOUT_ATTR = "_cpsched_layout"


def _result_type():
    from .. import Result
    return Result


def prepare(plan, rank):
    """The TorchPlan of `plan` (a cpsched.Result) for `rank`, built once and cached: the cache holds the
    Result itself, so its identity cannot be reused while the entry lives (32 entries, least recently used
    first out)."""
    if isinstance(plan, TorchPlan):
        if plan.rank != rank:
            raise ValueError(f"plan: this TorchPlan was prepared for rank {plan.rank}, the group's rank here is "
                             f"{rank}")
        return plan
    if not isinstance(plan, _result_type()):
        raise ValueError(f"plan: expected a cpsched.Result (Session.solve) or a cpsched.torch.TorchPlan, got "
                         f"{type(plan).__name__}")
    key = (id(plan), rank)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is plan:
        _PLANS.move_to_end(key)
        return hit[1]
    tp = TorchPlan(plan, rank)
    _PLANS[key] = (plan, tp)
    while len(_PLANS) > _PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return tp


def _group_info(group, P_plan):
    """(group, rank, size, backend name) — without torch.distributed only a one-rank plan runs."""
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise ValueError("group: torch.distributed is not initialized (dist.init_process_group) but a group "
                             "was given")
        if P_plan != 1:
            raise ValueError(f"group: the plan is for P = {P_plan} ranks but torch.distributed is not initialized "
                             f"(call torch.distributed.init_process_group first)")
        return None, 0, 1, None
    g = group if group is not None else dist.group.WORLD
    return g, dist.get_rank(g), dist.get_world_size(g), str(dist.get_backend(g)).lower()


def layout_of(x):
    """The Layout a tensor made by `dispatch` carries (ValueError if it was not made by dispatch)."""
    lay = getattr(x, _LAYOUT_ATTR, None)
    if lay is None:
        raise ValueError("layout_of: this tensor was not made by cpsched.torch.dispatch (it carries no layout)")
    return lay


def _tag(x, layout):
    setattr(x, _LAYOUT_ATTR, layout)
    return x


def _cp_size(plan):
    if isinstance(plan, (Layout, TorchPlan, _result_type())):
        return plan.cp_size
    raise ValueError(f"plan: expected a cpsched.Result, a cpsched.torch.TorchPlan or a Layout, got "
                     f"{type(plan).__name__}")


def _plan_layout(plan, rank=None):
    if isinstance(plan, Layout):
        return plan
    if isinstance(plan, TorchPlan):
        return plan.layout
    if isinstance(plan, _result_type()):
        # this rank's prepared plan (cached, so that the attention call that follows reuses it)
        r = rank if rank is not None and 0 <= rank < plan.cp_size else 0
        return prepare(plan, r).layout
    raise ValueError(f"plan: expected a cpsched.Result, a cpsched.torch.TorchPlan or a Layout, got "
                     f"{type(plan).__name__}")


def dispatch(x, plan, group=None, dim=0, rank=None):
    """This rank's shard of a whole sequence `x` (its `dim` has S entries) in the plan's layout: the rows of
    the plan's host_ranges for this rank, concatenated (docs/plan_format.md). Differentiable (the gradient of
    x is this rank's rows; summing over ranks gives the whole). The result carries the layout
    (`layout_of`), so an attention call under a plan of another layout refuses it."""
    P = _cp_size(plan)
    if rank is None:
        _, rank, size, _ = _group_info(group, P)
        if size != P:
            raise ValueError(f"group: the process group has {size} ranks, the plan was made for P = {P}")
    lay = _plan_layout(plan, rank)
    if x.dim() <= dim or x.shape[dim] != lay.seqlen:
        raise ValueError(f"dispatch: x must have the plan's S = {lay.seqlen} entries along dim {dim}, got shape "
                         f"{tuple(x.shape)}")
    out = x.index_select(dim, lay.global_index(rank).to(x.device))
    return _tag(out, lay)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, lay, group, rank, dim):
        ctx.lay, ctx.rank, ctx.dim = lay, rank, dim
        P = lay.cp_size
        rows = [lay.rows(r) for r in range(P)]
        mx = max(rows)
        yt = y.movedim(dim, 0).contiguous()
        pad = torch.zeros((mx,) + tuple(yt.shape[1:]), dtype=y.dtype, device=y.device)
        pad[:yt.shape[0]] = yt
        parts = [torch.empty_like(pad) for _ in range(P)]
        dist.all_gather(parts, pad, group=group)
        cat = torch.cat([p[:n] for p, n in zip(parts, rows)])
        out = torch.empty_like(cat)
        out[lay.order().to(y.device)] = cat
        return out.movedim(0, dim)

    @staticmethod
    def backward(ctx, g):
        rows = ctx.lay.global_index(ctx.rank).to(g.device)
        return g.index_select(ctx.dim, rows), None, None, None, None


def undispatch(y, plan, group=None, dim=0):
    """The whole sequence from every rank's shard `y` (the inverse of dispatch): all-gathers the shards over
    the group and puts every row at its global position. Differentiable: the gradient of y is this rank's rows
    of the gradient of the result (so a loss computed alike on every rank trains every shard once)."""
    P = _cp_size(plan)
    g, rank, size, _ = _group_info(group, P)
    if size != P:
        raise ValueError(f"group: the process group has {size} ranks, the plan was made for P = {P}")
    lay = _plan_layout(plan, rank)
    if y.dim() <= dim or y.shape[dim] != lay.rows(rank):
        raise ValueError(f"undispatch: rank {rank} hosts {lay.rows(rank)} tokens of the plan's layout, y has shape "
                         f"{tuple(y.shape)} along dim {dim}")
    tag = getattr(y, _LAYOUT_ATTR, None)
    if tag is not None and tag != lay:
        raise ValueError(f"undispatch: y was dispatched with {tag!r}, not the plan's {lay!r}")
    if size == 1:
        return y.index_select(dim, torch.argsort(lay.order()).to(y.device))
    return _Gather.apply(y, lay, g, rank, dim)


# ---- checks ------------------------------------------------------------------------------------


def _shape_text(shape):
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def check_inputs(tp, q, k, v, size, rank, backend_name, layout):
    """The first thing wrong with a call's inputs, as the ValueError's text, or None. Local: no collective."""
    P, S = tp.cp_size, tp.seqlen
    if size != P:
        return (f"group: the process group has {size} ranks, the plan was made for P = {P} (its cp_size); "
                f"solve with Session(cp_size={size}, ...) or pass the group of the plan's ranks")
    rows = tp.rows
    for name, t in (("q", q), ("k", k)) + ((("v", v),) if v is not None else ()):
        if not isinstance(t, torch.Tensor):
            return f"{name}: expected a torch.Tensor, got {type(t).__name__}"
    if layout is not None and not isinstance(layout, Layout):
        return f"layout: expected a cpsched.torch.Layout (layout_of(dispatched tensor)), got {type(layout).__name__}"
    tags = [(n, getattr(t, _LAYOUT_ATTR, None)) for n, t in (("q", q), ("k", k), ("v", v)) if t is not None]
    for n, tag in tags + [("layout", layout)]:
        if tag is not None and (tag.seqlen != S or tag.cp_size != P):
            return (f"{n}: the shard is of a sequence of S = {tag.seqlen} tokens over P = {tag.cp_size} ranks, the "
                    f"plan was made for S = {S} over P = {P}")
        if tag is not None and tag != tp.layout:
            return (f"{n}: the shard was laid out as {tag!r}, the plan's layout is {tp.layout!r}: dispatch the "
                    f"sequence with this plan (or solve the mask for the layout the shards have)")
    exp_q = (rows, tp.hq, tp.dqk)
    exp_k = (rows, tp.hkv, tp.dqk)
    exp_v = (rows, tp.hkv, tp.dv)
    geo = (f"this rank (rank {rank}) hosts {rows} of the plan's S = {S} tokens over P = {P} ranks; "
           f"heads {tp.hq}:{tp.hkv}, d_qk {tp.dqk}" + (f", d_v {tp.dv}" if tp.dv != tp.dqk else ""))
    if q.dim() != 3 or tuple(q.shape) != exp_q:
        hint = ""
        if q.dim() == 3 and q.shape[0] != rows:
            hint = " (a plan made for another S, or a shard of another layout)"
        return f"q: expected shape {_shape_text(exp_q)} [tokens, heads_q, d_qk], got {_shape_text(q.shape)}{hint}: {geo}"
    if k.dim() != 3 or tuple(k.shape) != exp_k:
        return f"k: expected shape {_shape_text(exp_k)} [tokens, heads_kv, d_qk], got {_shape_text(k.shape)}: {geo}"
    if tp.kv_shared:
        if v is not None:
            return (f"v: the plan's K and V are one shared latent row (kv_shared, d_qk {tp.dqk}, d_v {tp.dv}): "
                    f"pass v=None; V is k[..., :{tp.dv}]")
    elif v is None:
        return f"v: expected a tensor of shape {_shape_text(exp_v)}, got None (only a kv_shared plan takes none)"
    elif v.dim() != 3 or tuple(v.shape) != exp_v:
        return f"v: expected shape {_shape_text(exp_v)} [tokens, heads_kv, d_v], got {_shape_text(v.shape)}: {geo}"
    if not q.dtype.is_floating_point:
        return f"q: dtype {q.dtype} is not a floating point type"
    for name, t in (("k", k), ("v", v)):
        if t is not None and t.dtype != q.dtype:
            return f"{name}: dtype {t.dtype} differs from q's {q.dtype}"
        if t is not None and t.device != q.device:
            return f"{name}: on device {t.device}, q on {q.device}; all three must be on one device"
    if q.dtype.itemsize != tp.dtype_bytes:
        return (f"q: {q.dtype} has {q.dtype.itemsize}-byte elements, the plan counts {tp.dtype_bytes}-byte "
                f"elements (the Session's heads dtype): plan with the dtype you compute in, so that the "
                f"collectives move the plan's bytes")
    if backend_name == "nccl" and q.device.type != "cuda":
        return f"q: on {q.device}, but the group's backend is NCCL (CUDA tensors only)"
    if backend_name == "gloo" and q.device.type != "cpu":
        return f"q: on {q.device}, but the group's backend is gloo, whose all_to_all runs on CPU tensors (use NCCL)"
    if not tp.layout.sequential and layout is None and not any(tag is not None for _, tag in tags):
        return (f"layout: the plan's layout is not the sequential one ({tp.layout!r}, as the solver "
                f"'{tp.solver}' dispatched the tokens), and nothing shows that q, k and v carry it: pass "
                f"layout=cpsched.torch.layout_of(x) for x = cpsched.torch.dispatch(tokens, plan), or shards made "
                f"by dispatch")
    return None


def _agree(err, group, device, rank, size):
    """Every rank learns whether any rank rejected its inputs (one all_gather of a flag), so that all raise."""
    flag = torch.tensor([1 if err else 0], dtype=torch.int32, device=device)
    flags = [torch.empty_like(flag) for _ in range(size)]
    dist.all_gather(flags, flag, group=group)
    bad = [r for r, f in enumerate(flags) if int(f.item())]
    if err:
        raise ValueError(err)
    if bad:
        raise ValueError(f"rank(s) {bad} of the group rejected their inputs for this plan (their ValueError names "
                         f"what is wrong); rank {rank} stopped before any collective of the plan")


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dp, backend, comm, scale):
        out, lse = run_forward(dp, q, k, v, backend, comm, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.dp, ctx.backend, ctx.comm, ctx.scale = dp, backend, comm, scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = run_backward(ctx.dp, q, k, v, out, lse, dout, ctx.backend, ctx.comm, ctx.scale)
        return dq, dk, dv, None, None, None, None


def attention(q, k, v, plan, group=None, backend="auto", return_lse=False, *, layout=None, softmax_scale=None,
              check_peers=None):
    """Distributed attention of this rank's shards under a cpsched plan.

    q [rows, heads_q, d_qk], k [rows, heads_kv, d_qk], v [rows, heads_kv, d_v] (None for a shared latent KV:
    V is k[..., :d_v]): this rank's tokens in the plan's layout. `plan`: a cpsched.Result or a TorchPlan.
    `group`: the process group of the plan's P ranks (default: the world). `backend`: 'auto', 'torch',
    'flash' or 'flex'. Returns out [rows, heads_q, d_v] (and lse [rows, heads_q], fp32, not differentiable).
    `layout`: for a plan whose layout is not the sequential one, the Layout of the shards (layout_of of a
    dispatched tensor) unless q, k or v carry it. `check_peers` (default: on for gloo): every rank learns when
    another rejected its inputs, so that all raise instead of waiting in a collective.
    Inputs are checked on every rank before any collective; a bad one raises ValueError naming it."""
    g, rank, size, bname = _group_info(group, getattr(plan, "cp_size", 1))
    # Every check is local and collects its message instead of raising, so that with check_peers the ranks
    # first agree (no rank may leave while another waits in the agreement or in the plan's collectives).
    err, tp, be = None, None, None
    P_plan = getattr(plan, "cp_size", None)
    if not isinstance(plan, (TorchPlan, _result_type())):
        err = (f"plan: expected a cpsched.Result (Session.solve) or a cpsched.torch.TorchPlan, got "
               f"{type(plan).__name__}")
    elif size != P_plan:
        err = (f"group: the process group has {size} ranks, the plan was made for P = {P_plan} (its cp_size); "
               f"solve with Session(cp_size={size}, ...) or pass the group of the plan's ranks")
    else:
        try:
            tp = prepare(plan, rank)
            err = check_inputs(tp, q, k, v, size, rank, bname, layout)
            if err is None and isinstance(q, torch.Tensor):
                err = tp.index_rows_missing(q.device)
            if err is None:
                be = make_backend(backend, q.device, q.dtype, tp)
        except ValueError as e:
            err = str(e)
    if check_peers is None:
        check_peers = bname == "gloo"
    if check_peers and g is not None and size > 1:
        _agree(err, g, q.device if isinstance(q, torch.Tensor) and q.device.type != "meta" else "cpu", rank, size)
    elif err:
        raise ValueError(err)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(tp.dqk)
    dp = tp.on(q.device)
    out, lse = _Attention.apply(q, k, v, dp, be, Comm(g), float(scale))
    return (out, lse) if return_lse else out
