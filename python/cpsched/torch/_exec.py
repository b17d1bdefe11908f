"""The executor of one pass of a plan on one rank: it interprets the pass's program (the core's,
core/include/cpsched/plan/program.hpp, as the timing model and the sim do) with real collectives, and keeps no
order of stages of its own.

The instructions (`_interpret`): cast(s, first) issues stage s's group-casts; cast(s, forwarding) is the
relays' forwarding phase, which leaves once the first phase has arrived: torch has no comm stream, so it is
issued at wait_cast(s), which waits for the first phase, and waited for before compute(s) runs stage s's args
(the default program issues cast(s + 1) in between, as the sim does). reduce(t, kind, forwarding) sends the
forwarded partials back to their relays; reduce(t, kind, first) merges (forward) or adds (backward) those into
the relay's rows, then sends stage t's partials back to their hosts, asynchronously. wait_reduces waits for
every reduce; merge folds the returns into the rank's own rows. Every group-cast and every group-reduce of a
(stage, kind, phase) is one `all_to_all_single` with split lists on the group, issued with async_op=True; a
collective that carries nothing on any rank is skipped on every rank.

Rows travel as bytes: a row of a collective packs the fields of one (token, head group) as the plan's byte
counts have them (docs/design.md#metrics, docs/heads.md): forward QO cast Q; forward QO reduce lse (fp32) and O; KV cast
K and V (the latent once when shared); backward QO cast lse, Q, O, dO; backward QO reduce dQ; backward KV
reduce dK and dV. Elements are the inputs' dtype, lse fp32, so what goes over the wire is exactly the plan's
bytes.

Everything a pass does besides the kernels is laid out once per (plan, device, dtype) in a `_Workspace`: the
receive buffers, one send buffer per kind holding every stage's first-phase rows (filled at the start of a
pass with one index_select per field into its typed view: the sources are this rank's inputs, which do not
change during the pass), the relays' forwarding and every reduce's send and return buffers, the row indices
of the merges and the views the collectives read and write. A call allocates only its outputs; its ops are a
fixed few per field and collective, whatever the number of args.
"""
from __future__ import annotations

import math

import torch

from . import _groups
from ._kernels import BackwardBuffers, ForwardBuffers, compute_dtype, scatter_merge
from ._workspace import Arena, Carver, Scratch, arena

NEG_INF = float("-inf")
_U8 = torch.uint8


class Comm:
    """The collectives of the executor on a process group (a wrapper so that benchmarks can stub them)."""

    def __init__(self, group):
        self.group = group

    def a2a(self, out, inp, out_splits, in_splits):
        return _groups.all_to_all_single(out, inp, out_splits, in_splits, self.group, True)


