"""The executor of one pass of a plan on one rank: the sim runtime's program (runtimes/sim/virtual_ranks.cpp)
with real collectives.

Per pass: cast(1) is issued; stage 0's local args run while it is in flight; for s = 1..N: wait for cast(s),
run the relays' forwarding phase of stage s, issue cast(s + 1), run stage s's args, then reduce every stage
whose `*_reduce_after` is s (forwarded partials back to their relays first, merged there, then the first
phase back to the hosts). The first-phase reduces are asynchronous; their partials are merged into the host's
own partial result once all have arrived. Every group-cast and every group-reduce of a (stage, kind, phase)
is one `all_to_all_single` with split lists on the group, issued with async_op=True; a collective that carries
nothing on any rank is skipped on every rank.

Rows travel as bytes: a row of a collective packs the fields of one (token, head group) as the plan's byte
counts have them (docs/design.md#metrics, docs/heads.md): forward QO cast Q; forward QO reduce lse (fp32) and O; KV cast
K and V (the latent once when shared); backward QO cast lse, Q, O, dO; backward QO reduce dQ; backward KV
reduce dK and dV. Elements are the inputs' dtype, lse fp32, so what goes over the wire is exactly the plan's
bytes.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ._kernels import Buffers, compute_dtype, scatter_merge

NEG_INF = float("-inf")


class Comm:
    """The collectives of the executor on a process group (a wrapper so that benchmarks can stub them)."""

    def __init__(self, group):
        self.group = group

    def a2a(self, out, inp, out_splits, in_splits):
        return dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group, async_op=True)


class _Rows:
    """A receive buffer of n packed rows and typed views of its fields (copies when a field is not aligned
    to its element size inside the row, refreshed by `unpack` once rows have arrived)."""

    __slots__ = ("buf", "typed", "fields", "aligned", "row_bytes")

    def __init__(self, n, fields, device):
        self.fields = []
        off = 0
        for name, dtype, tail in fields:
            nb = dtype.itemsize * math.prod(tail)
            self.fields.append((name, dtype, tail, off, nb))
            off += nb
        self.row_bytes = off
        self.buf = torch.empty((n, off), dtype=torch.uint8, device=device)
        self.aligned = all(o % dt.itemsize == 0 and off % dt.itemsize == 0 for _, dt, _, o, _ in self.fields)
        self.typed = {}
        for name, dtype, tail, o, nb in self.fields:
            if self.aligned:
                self.typed[name] = self.buf[:, o:o + nb].view(dtype).view(n, *tail)
            else:
                self.typed[name] = torch.empty((n, *tail), dtype=dtype, device=device)

    def unpack(self, r0, r1):
        if self.aligned or r1 <= r0:
            return
        for name, dtype, tail, o, nb in self.fields:
            self.typed[name][r0:r1] = self.buf[r0:r1, o:o + nb].contiguous().view(dtype).view(r1 - r0, *tail)


def _pack(parts):
    """[n, ...] tensors -> one [n, bytes] uint8 tensor, fields side by side."""
    bs = [(p if p.dim() == 2 and p.is_contiguous() else p.reshape(p.shape[0], math.prod(p.shape[1:])).contiguous())
          .view(torch.uint8) for p in parts]
    return bs[0] if len(bs) == 1 else torch.cat(bs, dim=1)


def _unpack(buf, fields):
    """The typed fields (name, dtype, tail) of a packed [n, bytes] buffer read once (views or copies)."""
    out = {}
    off = 0
    n = buf.shape[0]
    for name, dtype, tail in fields:
        nb = dtype.itemsize * math.prod(tail)
        sub = buf[:, off:off + nb]
        try:
            out[name] = sub.view(dtype).view(n, *tail)
        except RuntimeError:
            out[name] = sub.contiguous().view(dtype).view(n, *tail)
        off += nb
    return out


class _Geo:
    __slots__ = ("L", "G", "qpg", "kpg", "hq", "hkv", "dqk", "dv", "shared", "dt", "cdt", "dev")

    def __init__(self, tp, q):
        self.L = q.shape[0]
        self.G, self.qpg, self.kpg = tp.G, tp.qpg, tp.kpg
        self.hq, self.hkv, self.dqk, self.dv = tp.hq, tp.hkv, tp.dqk, tp.dv
        self.shared = tp.kv_shared
        self.dt = q.dtype
        self.cdt = compute_dtype(q.dtype)
        self.dev = q.device


def _wait(works):
    for w in works:
        if w is not None:
            w.wait()


class _Table:
    """This rank's rows of one kind packed as the collectives send them ([L * G, row bytes] uint8), built on
    first use in a pass (one copy of the fields side by side), so that each stage's send buffer is one
    index_select of it."""
    __slots__ = ("parts", "table")

    def __init__(self, parts):
        self.parts = parts
        self.table = None

    def get(self):
        if self.table is None:
            self.table = _pack(self.parts)
        return self.table


def _issue_casts(comm, st, bufs, sources, keep):
    """First phase of a stage: per kind, pack this rank's rows and issue the all_to_all."""
    works = []
    for coll, rows, src in ((st.qo, bufs[0], sources[0]), (st.kv, bufs[1], sources[1])):
        if not coll.active:
            continue
        send = src.get().index_select(0, coll.send_rows)
        keep.append(send)
        out = rows.buf[coll.recv_at:coll.recv_at + coll.n_recv]
        works.append(comm.a2a(out, send, coll.out_splits, coll.in_splits))
    return works


