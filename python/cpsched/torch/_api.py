"""cpsched.torch.attention, dispatch / undispatch and the checks every call makes before any collective."""
from __future__ import annotations

import math
import threading
from collections import OrderedDict

import torch

from . import _graphs, _groups
from ._agree import FWD_WORDS, Claim, default_check, digest, dtype_code, exchange, float_code, scale_value, \
    shape_code
from ._backends import make_backend
from ._exec import Comm, run_backward, run_forward
from ._plan import Layout, TorchPlan, _rank_arg

_PLANS: "OrderedDict[tuple, tuple]" = OrderedDict()
_PLAN_CACHE_SIZE = 32
_PLANS_LOCK = threading.Lock()
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
    with _PLANS_LOCK:  # the ranks of a loopback group are threads of one process
        hit = _PLANS.get(key)
        if hit is not None and hit[0] is plan:
            _PLANS.move_to_end(key)
            return hit[1]
    tp = TorchPlan(plan, rank)
    with _PLANS_LOCK:
        _PLANS[key] = (plan, tp)
        while len(_PLANS) > _PLAN_CACHE_SIZE:
            _PLANS.popitem(last=False)
    return tp


def _group_info(group, P_plan):
    """(group, rank, size, {device type: backend name}) — without torch.distributed only a one-rank plan
    runs (or a group that serves its collectives itself: cpsched.torch.loopback)."""
    return _groups.info(group, P_plan)