class _Packed:
    """n rows of fields side by side as bytes, `buf` [n, row bytes] uint8 (what a collective moves), and a
    typed [n, *tail] tensor per field in `typed`. A field aligned to its element size inside the row is a view
    of buf; one that is not (odd sizes) lives beside it ("loose"), and push / pull copy it to / from the
    bytes after writing / receiving."""

    __slots__ = ("buf", "typed", "loose")

    def __init__(self, buf, typed, loose):
        self.buf, self.typed, self.loose = buf, typed, loose

    @classmethod
    def alloc(cls, n, fields, carve):
        layout, off = [], 0
        for name, dtype, tail in fields:
            nb = dtype.itemsize * math.prod(tail)
            layout.append((name, dtype, tail, off, nb))
            off += nb
        buf = carve.empty((n, off), _U8)
        typed, loose = {}, []
        for name, dtype, tail, o, nb in layout:
            if o % dtype.itemsize == 0 and off % dtype.itemsize == 0:
                typed[name] = buf[:, o:o + nb].view(dtype).view(n, *tail)
            else:
                typed[name] = carve.empty((n, *tail), dtype)
                loose.append((name, o, nb))
        return cls(buf, typed, loose)

    def rows(self, a, b):
        return _Packed(self.buf[a:b], {k: t[a:b] for k, t in self.typed.items()}, self.loose)

    def push(self):
        for name, o, nb in self.loose:
            t = self.typed[name]
            self.buf[:, o:o + nb].copy_(t.reshape(t.shape[0], nb // t.element_size()).view(_U8))

    def pull(self):
        for name, o, nb in self.loose:
            t = self.typed[name]
            t.copy_(self.buf[:, o:o + nb].contiguous().view(t.dtype).view(t.shape))


def _wait(works):
    for w in works:
        if w is not None:
            w.wait()


def _carve(block, shapes):
    out, at = [], 0
    for sh in shapes:
        n = math.prod(sh)
        out.append(block[at:at + n].view(*sh))
        at += n
    return out


def _merge_views(back, idx):
    """What scatter_merge takes every call for returns `back` merged at rows `idx`: lse with a trailing 1 and
    idx expanded to it (None when the returns carry no lse: gradients are added)."""
    lse = back.typed.get("lse")
    if lse is None:
        return None, None
    return lse.unsqueeze(-1), idx.view(-1, 1).expand(lse.shape).contiguous().unsqueeze(-1)


class _Reduce:
    """The group-reduce of one (stage, kind) on this rank: its send buffer (filled from the remote
    accumulators' rows of the stage with one copy per field), where its returns land, and the split lists.
    `relay`: the same for the forwarded rows' return to this relay, merged (forward) or added (backward) into
    the remote accumulators at `idx` before the first phase goes back to the hosts."""

    __slots__ = ("send", "copies", "back", "out_splits", "in_splits", "idx", "lse3", "idx_exp")

    def __init__(self, c, fields, acc, back, carve):
        rows = slice(c.recv_at, c.recv_at + c.n_recv)
        self.send = _Packed.alloc(c.n_recv, fields, carve)
        self.copies = [(self.send.typed[name], acc[name][rows]) for name, _, _ in fields]
        self.back = back if back is not None else _Packed.alloc(c.n_send, fields, carve)
        self.out_splits, self.in_splits = c.in_splits, c.out_splits  # the cast's, transposed
        self.idx = c.send_rows
        self.lse3, self.idx_exp = _merge_views(self.back, c.send_rows) if back is None else (None, None)

    def issue(self, comm):
        for d, x in self.copies:
            d.copy_(x)
        self.send.push()
        return comm.a2a(self.back.buf, self.send.buf, self.out_splits, self.in_splits)


class _Workspace:
    """One pass's program for one (plan, device, dtype): its buffers laid out in the device's shared arena
    (`_workspace.Arena`, from offset 0: one call runs at a time, and every program of every plan shares the
    bytes), the views its collectives and kernels read and write, and the plan's row indices they use. Each
    call zeroes the accumulators with one or two fills and allocates only its outputs. A pass's buffers are
    all written and read inside the pass (every collective is waited for before it returns), so nothing that
    autograd saves for the backward lives here."""

    def __init__(self, tp, pp, pass_, dtype, carve):
        local_rows, groups, q_per_group, kv_per_group = tp.rows, tp.G, tp.qpg, tp.kpg
        hq, hkv, dqk, dv, shared = tp.hq, tp.hkv, tp.dqk, tp.dv, tp.kv_shared
        remote_qo_rows, remote_kv_rows = pp.qo_rows, pp.kv_rows  # the remote buffers' rows, every stage's
        num_stages = len(pp.comm)
        acc_dtype = compute_dtype(dtype)  # what the partial results accumulate in
        fp32 = torch.float32
        self.dtype, self.acc_dtype, self.num_stages, self.shared, self.dv = dtype, acc_dtype, num_stages, shared, dv
        kv_fields = [("k", dtype, (kv_per_group, dqk))] + ([] if shared else [("v", dtype, (kv_per_group, dv))])
        if pass_ == "fwd":
            qo_fields = [("q", dtype, (q_per_group, dqk))]
        else:
            qo_fields = [("lse", fp32, (q_per_group,)), ("q", dtype, (q_per_group, dqk)),
                         ("o", dtype, (q_per_group, dv)), ("do", dtype, (q_per_group, dv))]
        self.recv_qo = _Packed.alloc(remote_qo_rows, qo_fields, carve)
        self.recv_kv = _Packed.alloc(remote_kv_rows, kv_fields, carve)
        recv_k = self.recv_kv.typed["k"]
        recv_v = recv_k[..., :dv] if shared else self.recv_kv.typed["v"]
        # this rank's rows of each field as the casts send them ((row, head group) flattened)
        self.row_shape = {name: torch.Size((local_rows * groups,) + tail) for name, _, tail in qo_fields + kv_fields}
        if pass_ == "fwd":
            self.acc_block = carve.empty((local_rows * hq * dv + remote_qo_rows * q_per_group * dv,), acc_dtype)
            self.lse_block = carve.empty((local_rows * hq + remote_qo_rows * q_per_group,), acc_dtype)
            o, remote_o = _carve(self.acc_block, [(local_rows, hq, dv), (remote_qo_rows, q_per_group, dv)])
            lse, remote_lse = _carve(self.lse_block, [(local_rows, hq), (remote_qo_rows, q_per_group)])
            # this rank's own rows, (row, head group) flattened: what the returns merge into
            self.local_acc = {"o": o.view(local_rows * groups, q_per_group, dv),
                              "lse": lse.view(local_rows * groups, q_per_group, 1)}
            # the remote rows' partials as a relay merges its returns into them (lse with a trailing 1)
            self.remote_acc = {"o": remote_o, "lse": remote_lse.unsqueeze(-1)}
            self.buffers = ForwardBuffers(
                o=o, lse=lse, remote_o=remote_o, remote_lse=remote_lse, remote_lse_rows=self.remote_acc["lse"],
                remote_q=self.recv_qo.typed["q"], remote_k=recv_k, remote_v=recv_v, indices=pp.indices,
                q_per_group=q_per_group, kv_per_group=kv_per_group, shared=shared)
            reduce_fields = {"qo": [("lse", fp32, (q_per_group,)), ("o", dtype, (q_per_group, dv))]}
            reduce_sources = {"lse": remote_lse, "o": remote_o}  # what a reduce sends back
        else:
            shapes = [(local_rows, hq, dqk), (local_rows, hkv, dqk)] + ([] if shared else [(local_rows, hkv, dv)]) + \
                [(remote_qo_rows, q_per_group, dqk), (remote_kv_rows, kv_per_group, dqk)] + \
                ([] if shared else [(remote_kv_rows, kv_per_group, dv)]) + [(remote_qo_rows, q_per_group)]
            self.acc_block = carve.empty((sum(math.prod(x) for x in shapes),), acc_dtype)
            parts = _carve(self.acc_block, shapes)
            if shared:
                dq, dk, remote_dq, remote_dk, remote_delta = parts
                dv_, remote_dv = None, None
            else:
                dq, dk, dv_, remote_dq, remote_dk, remote_dv, remote_delta = parts
            self.local_acc = {"dq": dq.view(local_rows * groups, q_per_group, dqk),
                              "dk": dk.view(local_rows * groups, kv_per_group, dqk),
                              "dv": None if shared else dv_.view(local_rows * groups, kv_per_group, dv)}
            self.buffers = BackwardBuffers(
                remote_lse=self.recv_qo.typed["lse"], remote_out=self.recv_qo.typed["o"],
                remote_dout=self.recv_qo.typed["do"], remote_delta=remote_delta, dq=dq, dk=dk, dv=dv_,
                remote_dq=remote_dq, remote_dk=remote_dk, remote_dv=remote_dv,
                remote_q=self.recv_qo.typed["q"], remote_k=recv_k, remote_v=recv_v, indices=pp.indices,
                q_per_group=q_per_group, kv_per_group=kv_per_group, shared=shared)
            self.lse_block = None
            dkv = [("dk", dtype, (kv_per_group, dqk))] + ([] if shared else [("dv", dtype, (kv_per_group, dv))])
            reduce_fields = {"qo": [("dq", dtype, (q_per_group, dqk))], "kv": dkv}
            reduce_sources = {"dq": remote_dq, "dk": remote_dk, "dv": remote_dv}
            self.remote_acc = reduce_sources  # a relay adds its returns into them
            # rowsum(dO O) of each stage's remote rows, computed when a backend reads buffers.remote_delta
            self.remote_delta_of = []
            for st in pp.comm:
                r = slice(st.qo_off, st.qo_off + st.qo_rows)
                self.remote_delta_of.append((remote_delta[r], self.buffers.remote_dout[r], self.buffers.remote_out[r])
                                            if st.qo_rows else None)

        self.merge_idx = {}  # the final merge's / add's rows (returns and backends' parts), per list of parts
        recv = {"qo": self.recv_qo, "kv": self.recv_kv}
        fields = {"qo": qo_fields, "kv": kv_fields}
        # first-phase casts: every stage's send rows in one buffer per kind, filled once per pass
        self.fill = []  # (idx, packed send buffer)
        self.casts = [[] for _ in range(num_stages)]  # per stage: (out, inp, out_splits, in_splits)
        self.forwards = [[] for _ in range(num_stages)]  # per stage: (rows, idx, send, out, out_splits, in_splits)
        self.pulls = [[] for _ in range(num_stages)]  # per stage: receive rows to unpack (loose fields only)
        for kind in ("qo", "kv"):
            rows = recv[kind]
            colls = [(s, getattr(st, kind)) for s, st in enumerate(pp.comm) if getattr(st, kind).active]
            send = _Packed.alloc(sum(c.n_send for _, c in colls), fields[kind], carve)
            if send.buf.shape[0]:
                self.fill.append((torch.cat([c.send_rows for _, c in colls]), send))
            at = 0
            for s, c in colls:
                self.casts[s].append((rows.buf[c.recv_at:c.recv_at + c.n_recv], send.buf[at:at + c.n_send],
                                      c.out_splits, c.in_splits))
                at += c.n_send
            for s, st in enumerate(pp.comm):
                c = getattr(st, kind + "_fwd")
                if c is not None and c.active:
                    fs = carve.empty((c.n_send, rows.buf.shape[1]), _U8)
                    self.forwards[s].append((rows.buf, c.send_rows, fs, rows.buf[c.recv_at:c.recv_at + c.n_recv],
                                             c.out_splits, c.in_splits))
                r0 = st.qo_off if kind == "qo" else st.kv_off
                n = st.qo_rows if kind == "qo" else st.kv_rows
                if rows.loose and n:
                    self.pulls[s].append(rows.rows(r0, r0 + n))

        # reduces, in the order the program issues their first phases; the first phase's returns of a kind
        # land side by side in one buffer, merged (forward) or added (backward) once at the end of the pass
        order = [(i.stage, i.kind) for i in pp.program if i.op == "reduce" and i.phase == "first"
                 and (i.kind == "qo" or pass_ == "bwd")]
        self.reduces = {}  # (stage, kind) -> (relay, first): their _Reduce, None where it moves nothing
        self.finals = {}
        for kind in ("qo", "kv"):
            firsts = [getattr(pp.comm[s2 - 1], kind) for s2, kd in order if kd == kind]
            firsts = [c for c in firsts if c.active]
            if not firsts:
                continue
            back = _Packed.alloc(sum(c.n_send for c in firsts), reduce_fields[kind], carve)
            idx = torch.cat([c.send_rows for c in firsts])
            self.finals[kind] = (back, idx) + _merge_views(back, idx)
        at = {"qo": 0, "kv": 0}
        for s2, kind in order:
            st = pp.comm[s2 - 1]
            c_fwd, c = getattr(st, kind + "_fwd"), getattr(st, kind)
            relay = _Reduce(c_fwd, reduce_fields[kind], reduce_sources, None, carve) \
                if c_fwd is not None and c_fwd.active else None
            first = None
            if c.active:
                back = self.finals[kind][0].rows(at[kind], at[kind] + c.n_send)
                at[kind] += c.n_send
                first = _Reduce(c, reduce_fields[kind], reduce_sources, back, carve)
            if relay is not None or first is not None:
                self.reduces[(s2, kind)] = (relay, first)

        self.fill_fields = [(name, idx, t, self.row_shape[name]) for idx, send in self.fill
                            for name, t in send.typed.items()]
        self.fill_loose = [send for _, send in self.fill if send.loose]

    def reset(self):
        self.acc_block.zero_()
        if self.lse_block is not None:
            self.lse_block.fill_(NEG_INF)
        return self.buffers

    def merge_rows(self, idxs, expand=False):
        """The rows of a local merge or add of parts whose rows are `idxs` (tensors fixed per plan: the
        returns' and a backend's cached batch rows), concatenated (and expanded for scatter_merge) once per
        list of parts."""
        key = tuple(map(id, idxs))
        hit = self.merge_idx.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], idxs)):
            with torch.inference_mode(False):
                return self._merge_rows(key, idxs, expand)
        return hit[1], hit[2]

    def _merge_rows(self, key, idxs, expand):
        idx = torch.cat(idxs) if len(idxs) > 1 else idxs[0]
        exp = None
        if expand:
            qpg = self.local_acc["lse"].shape[1]
            exp = idx.view(-1, 1, 1).expand(-1, qpg, 1).contiguous()
        hit = (list(idxs), idx, exp)
        if len(self.merge_idx) >= 16:  # a backend whose parts' rows change between calls
            self.merge_idx.clear()
        self.merge_idx[key] = hit
        return idx, exp

    def pack(self, src):
        """Every first-phase send row of the pass from this rank's inputs (`src`: field name -> tensor)."""
        for name, idx, t, sh in self.fill_fields:
            x = src[name]
            if x.shape != sh:
                x = x.view(sh) if x.is_contiguous() else x.reshape(sh)
            torch.index_select(x, 0, idx, out=t)
        for send in self.fill_loose:
            send.push()

    def forward_rows(self, s, comm):
        """The relays' forwarding phase of stage s (its first phase has arrived): issued, not waited for."""
        works = []
        for rows, idx, send, out, osp, isp in self.forwards[s - 1]:
            torch.index_select(rows, 0, idx, out=send)
            works.append(comm.a2a(out, send, osp, isp))
        return works

    def unpack(self, s):
        """Stage s's received rows into the fields that do not live in the bytes (odd sizes)."""
        for p in self.pulls[s - 1]:
            p.pull()