def _issue_forwarding(comm, st, bufs, keep):
    """Relays' forwarding phase of a stage: rows of the relay's receive buffer, to the node's other receivers,
    appended after their first-phase rows."""
    works = []
    for coll, rows in ((st.qo_fwd, bufs[0]), (st.kv_fwd, bufs[1])):
        if coll is None or not coll.active:
            continue
        send = rows.buf.index_select(0, coll.send_rows)
        keep.append(send)
        out = rows.buf[coll.recv_at:coll.recv_at + coll.n_recv]
        works.append(comm.a2a(out, send, coll.out_splits, coll.in_splits))
    return works


def _reduce(comm, coll, send, dev):
    """The transpose of a cast: what this rank received goes back to where it came from."""
    back = torch.empty((coll.n_send, send.shape[1]), dtype=torch.uint8, device=dev)
    return back, comm.a2a(back, send, coll.in_splits, coll.out_splits)


def _stage_rows(st, kind):
    return (st.qo_off, st.qo_off + st.qo_rows) if kind == "qo" else (st.kv_off, st.kv_off + st.kv_rows)


class _Workspace:
    """A pass's receive buffers and fp32 accumulators for one (plan, device, dtype), allocated once and reused
    by every call (each call zeroes them with one or two fills): a call allocates only its outputs. One call
    at a time uses a plan's workspace on a device (calls of one process group are sequential)."""

    def __init__(self, tp, pp, pass_, dt, dev):
        L, G, qpg, kpg = tp.rows, tp.G, tp.qpg, tp.kpg
        hq, hkv, dqk, dv, shared = tp.hq, tp.hkv, tp.dqk, tp.dv, tp.kv_shared
        Nq, Nk = pp.qo_rows, pp.kv_rows
        cdt = compute_dtype(dt)
        kv_fields = [("k", dt, (kpg, dqk))] + ([] if shared else [("v", dt, (kpg, dv))])
        self.rkv = _Rows(Nk, kv_fields, dev)
        rk = self.rkv.typed["k"]
        rv = rk[..., :dv] if shared else self.rkv.typed["v"]

        def carve(block, shapes):
            out, at = [], 0
            for sh in shapes:
                n = math.prod(sh)
                out.append(block[at:at + n].view(*sh))
                at += n
            return out
        if pass_ == "fwd":
            self.rqo = _Rows(Nq, [("q", dt, (qpg, dqk))], dev)
            self.acc = torch.empty(L * hq * dv + Nq * qpg * dv, dtype=cdt, device=dev)
            self.lse_blk = torch.empty(L * hq + Nq * qpg, dtype=cdt, device=dev)
            o, ro = carve(self.acc, [(L, hq, dv), (Nq, qpg, dv)])
            lse, rlse = carve(self.lse_blk, [(L, hq), (Nq, qpg)])
            self.b = Buffers(rq=self.rqo.typed["q"], rk=rk, rv=rv, o=o, lse=lse, ro=ro, rlse=rlse, indices=pp.indices,
                             qpg=qpg, kpg=kpg, shared=shared)
            self.o_flat = o.view(L * G, qpg, dv)
            self.lse_flat = lse.view(L * G, qpg)
        else:
            self.rqo = _Rows(Nq, [("lse", torch.float32, (qpg,)), ("q", dt, (qpg, dqk)), ("o", dt, (qpg, dv)),
                                  ("do", dt, (qpg, dv))], dev)
            shapes = [(L, hq, dqk), (L, hkv, dqk)] + ([] if shared else [(L, hkv, dv)]) + \
                [(Nq, qpg, dqk), (Nk, kpg, dqk)] + ([] if shared else [(Nk, kpg, dv)]) + [(Nq, qpg)]
            self.acc = torch.empty(sum(math.prod(x) for x in shapes), dtype=cdt, device=dev)
            parts = carve(self.acc, shapes)
            if shared:
                dq, dk, rdq, rdk, rdelta = parts
                dv_, rdv = None, None
            else:
                dq, dk, dv_, rdq, rdk, rdv, rdelta = parts
            self.b = Buffers(rq=self.rqo.typed["q"], rk=rk, rv=rv, rlse=self.rqo.typed["lse"], rout=self.rqo.typed["o"],
                             rdout=self.rqo.typed["do"], rdelta=rdelta, dq=dq, dk=dk, dv=dv_, rdq=rdq, rdk=rdk,
                             rdv=rdv, indices=pp.indices, qpg=qpg, kpg=kpg, shared=shared)
            self.dq_flat = dq.view(L * G, qpg, dqk)
            self.dk_flat = dk.view(L * G, kpg, dqk)
            self.dv_flat = None if shared else dv_.view(L * G, kpg, dv)
            self.lse_blk = None

    def reset(self):
        self.acc.zero_()
        if self.lse_blk is not None:
            self.lse_blk.fill_(NEG_INF)
        return self.b