def _checking(check_peers, g, size):
    """Whether this call runs the agreement: check_peers (True, False, or None: the group's default)."""
    if check_peers is not None and not isinstance(check_peers, bool):
        raise ValueError(f"check_peers: expected True, False or None, got {check_peers!r}")
    if g is None or size <= 1:
        return False
    return default_check(g) if check_peers is None else check_peers


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
    (`layout_of`), so an attention call under a plan of another layout refuses it. `rank`: the rank whose
    shard to take (default: this process's rank in the group)."""
    P = _cp_size(plan)
    if rank is None:
        _, rank, size, _ = _group_info(group, P)
        if size != P:
            raise ValueError(f"group: the process group has {size} ranks, the plan was made for P = {P}")
    else:
        rank = _rank_arg(rank)
        if not 0 <= rank < P:
            raise ValueError(f"rank: {rank} is outside [0, {P}) of the plan's P = {P}")
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise ValueError(f"dim: expected an integer, got {dim!r}")
    lay = _plan_layout(plan, rank)
    if not -x.dim() <= dim < x.dim() or x.shape[dim] != lay.seqlen:
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
        _groups.all_gather(parts, pad, group)
        cat = torch.cat([p[:n] for p, n in zip(parts, rows)])
        out = torch.empty_like(cat)
        out[lay.order().to(y.device)] = cat
        return out.movedim(0, dim)

    @staticmethod
    def backward(ctx, g):
        rows = ctx.lay.global_index(ctx.rank).to(g.device)
        return g.index_select(ctx.dim, rows), None, None, None, None


def undispatch(y, plan, group=None, dim=0, *, check_peers=None):
    """The whole sequence from every rank's shard `y` (the inverse of dispatch): all-gathers the shards over
    the group and puts every row at its global position. Differentiable: the gradient of y is this rank's rows
    of the gradient of the result (so a loss computed alike on every rank trains every shard once).
    `check_peers` (the default as for attention): the ranks first agree on the layout, the dtype, the dim and
    the other dims' sizes, so that a rank whose shard is wrong makes every rank raise (docs/torch.md)."""
    P = _cp_size(plan)
    g, rank, size, devs = _group_info(group, P)
    checking = _checking(check_peers, g, size)
    err, lay = None, None
    claim = Claim("undispatch")
    try:
        if size != P:
            raise ValueError(f"group: the process group has {size} ranks, the plan was made for P = {P}")
        if not isinstance(y, torch.Tensor):
            raise ValueError(f"y: expected a torch.Tensor, got {type(y).__name__}")
        if isinstance(dim, bool) or not isinstance(dim, int) or not -y.dim() <= dim < y.dim():
            raise ValueError(f"dim: expected an integer in [{-y.dim()}, {y.dim()}), got {dim!r}")
        dim = dim % y.dim()
        lay = _plan_layout(plan, rank)
        if y.shape[dim] != lay.rows(rank):
            raise ValueError(f"undispatch: rank {rank} hosts {lay.rows(rank)} tokens of the plan's layout, y has "
                             f"shape {tuple(y.shape)} along dim {dim}")
        tag = getattr(y, _LAYOUT_ATTR, None)
        if tag is not None and tag != lay:
            raise ValueError(f"undispatch: y was dispatched with {tag!r}, not the plan's {lay!r}")
        rest = tuple(y.shape[:dim]) + tuple(y.shape[dim + 1:])
        claim.add("layout", digest("layout", lay.seqlen, lay.host_ranges), "digest").add("dim", dim)
        claim.add("dtype", dtype_code(y.dtype), "dtype").add("the other dims", shape_code(rest), "shape")
        claim.add("device type", digest(y.device.type), "digest")
    except ValueError as e:
        err = str(e)
    if checking:
        exchange(claim, err, g, rank, size, y.device if isinstance(y, torch.Tensor) else "cpu")
    elif err:
        raise ValueError(err)
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
    devs = backend_name if isinstance(backend_name, dict) or backend_name is None else \
        {"nccl": {"cuda": "nccl"}, "gloo": {"cpu": "gloo", "cuda": "gloo"}}.get(str(backend_name))
    if devs:
        b = devs.get(q.device.type)
        if b is None:
            names = "/".join(sorted({x.upper() if x == "nccl" else x for x in devs.values()}))
            return f"q: on {q.device}, but the group's backend is {names} ({'/'.join(sorted(devs))} tensors only)"
        if b == "gloo" and q.device.type != "cpu":
            return f"q: on {q.device}, but the group's backend is gloo, whose all_to_all runs on CPU tensors (use NCCL)"
    if not tp.layout.sequential and layout is None and not any(tag is not None for _, tag in tags):
        return (f"layout: the plan's layout is not the sequential one ({tp.layout!r}, as the solver "
                f"'{tp.solver}' dispatched the tokens), and nothing shows that q, k and v carry it: pass "
                f"layout=cpsched.torch.layout_of(x) for x = cpsched.torch.dispatch(tokens, plan), or shards made "
                f"by dispatch")
    return None


_TWICE = (b"cpsched.torch.attention is differentiable once: create_graph=True gives its first-order "
          b"gradients, which cannot be differentiated again (no double backward through the distributed plan)")


def _once(outputs):
    """Under create_graph=True the backward runs with grad mode on: its gradients are returned as values that
    refuse a second differentiation with a clear error, as torch's once_differentiable does."""
    try:
        from torch._C import _functions
        err_fn = _functions.DelayedError(_TWICE, len(outputs))
    except Exception:  # noqa: BLE001 - a torch without it: the gradients as they are (no graph)
        return outputs

    def fake(x):
        if x is not None:
            x = x.detach()
            x.requires_grad = True
        return x
    out = err_fn(*[fake(x) for x in outputs])
    return out if isinstance(out, tuple) else (out,)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dp, backend, comm, scale, graphs=False):
        if graphs:
            out, lse = _graphs.forward(dp, q, k, v, backend, comm, scale)
        else:
            out, lse = run_forward(dp, q, k, v, backend, comm, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.dp, ctx.backend, ctx.comm, ctx.scale, ctx.graphs = dp, backend, comm, scale, graphs
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        # The executor writes its workspace in place and runs collectives: never under autograd. With
        # create_graph=True (grad mode on here) every rank still runs the same backward, and the gradients
        # refuse a second differentiation instead of failing (or leaving a rank in a collective).
        with torch.no_grad():
            run = _graphs.backward if ctx.graphs else run_backward
            dq, dk, dv = run(ctx.dp, q, k, v, out, lse, dout, ctx.backend, ctx.comm, ctx.scale)
        if torch.is_grad_enabled() and (dout.requires_grad or any(ctx.needs_input_grad[:3])):
            idx = [i for i, x in enumerate((dq, dk, dv)) if x is not None]
            wrapped = _once(tuple((dq, dk, dv)[i] for i in idx))
            res = [dq, dk, dv]
            for i, x in zip(idx, wrapped):
                res[i] = x
            dq, dk, dv = res
        return dq, dk, dv, None, None, None, None, None


_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
             if hasattr(torch, n))


def attention(q, k, v, plan, group=None, backend="auto", return_lse=False, *, layout=None, softmax_scale=None,
              check_peers=None, graphs=False):
    """Distributed attention of this rank's shards under a cpsched plan.

    q [rows, heads_q, d_qk], k [rows, heads_kv, d_qk], v [rows, heads_kv, d_v] (None for a shared latent KV:
    V is k[..., :d_v]): this rank's tokens in the plan's layout. `plan`: a cpsched.Result or a TorchPlan.
    `group`: the process group of the plan's P ranks (default: the world). `backend`: 'auto', 'torch',
    'flash' or 'flex'. Returns out [rows, heads_q, d_v] (and lse [rows, heads_q], fp32, not differentiable).
    `layout`: for a plan whose layout is not the sequential one, the Layout of the shards (layout_of of a
    dispatched tensor) unless q, k or v carry it. `check_peers` (default: on where the group has a CPU
    backend: gloo, or NCCL with a gloo CPU backend): before any collective the ranks agree on what they run
    (the plan, dtype, head shapes, scale, whether a backward follows), so that a rank whose inputs are wrong or
    differ makes every rank raise the same ValueError instead of waiting in a collective (docs/torch.md).
    `graphs`: capture each pass of the plan once as a CUDA graph and replay it (docs/torch.md, "Graphs"); where
    that cannot work (gloo, a loopback group, index rows written per call, flex, a host sync in the pass) the
    call runs eagerly and says why once.
    Inputs are checked on every rank before any collective; a bad one raises ValueError naming it."""
    return _attention(q, k, v, plan, group, backend, return_lse, layout, softmax_scale, check_peers, None,
                      graphs=graphs)