class _Pass:
    """What one run of a pass's program has in flight: each stage's casts until its wait_cast, its forwarding
    phase until its compute, each relay's forwarded partials until its first-phase reduce, and the
    first-phase reduces until wait_reduces. `compute(stage)`, `fold(relay)` (the relay's returns into its
    rows) and `merge()` are the pass's own (forward or backward)."""

    __slots__ = ("ws", "comm", "casts", "forwarding", "relays", "returns")

    def __init__(self, ws, comm):
        self.ws, self.comm = ws, comm
        self.casts, self.forwarding, self.relays, self.returns = {}, {}, {}, []

    def cast(self, i):
        if i.phase == "first":
            self.casts[i.stage] = [self.comm.a2a(*x) for x in self.ws.casts[i.stage - 1]]
        # the forwarding phase leaves at wait_cast, once the first phase has arrived (no comm stream here)

    def wait_cast(self, i):
        _wait(self.casts.pop(i.stage))
        self.forwarding[i.stage] = self.ws.forward_rows(i.stage, self.comm)

    def arrive(self, s):
        """Stage s's rows are all here (forwarded ones too) before it computes."""
        if s:
            _wait(self.forwarding.pop(s))
            self.ws.unpack(s)

    def reduce(self, i, fold):
        relay, first = self.ws.reduces.get((i.stage, i.kind), (None, None))
        if i.phase == "forwarding":
            if relay is not None:
                self.relays[(i.stage, i.kind)] = (relay, relay.issue(self.comm))
            return
        self.fold_relay((i.stage, i.kind), fold)  # the relay's rows hold its peers' partials before they go back
        if first is not None:
            self.returns.append(first.issue(self.comm))

    def fold_relay(self, key, fold):
        pending = self.relays.pop(key, None)
        if pending is not None:
            relay, work = pending
            if work is not None:
                work.wait()
            relay.back.pull()
            fold(relay)

    def wait_reduces(self, fold):
        for key in list(self.relays):
            self.fold_relay(key, fold)
        _wait(self.returns)