def _workspace(dp, pass_, dt):
    key = (pass_, dt)
    ws = dp.work.get(key)
    if ws is None:
        ws = _Workspace(dp.tp, dp.fwd if pass_ == "fwd" else dp.bwd, pass_, dt, dp.device)
        dp.work[key] = ws
    return ws


def _pipelined_stages(comm, pp, bufs, sources, keep):
    """The pass's stage order, the same forward and backward: yields (0, None) once stage 1's casts are in
    flight (stage 0's local work overlaps them), then (s, its StageComm) for each remote stage s once its rows
    (and the relays' forwarded ones) are unpacked, with stage s + 1's casts already issued."""
    rqo, rkv = bufs
    N = len(pp.comm)
    works = _issue_casts(comm, pp.comm[0], bufs, sources, keep) if N else []
    yield 0, None
    for s in range(1, N + 1):
        st = pp.comm[s - 1]
        _wait(works)
        fw = _issue_forwarding(comm, st, bufs, keep)
        works = _issue_casts(comm, pp.comm[s], bufs, sources, keep) if s < N else []
        _wait(fw)
        rqo.unpack(*_stage_rows(st, "qo"))
        rkv.unpack(*_stage_rows(st, "kv"))
        yield s, st


def run_forward(dp, q, k, v, backend, comm, scale):
    """Forward pass of this rank: returns O (q's dtype) [L, hq, dv] and lse (fp32) [L, hq]."""
    tp, pp = dp.tp, dp.fwd
    g = _Geo(tp, q)
    L, G, qpg, kpg, dt, cdt, dev = g.L, g.G, g.qpg, g.kpg, g.dt, g.cdt, g.dev
    if g.shared:
        v = k[..., :g.dv]
    q_rows = q.reshape(L * G, qpg * g.dqk)
    k_rows = k.reshape(L * G, kpg * g.dqk)
    kv_src = [k_rows] if g.shared else [k_rows, v.reshape(L * G, kpg * g.dv)]
    ws = _workspace(dp, "fwd", dt)
    b = ws.reset()
    b.q, b.k, b.v, b.scale = q, k, v, scale
    bufs, sources = (ws.rqo, ws.rkv), (_Table([q_rows]), _Table(kv_src))
    o_fields = [("lse", torch.float32, (qpg,)), ("o", dt, (qpg, g.dv))]
    keep, finals = [], []
    for s, _ in _pipelined_stages(comm, pp, bufs, sources, keep):
        backend.forward_stage(pp.stages[s - 1] if s else pp.stage0, b)
        if not s:
            continue
        for s2, kind in pp.reduces.get(s, ()):
            if kind != "qo":
                continue
            st2 = pp.comm[s2 - 1]
            c = st2.qo_fwd
            if c is not None and c.active:  # forwarded partials back to the relays, merged there first
                rows = slice(c.recv_at, c.recv_at + c.n_recv)
                send = _pack([b.rlse[rows].float(), b.ro[rows].to(dt)])
                back, w = _reduce(comm, c, send, dev)
                w.wait()
                f = _unpack(back, o_fields)
                scatter_merge(b.ro, b.rlse, c.send_rows, f["o"].to(cdt), f["lse"].to(cdt))
            c = st2.qo
            if c.active:
                rows = slice(c.recv_at, c.recv_at + c.n_recv)
                send = _pack([b.rlse[rows].float(), b.ro[rows].to(dt)])
                keep.append(send)
                back, w = _reduce(comm, c, send, dev)
                finals.append((w, back, c.send_rows))
    _wait([w for w, _, _ in finals])
    if finals:
        back = torch.cat([x for _, x, _ in finals]) if len(finals) > 1 else finals[0][1]
        idx = torch.cat([i for _, _, i in finals]) if len(finals) > 1 else finals[0][2]
        f = _unpack(back, o_fields)
        scatter_merge(ws.o_flat, ws.lse_flat, idx, f["o"].to(cdt), f["lse"].to(cdt))
    return b.o.to(dt, copy=True), b.lse.to(torch.float32, copy=True)