def _attention(q, k, v, plan, group, backend, return_lse, layout, softmax_scale, check_peers, pre_err,
               no_forwarding=False, graphs=False):
    """attention, with an error found before it on this rank alone (`pre_err`: DistAttention's solve of the
    call's mask) that every rank learns in the agreement."""
    is_plan = isinstance(plan, (TorchPlan, _result_type()))
    P_plan = plan.cp_size if is_plan else 1
    g, rank, size, devs = _group_info(group, P_plan if is_plan else _groups.size_of(group))
    try:
        checking = _checking(check_peers, g, size)
    except ValueError as e:  # a wrong check_peers: checked anyway, so that every rank learns it
        pre_err, checking = pre_err or str(e), g is not None and size > 1
    # Every check is local and collects its message instead of raising, so that the ranks first agree (no
    # rank may leave while another waits in the agreement or in the plan's collectives).
    err, tp, be, scale = pre_err, None, None, None
    claim = Claim("attention")
    if err is None:
        try:
            if not isinstance(return_lse, bool):
                raise ValueError(f"return_lse: expected True or False, got {return_lse!r}")
            if not isinstance(graphs, bool):
                raise ValueError(f"graphs: expected True or False, got {graphs!r}")
            if not is_plan:
                raise ValueError(f"plan: expected a cpsched.Result (Session.solve) or a cpsched.torch.TorchPlan, got "
                                 f"{type(plan).__name__}")
            if size != P_plan:
                raise ValueError(f"group: the process group has {size} ranks, the plan was made for P = {P_plan} (its "
                                 f"cp_size); solve with Session(cp_size={size}, ...) or pass the group of the plan's "
                                 f"ranks")
            tp = prepare(plan, rank)
            if getattr(tp, "error", None):
                raise ValueError(tp.error)
            if no_forwarding:
                tp.declare_no_forwarding()
            e = check_inputs(tp, q, k, v, size, rank, devs, layout)
            if e is None:
                e = tp.index_rows_missing(q.device)
            if e is None:
                e, scale = scale_value(softmax_scale, 1.0 / math.sqrt(tp.dqk))
            grad = e is None and torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v))
            if e is None and grad and q.dtype in _FP8:
                e = (f"q: {q.dtype} inputs that require grad: cpsched.torch runs float8 plans forward only (the "
                     f"backward's gradients would travel and accumulate in float8); compute the backward in bf16 "
                     f"(a plan with heads dtype 'bf16'), or call under torch.no_grad() / inference_mode()")
            if e is None:
                be = make_backend(backend, q.device, q.dtype, tp)
            if e is not None:
                raise ValueError(e)
            claim.plan(tp)
            claim.add("dtype", dtype_code(q.dtype), "dtype")
            claim.add("q heads and dims", shape_code(q.shape[1:]), "shape")
            claim.add("k heads and dims", shape_code(k.shape[1:]), "shape")
            claim.add("v heads and dims", shape_code(None if v is None else v.shape[1:]), "shape")
            claim.add("softmax_scale", float_code(scale), "float")
            claim.add("a backward follows (inputs that require grad)", grad, "bool")
            claim.add("device type", digest(q.device.type), "digest")
        except ValueError as e:
            err = str(e)
    if checking:
        dev = q.device if isinstance(q, torch.Tensor) and q.device.type != "meta" else \
            ("cuda" if devs and "cuda" in devs and "cpu" not in devs else "cpu")
        bits = exchange(claim, err, g, rank, size, dev)
    elif err:
        raise ValueError(err)
    else:
        bits = None
    if tp.per_rank and not tp.forwarding_known:
        N = max(len(tp.fwd.stages_comm), len(tp.bwd.stages_comm))
        fits = 4 * N <= 63 * FWD_WORDS
        tp.set_forwarding(bits if bits is not None and fits else tp.conservative_forwarding_bits())
    dp = tp.on(q.device)
    out, lse = _Attention.apply(q, k, v, dp, be, Comm(g), scale, graphs)
    return (out, lse) if return_lse else out