def _interpret(ws, program, comm, compute, fold, merge):
    """Runs the pass's program (module docstring): `compute(stage)` runs a stage's args, `fold(relay)` folds
    a relay's returned partials into its rows, `merge()` folds the returns into the rank's own rows."""
    run = _Pass(ws, comm)
    for i in program:
        op = i.op
        if op == "cast":
            run.cast(i)
        elif op == "wait_cast":
            run.wait_cast(i)
        elif op == "compute":
            run.arrive(i.stage)
            compute(i.stage)
        elif op == "reduce":
            run.reduce(i, fold)
        elif op == "wait_reduces":
            run.wait_reduces(fold)
        elif op == "merge":
            merge()


def _workspace(dp, pass_, dt):
    """The pass's program bound to its device's arena: laid out on first use (and again after the arena
    grew), kept in the arena itself, weakly keyed by the plan's device pass."""
    ar = arena(dp.device)
    if ar.busy:  # a call inside a call (e.g. from a backend or a hook): an arena of its own, not kept
        ar = Arena(dp.device)
    owner = dp.fwd if pass_ == "fwd" else dp.bwd
    key = (pass_, dt)
    ws = ar.get(owner, key)
    if ws is not None and ws.scratch.start + ws.scratch.need <= ar.nbytes:
        return ar, ws
    need = 0 if ws is None else ws.scratch.start + ws.scratch.need
    with torch.inference_mode(False):
        while True:
            if need > ar.nbytes:
                ar.grow(need)
            carve = Carver(ar.buf, dp.device)
            ws = _Workspace(dp.tp, owner, pass_, dt, carve)
            if not carve.overflow:
                break
            need = carve.at
    ws.scratch = Scratch(carve.at, dp.device)
    ar.put(owner, key, ws)
    return ar, ws