def run_backward(dp, q, k, v, out, lse, dout, backend, comm, scale):
    """Backward pass of this rank: dQ, dK, dV (None when K and V share the latent: dV is inside dK)."""
    tp, pp = dp.tp, dp.bwd
    g = _Geo(tp, q)
    L, G, qpg, kpg, dt, cdt, dev = g.L, g.G, g.qpg, g.kpg, g.dt, g.cdt, g.dev
    if g.shared:
        v = k[..., :g.dv]
    out = out.to(dt)
    dout = dout.to(dt)
    lse = lse.float()
    delta = (dout.to(cdt) * out.to(cdt)).sum(-1)
    qo_src = [lse.reshape(L * G, qpg), q.reshape(L * G, qpg * g.dqk), out.reshape(L * G, qpg * g.dv),
              dout.reshape(L * G, qpg * g.dv)]
    k_rows = k.reshape(L * G, kpg * g.dqk)
    kv_src = [k_rows] if g.shared else [k_rows, v.reshape(L * G, kpg * g.dv)]
    ws = _workspace(dp, "bwd", dt)
    b = ws.reset()
    b.q, b.k, b.v, b.lse, b.out, b.dout, b.delta, b.scale = q, k, v, lse, out, dout, delta, scale
    bufs, sources = (ws.rqo, ws.rkv), (_Table(qo_src), _Table(kv_src))
    dq_fields = [("dq", dt, (qpg, g.dqk))]
    dkv_fields = [("dk", dt, (kpg, g.dqk))] + ([] if g.shared else [("dv", dt, (kpg, g.dv))])

    def grads_of(kind, rows):
        if kind == "qo":
            return [b.rdq[rows].to(dt)]
        return [b.rdk[rows].to(dt)] + ([] if g.shared else [b.rdv[rows].to(dt)])

    def add_into(kind, f, idx, local):
        if kind == "qo":
            target = ws.dq_flat if local else b.rdq
            target.index_add_(0, idx, f["dq"].to(cdt))
            return
        tk = ws.dk_flat if local else b.rdk
        tk.index_add_(0, idx, f["dk"].to(cdt))
        if not g.shared:
            tv = ws.dv_flat if local else b.rdv
            tv.index_add_(0, idx, f["dv"].to(cdt))

    keep, finals = [], []
    for s, st in _pipelined_stages(comm, pp, bufs, sources, keep):
        if not s:
            backend.backward_stage(pp.stage0, b)
            continue
        r0, r1 = _stage_rows(st, "qo")
        if r1 > r0:
            b.rdelta[r0:r1] = (b.rdout[r0:r1].to(cdt) * b.rout[r0:r1].to(cdt)).sum(-1)
        backend.backward_stage(pp.stages[s - 1], b)
        todo = pp.reduces.get(s, ())
        # forwarded gradients back to their relays first (summed there), then the first phase to the hosts
        fwd_works = []
        for s2, kind in todo:
            st2 = pp.comm[s2 - 1]
            c = st2.qo_fwd if kind == "qo" else st2.kv_fwd
            if c is None or not c.active:
                continue
            send = _pack(grads_of(kind, slice(c.recv_at, c.recv_at + c.n_recv)))
            keep.append(send)
            back, w = _reduce(comm, c, send, dev)
            fwd_works.append((w, back, c, kind))
        for w, back, c, kind in fwd_works:
            w.wait()
            add_into(kind, _unpack(back, dq_fields if kind == "qo" else dkv_fields), c.send_rows, False)
        for s2, kind in todo:
            st2 = pp.comm[s2 - 1]
            c = st2.qo if kind == "qo" else st2.kv
            if not c.active:
                continue
            send = _pack(grads_of(kind, slice(c.recv_at, c.recv_at + c.n_recv)))
            keep.append(send)
            back, w = _reduce(comm, c, send, dev)
            finals.append((w, back, c, kind))
    _wait([w for w, _, _, _ in finals])
    for kind in ("qo", "kv"):  # every stage's returns of a kind at once: one unpack, one index_add per field
        got = [(back, c.send_rows) for _, back, c, kd in finals if kd == kind]
        if not got:
            continue
        back = torch.cat([x for x, _ in got]) if len(got) > 1 else got[0][0]
        idx = torch.cat([i for _, i in got]) if len(got) > 1 else got[0][1]
        add_into(kind, _unpack(back, dq_fields if kind == "qo" else dkv_fields), idx, True)
    return b.dq.to(dt, copy=True), b.dk.to(dt, copy=True), (None if g.shared else b.dv.to(dt, copy=True))