def _begin(dp, pass_, q, k, v):
    """The pass's arena (marked busy) and program, reset for a call, and V (a view of K's latent when K and V
    share it)."""
    ar, ws = _workspace(dp, pass_, q.dtype)
    ar.busy = True
    buffers = ws.reset()
    buffers.indices = (dp.fwd if pass_ == "fwd" else dp.bwd).indices  # read per call: an ingestion rewrites them
    buffers.take = lambda key, specs, build=None: ws.scratch.take(ar.buf, key, specs, build)
    return ar, ws, buffers, (k[..., :ws.dv] if ws.shared else v)


def run_forward(dp, q, k, v, backend, comm, scale):
    """Forward pass of this rank: returns O (q's dtype) [L, hq, dv] and lse (fp32) [L, hq]."""
    o, lse = forward_program(dp, q, k, v, backend, comm, scale)
    return o.to(q.dtype, copy=True), lse.to(torch.float32, copy=True)


def forward_program(dp, q, k, v, backend, comm, scale):
    """The forward pass up to its accumulators: O and lse in the compute dtype, views of the device's
    workspace, valid until its next call (what a CUDA graph of the pass captures, _graphs.py)."""
    pp = dp.fwd
    ar, ws, buffers, v = _begin(dp, "fwd", q, k, v)
    buffers.q, buffers.k, buffers.v, buffers.scale = q, k, v, scale
    try:
        return _forward(ws, buffers, pp, backend, comm, {"q": q, "k": k, "v": v})
    finally:
        buffers.release("q", "k", "v", "take")
        ar.busy = False


def _forward(ws, buffers, pp, backend, comm, src):
    ws.pack(src)
    remote_acc = ws.remote_acc

    def compute(s):
        backend.forward_stage(pp.stages[s - 1] if s else pp.stage0, buffers)

    def fold(relay):  # forwarded partials back at their relay: merged into its rows
        scatter_merge(remote_acc["o"], remote_acc["lse"], relay.idx, relay.back.typed["o"], relay.lse3, relay.idx_exp)

    _interpret(ws, pp.program, comm, compute, fold, lambda: _merge_forward(ws, buffers))
    return buffers.o, buffers.lse


def _merge_forward(ws, buffers):
    fin = ws.finals.get("qo")
    if fin is not None:
        fin[0].pull()
    if buffers.local_parts:  # the backend's partials of local rows and the returned ones: one merge
        parts = ([(fin[0].typed["o"], fin[0].typed["lse"], fin[1])] if fin is not None else []) + buffers.local_parts
        idx, exp = ws.merge_rows([p[2] for p in parts], True)
        o = torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        lse = torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
        scatter_merge(ws.local_acc["o"], ws.local_acc["lse"], idx, o, lse.unsqueeze(-1), exp)
    elif fin is not None:
        back, idx, lse3, exp = fin
        scatter_merge(ws.local_acc["o"], ws.local_acc["lse"], idx, back.typed["o"], lse3, exp)


def run_backward(dp, q, k, v, out, lse, dout, backend, comm, scale):
    """Backward pass of this rank: dQ, dK, dV (None when K and V share the latent: dV is inside dK)."""
    dq, dk, dv = backward_program(dp, q, k, v, out, lse, dout, backend, comm, scale)
    dt = q.dtype
    return dq.to(dt, copy=True), dk.to(dt, copy=True), (None if dv is None else dv.to(dt, copy=True))


def backward_program(dp, q, k, v, out, lse, dout, backend, comm, scale):
    """The backward pass up to its accumulators: dQ, dK, dV in the compute dtype (dV None for a shared
    latent), views of the device's workspace valid until its next call."""
    pp = dp.bwd
    dt = q.dtype
    ar, ws, buffers, v = _begin(dp, "bwd", q, k, v)
    out = out.to(dt)
    dout = dout.to(dt)
    lse = lse.float()
    buffers.q, buffers.k, buffers.v, buffers.lse, buffers.out, buffers.dout = q, k, v, lse, out, dout
    buffers.scale = scale
    try:
        return _backward(ws, buffers, pp, backend, comm, {"lse": lse, "q": q, "o": out, "do": dout, "k": k, "v": v})
    finally:
        buffers.release("q", "k", "v", "lse", "out", "dout", "take")
        ar.busy = False


def _backward(ws, buffers, pp, backend, comm, src):
    acc_dtype = ws.acc_dtype
    ws.pack(src)
    remote_acc = ws.remote_acc

    def compute(s):
        if s:
            d = ws.remote_delta_of[s - 1]
            if d is not None:
                buffers.defer_remote_delta(*d)
        backend.backward_stage(pp.stages[s - 1] if s else pp.stage0, buffers)

    def fold(relay):  # forwarded gradients back at their relay: added into its rows
        for name, g in relay.back.typed.items():
            remote_acc[name].index_add_(0, relay.idx, g.to(acc_dtype))

    _interpret(ws, pp.program, comm, compute, fold, lambda: _merge_backward(ws, buffers))
    return buffers.dq, buffers.dk, (None if ws.shared else buffers.dv)


def _merge_backward(ws, buffers):
    # every stage's returns of a field and the backend's gradients of local rows at once: one index_add
    parts = {name: list(g) for name, g in buffers.local_grads.items()}
    for back, idx, _, _ in ws.finals.values():
        back.pull()
        for name, g in back.typed.items():
            parts[name].insert(0, (g, idx))
    for name, lst in parts.items():
        if not lst:
            continue
        idx, _ = ws.merge_rows([p[1] for p in lst])
        g = torch.cat([p[0] for p in lst]) if len(lst) > 1 else lst[0][0]
        ws.local_acc[name].index_add_(0, idx, g.to(ws.acc_dtype))
