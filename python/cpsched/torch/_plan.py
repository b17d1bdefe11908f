"""A cpsched plan prepared for execution in PyTorch, once per (plan, rank).

Everything the executor needs per call is computed here from the plan (docs/plan_format.md; a Result's arrays
or a text's JSON, both read into the same structures by _plandata) and kept:
this rank's args per stage, per (stage, kind, phase) the split lists of the all_to_all and the row indices
that pack its send buffer, the receive offsets, the reduce points, and which collectives carry data on
*any* rank (a collective that moves nothing anywhere is skipped on every rank alike). Index tensors live on
the CPU and are copied to a device once, on first use there (`TorchPlan.on(device)`).
"""
from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import _cpsched
from . import _plandata, _program


class Layout:
    """Which global tokens each rank hosts: `host_ranges[r]` is rank r's ranges, in the order of its local
    buffer (docs/plan_format.md). Two layouts are equal when every rank hosts the same ranges in the same
    order. `sequential` is the fixed sequential sharding (rank p hosts [p S / P, (p + 1) S / P))."""

    __slots__ = ("cp_size", "seqlen", "host_ranges", "sequential", "_key", "_index")

    def __init__(self, seqlen, host_ranges):
        self.seqlen = int(seqlen)
        self.host_ranges = tuple(tuple((int(b), int(e)) for b, e in rs) for rs in host_ranges)
        self.cp_size = len(self.host_ranges)
        seq = _cpsched.sharding_ranges(self.seqlen, self.cp_size)
        self.sequential = all(
            (len(rs) == 1 and rs[0] == (int(seq[r][0]), int(seq[r][1]))) or
            (sum(e - b for b, e in rs) == 0 and int(seq[r][0]) == int(seq[r][1]))
            for r, rs in enumerate(self.host_ranges))
        self._key = hash(self.host_ranges)
        self._index = {}

    def rows(self, rank):
        """Tokens rank `rank` hosts (its local buffer's rows)."""
        return sum(e - b for b, e in self.host_ranges[rank])

    def global_index(self, rank):
        """int64 tensor: local row -> global token of `rank` (CPU, cached)."""
        t = self._index.get(rank)
        if t is None:
            rs = self.host_ranges[rank]
            with torch.inference_mode(False):  # cached: never an inference tensor (dispatch saves it for backward)
                t = torch.from_numpy(np.concatenate([np.arange(b, e, dtype=np.int64) for b, e in rs])
                                     if rs else np.zeros(0, dtype=np.int64))
            self._index[rank] = t
        return t

    def order(self):
        """int64 tensor of S entries: the global token at each position of the ranks' local buffers laid end
        to end (rank 0's rows, then rank 1's, ...)."""
        t = self._index.get("all")
        if t is None:
            with torch.inference_mode(False):
                t = torch.cat([self.global_index(r) for r in range(self.cp_size)])
            self._index["all"] = t
        return t

    def __eq__(self, other):
        return isinstance(other, Layout) and self._key == other._key and self.host_ranges == other.host_ranges \
            and self.seqlen == other.seqlen

    def __hash__(self):
        return self._key

    def __repr__(self):
        kind = "sequential" if self.sequential else "dispatched"
        return f"<cpsched.torch.Layout {kind} S={self.seqlen} P={self.cp_size} key={self._key & 0xffffffff:08x}>"


@dataclass
class Coll:
    """One all_to_all_single of one rank: a group-cast (forward direction) or, transposed, its group-reduce.

    Cast: this rank sends `in_splits[p]` rows to peer p, packed in `send_rows` order, and receives
    `out_splits[p]` rows from p into its receive buffer at `recv_at` (rows of the whole remote buffer).
    Reduce: the same call with the split lists swapped; what comes back lands at `send_rows`.
    First phase: `send_rows` are local rows flattened with their head group (row * G + group).
    Forwarding phase (relays): `send_rows` are rows of this rank's remote buffer (its stage receive).
    """
    in_splits: list
    out_splits: list
    send_rows: torch.Tensor
    n_send: int
    n_recv: int
    recv_at: int
    active: bool  # some rank sends something in it (identical on every rank)


@dataclass
class Arg:
    q0: int
    q1: int
    k0: int
    k1: int
    type: int
    group: int
    q_remote: bool
    k_remote: bool
    index_offset: int = -1
    index_width: int = 0


@dataclass
class Stage:
    qo_off: int
    kv_off: int
    qo_rows: int
    kv_rows: int
    qo_after: int
    kv_after: int
    qo: Coll
    kv: Coll
    qo_fwd: Coll | None
    kv_fwd: Coll | None


@dataclass
class PassPlan:
    stage0: list
    stages: list
    qo_rows: int
    kv_rows: int
    indices: torch.Tensor | None  # the pass's index pool (index args), int64
    reduces: dict = field(default_factory=dict)  # t -> [s2, ...] (QO and KV lists)
    program: tuple = ()  # the order the rank runs the pass in (_program.Instr, the core's)


def _concat_ranges(b, e):
    """The concatenation of arange(b[i], e[i]) over i (int64)."""
    lengths = e - b
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.cumsum(lengths) - lengths  # where each range starts in the output
    return np.repeat(b - first, lengths) + np.arange(total, dtype=np.int64)


def _pairs(c):
    """(input split, receiver) of every send of collective `c`, ordered by receiver, then by input split."""
    inputs = np.repeat(np.arange(len(c.sizes), dtype=np.int64), np.diff(c.dst_ptr))
    order = np.argsort(c.dst, kind="stable")
    return inputs[order], c.dst[order]


def _coll_of(c, P, G, recv_at, relay):
    """The Coll of a plan's collective `c` (_plandata.Coll): the split lists per peer and the send buffer's rows,
    packed by peer and, per peer, in the order of the input splits. First phase: local rows flattened with
    their head group (row * G + group); forwarding phase (`relay`): rows of the stage's receive buffer."""
    inputs, dst = _pairs(c)
    in_splits = np.zeros(P, dtype=np.int64)
    np.add.at(in_splits, dst, c.sizes[inputs])
    out_splits = np.zeros(P, dtype=np.int64)
    np.add.at(out_splits, c.src, c.out_sizes)
    b, e = c.ranges[inputs, 0], c.ranges[inputs, 1]
    rows = _concat_ranges(b, e)
    if not relay:
        rows = rows * G + np.repeat(np.maximum(c.groups[inputs], 0), e - b)
    in_splits, out_splits = in_splits.tolist(), out_splits.tolist()
    return Coll(in_splits, out_splits, torch.from_numpy(rows), int(sum(in_splits)), int(sum(out_splits)), recv_at,
                False)


def _empty_coll(P, recv_at):
    return Coll([0] * P, [0] * P, torch.zeros(0, dtype=torch.int64), 0, 0, recv_at, False)


class ArgList(list):
    """The args of one stage; backends may cache what they derive from it as attributes."""


def _args_of(a):
    """The Args (columns, _plandata.Args) as a list of Arg."""
    q, k = a.q.tolist(), a.k.tolist()
    return ArgList(Arg(q0, q1, k0, k1, t, g, bool(qr), bool(kr), io, iw) for (q0, q1), (k0, k1), t, g, qr, kr, io, iw in
                   zip(q, k, a.type.tolist(), a.group.tolist(), a.q_remote.tolist(), a.k_remote.tolist(),
                       a.index_offset.tolist(), a.index_width.tolist()))


def _pass_plan(data, rank, pass_, G, pool):
    """`rank`'s pass of the plan `data` (_plandata.PlanData) with its index pool `pool` (int64 or None)."""
    P = data.problem.cp_size
    mine = getattr(data.entry(rank), pass_)
    # Whether a collective runs: some rank sends in it. A rank's own plan does not list the other ranks'
    # sends: a stage's cast of a kind then runs on any rank iff some rank receives that kind in it, which is
    # when its reduce_after (the same on every rank) is set; its forwarding phases are resolved per call
    # (TorchPlan.set_forwarding).
    active = None if data.per_rank else data.active(pass_)
    N = len(mine.stages)
    stages = []
    qo_total = kv_total = 0
    for s, st in enumerate(mine.stages):
        qo = _coll_of(st.qo, P, G, st.qo_recv_offset, False)
        kv = _coll_of(st.kv, P, G, st.kv_recv_offset, False)
        qo.active = bool(active[s, 0]) if active is not None else st.qo_reduce_after > 0
        kv.active = bool(active[s, 1]) if active is not None else st.kv_reduce_after > 0
        fwds = []
        for j, c, off, first in ((2, st.qo_fwd, st.qo_recv_offset, qo.n_recv), (3, st.kv_fwd, st.kv_recv_offset, kv.n_recv)):
            # A rank that neither forwards nor receives forwarded rows has no such phase, while the phase may
            # carry data elsewhere: it still takes part in the collective, with empty split lists.
            f = _coll_of(c, P, G, off + first, True) if c is not None else _empty_coll(P, off + first)
            f.active = bool(active[s, j]) if active is not None else False
            # the relay's send rows index its stage receive; make them rows of the whole remote buffer
            f.send_rows = f.send_rows + off
            fwds.append(f)
        qo_fwd, kv_fwd = fwds
        n_qo = qo.n_recv + qo_fwd.n_recv
        n_kv = kv.n_recv + kv_fwd.n_recv
        if n_qo != st.num_remote_qo_tokens or n_kv != st.num_remote_kv_tokens:
            raise ValueError(f"plan: {pass_} stage {s + 1} of rank {rank} declares {st.num_remote_qo_tokens} QO "
                             f"and {st.num_remote_kv_tokens} KV rows but its output splits hold {n_qo} and {n_kv}")
        stages.append(Stage(st.qo_recv_offset, st.kv_recv_offset, n_qo, n_kv, st.qo_reduce_after,
                            st.kv_reduce_after, qo, kv, qo_fwd, kv_fwd))
        qo_total = max(qo_total, st.qo_recv_offset + n_qo)
        kv_total = max(kv_total, st.kv_recv_offset + n_kv)
    stage0 = _args_of(mine.local)
    remote = [_args_of(a) for a in mine.remote]
    if len(remote) != N:
        raise ValueError(f"plan: {pass_} of rank {rank} has {len(remote)} remote arg lists for {N} stages")
    pp = PassPlan(stage0, remote, qo_total, kv_total, torch.from_numpy(pool) if pool is not None else None)
    pp.stages_comm = stages
    # A plan from top-k row runs: the index rows are written from the rank's rows where they live
    # (_topk.write_index_rows), with the remote rows' tokens the plan lists.
    pp.deferred_entries = mine.deferred_index_entries
    pp.remote_rows = {kind: _remote_runs(mine.remote_rows[kind], total)
                      for kind, total in (("qo", qo_total), ("kv", kv_total))}
    pp.reduces = _reduce_points(pp, pass_)
    pp.program = _program.from_array(mine.program)
    return pp


def _reduce_points(pp, pass_):
    """reduce(t) sends back every stage s2 whose *_reduce_after is t (the same on every rank)."""
    N = len(pp.stages_comm)
    red = {}
    for s2, st in enumerate(pp.stages_comm, start=1):
        if st.qo.active or st.qo_fwd.active:
            if not s2 <= st.qo_after <= N:
                raise ValueError(f"plan: {pass_} stage {s2} qo_reduce_after = {st.qo_after} is outside "
                                 f"[{s2}, {N}]")
            red.setdefault(st.qo_after, []).append((s2, "qo"))
        if pass_ == "bwd" and (st.kv.active or st.kv_fwd.active):
            if not s2 <= st.kv_after <= N:
                raise ValueError(f"plan: {pass_} stage {s2} kv_reduce_after = {st.kv_after} is outside "
                                 f"[{s2}, {N}]")
            red.setdefault(st.kv_after, []).append((s2, "kv"))
    return red


def _remote_runs(runs, total):
    """(global token, head group) of each row of a remote buffer of `total` rows from the plan's runs, int64
    rows (begin, end, row, group) (CommMeta::remote_*_rows); None when the plan lists none."""
    if not len(runs):
        return None
    b, e, row, grp = runs[:, 0], runs[:, 1], runs[:, 2], runs[:, 3]
    bad = (row < 0) | (row + (e - b) > total)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"plan: remote rows [{row[i]}, {row[i] + e[i] - b[i]}) are outside the buffer's {total} rows")
    g_all = np.full(total, -1, dtype=np.int64)
    h_all = np.full(total, -1, dtype=np.int64)
    at = _concat_ranges(row, row + (e - b))
    g_all[at] = _concat_ranges(b, e)
    h_all[at] = np.repeat(grp, e - b)
    return torch.from_numpy(g_all), torch.from_numpy(h_all)


def _sent_to(c, rank):
    """The input splits of collective `c` that go to `rank`, in order: (begin, end, group) arrays."""
    if c is None:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    inputs, dst = _pairs(c)
    i = np.sort(inputs[dst == rank])
    return c.ranges[i, 0], c.ranges[i, 1], c.groups[i]


def _remote_row_globals(data, rank, pass_, layout):
    """{kind: (global token, head group) of each row of `rank`'s remote QO / KV buffer} from every rank's
    CommMeta: a receiver's output splits from a source are that source's input splits naming it, in order;
    forwarded rows are rows of the relay's receive buffer of the same stage."""
    passes = [getattr(e, pass_) for e in data.entries]
    memo = {}

    def first(kind, r, s):
        """The (global, group) of the rows rank r receives in the first phase of stage s: needed for `rank` and
        for the relays that forward rows to it."""
        got = memo.get((kind, r, s))
        if got is None:
            parts_g, parts_h = [], []
            for src in np.unique(getattr(passes[r].stages[s], kind).src).tolist():
                b, e, grp = _sent_to(getattr(passes[src].stages[s], kind), r)
                parts_g.append(layout.global_index(src).numpy()[_concat_ranges(b, e)])
                parts_h.append(np.repeat(grp, e - b))
            got = memo[(kind, r, s)] = (np.concatenate(parts_g) if parts_g else np.zeros(0, dtype=np.int64),
                                        np.concatenate(parts_h) if parts_h else np.zeros(0, dtype=np.int64))
        return got

    out = {}
    for kind in ("qo", "kv"):
        stages = passes[rank].stages
        off_key, n_key = f"{kind}_recv_offset", f"num_remote_{kind}_tokens"
        total = max([getattr(st, off_key) + getattr(st, n_key) for st in stages] or [0])
        g_all = np.full(total, -1, dtype=np.int64)
        h_all = np.full(total, -1, dtype=np.int64)
        for s, st in enumerate(stages):
            fg, fh = first(kind, rank, s)
            parts_g, parts_h = [fg], [fh]
            fw = getattr(st, kind + "_fwd")
            if fw is not None:
                for src in np.unique(fw.src).tolist():
                    sg, sh = first(kind, src, s)
                    b, e, _ = _sent_to(getattr(passes[src].stages[s], kind + "_fwd"), rank)
                    at = _concat_ranges(b, e)
                    parts_g.append(sg[at])
                    parts_h.append(sh[at])
            gg, hh = np.concatenate(parts_g), np.concatenate(parts_h)
            off = getattr(st, off_key)
            g_all[off:off + len(gg)] = gg
            h_all[off:off + len(hh)] = hh
        out[kind] = (torch.from_numpy(g_all), torch.from_numpy(h_all))
    return out


def _rank_arg(rank):
    """A rank argument: an int (a numpy integer too), not a bool or a float."""
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise ValueError(f"rank: expected an integer rank, got {rank!r} ({type(rank).__name__})")
    return int(rank)


def _split_digests(tp):
    """Per peer, a digest of the rows this rank sends it and of the rows it expects from it, in every
    collective of both passes (first phases with whether they run): the peer's must be the transpose."""
    from ._agree import digest
    P = tp.cp_size
    send, recv = [], []
    for pp in (tp.fwd, tp.bwd):
        for st in pp.stages_comm:
            for c in (st.qo, st.kv, st.qo_fwd, st.kv_fwd):
                first = c is st.qo or c is st.kv
                act = (1 if c.active else 0) if first else 0
                send.append([act] + list(c.in_splits))
                recv.append([act] + list(c.out_splits))
    S = np.array(send, dtype=np.int64).reshape(-1, P + 1)
    R = np.array(recv, dtype=np.int64).reshape(-1, P + 1)
    sd = [digest(np.ascontiguousarray(S[:, [0, p + 1]]).tobytes()) for p in range(P)]
    rd = [digest(np.ascontiguousarray(R[:, [0, p + 1]]).tobytes()) for p in range(P)]
    return sd, rd


def _own_forwarding_bits(tp):
    bits = 0
    for pi, pp in enumerate((tp.fwd, tp.bwd)):
        N = len(pp.stages_comm)
        for s, st in enumerate(pp.stages_comm):
            for ki, c in enumerate((st.qo_fwd, st.kv_fwd)):
                if c.n_send or c.n_recv:
                    bits |= 1 << ((pi * N + s) * 2 + ki)
    return bits


class TorchPlan:
    """A cpsched plan (a `cpsched.Result`) prepared for one rank: build it once per plan with
    `TorchPlan(result, rank)` (or let `cpsched.torch.attention` cache it) and pass it per call."""

    def __init__(self, result, rank, *, data=None):
        # A Result's plan from the extension's arrays (no JSON: a DSA layer's plan is large); a text's from its
        # parsed JSON (from_json). Both give the same structures (_plandata.PlanData), and from them the same
        # prepared passes and the same digest.
        if data is None:
            data = _plandata.of_result(result)
        self.result = result  # keeps the Result (and its plugins) alive while the plan is in use
        self.solver = data.solver
        pr = data.problem
        self.cp_size = pr.cp_size
        rank = _rank_arg(rank)
        if not 0 <= rank < self.cp_size:
            raise ValueError(f"rank: {rank} is outside [0, {self.cp_size}) of the plan's P = {self.cp_size}")
        self.rank = rank
        self.seqlen = pr.seqlen
        self.hq = pr.heads_q
        self.hkv = pr.heads_kv
        self.dqk = pr.head_dim
        self.dv = pr.head_dim_v
        self.kv_shared = pr.kv_shared
        self.dtype_bytes = pr.dtype_bytes
        self.G = pr.head_groups
        self.flattened = pr.flatten_head_groups
        self.qpg = self.hq // self.G
        self.kpg = self.hkv // self.G
        self.layout = Layout(self.seqlen, pr.host_ranges)
        self.rows = self.layout.rows(self.rank)
        self.num_stages = data.num_stages
        self.local_tail = data.local_tail  # the last stage moves nothing (docs/plan_format.md)
        self.mask = pr.mask  # _plandata.Slices
        self.head_masks = pr.head_masks
        self.index_mask = pr.index_mask
        # what the plan says it moves (the byte tests compare the wire with it); the executor needs none
        self.metrics = data.metrics
        self.fwd = _pass_plan(data, self.rank, "fwd", self.G, data.index_pool(self.rank, "fwd"))
        self.bwd = _pass_plan(data, self.rank, "bwd", self.G, data.index_pool(self.rank, "bwd"))
        if self.index_mask is not None and not data.per_rank:  # what remap_topk needs
            for pp, name in ((self.fwd, "fwd"), (self.bwd, "bwd")):
                pp.row_global = _remote_row_globals(data, self.rank, name, self.layout)
        self.blocks_per_rank = pr.blocks_per_rank
        # the index rows are the executor's to write (a plan from top-k row runs: cpsched.torch.ingest_topk)
        self.deferred = self.fwd.deferred_entries > 0 or self.bwd.deferred_entries > 0
        # some rank forwards rows in some stage (the plan was built with relays and they carry data)
        self.relays = any(c is not None and c.active for pp in (self.fwd, self.bwd) for st in pp.stages_comm
                          for c in (st.qo_fwd, st.kv_fwd))
        self.has_index_args = self.fwd.indices is not None or self.bwd.indices is not None or any(
            a.index_width > 0 for pp in (self.fwd, self.bwd) for lst in [pp.stage0] + pp.stages for a in lst)
        # A rank's own plan (Session(rank=r), per-rank top-k summaries) holds no other rank's entry: whether
        # some rank forwards rows in a stage is not in it. The agreement ORs the ranks' own forwarding phases
        # per call (set_forwarding); a plan known to have no relays skips that.
        self.per_rank = data.per_rank
        self.forwarding_known = not self.per_rank
        self._forwarding = None if self.per_rank else "known"
        self.digest = data.digest()
        self.split_digests = _split_digests(self)
        self.own_forwarding_bits = _own_forwarding_bits(self) if self.per_rank else 0
        self._devices = {}

    @classmethod
    def from_json(cls, text, rank):
        """A TorchPlan from a plan's JSON text (`Result.to_json()`): e.g. one rank solves and broadcasts the
        text, so that every rank runs the same plan even with a solver that is not deterministic (ilp with a
        time limit). The whole plan is validated first (`_validate.validate_plan`: every field, split, range,
        group, rank, stage and index, and that the args compute the mask exactly), so a plan that is wrong
        raises the same ValueError, naming the field, on every rank that loads the text."""
        rank = _rank_arg(rank)
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        if not isinstance(text, str):
            raise ValueError(f"text: expected the plan's JSON text (str), got {type(text).__name__}")
        try:
            d = json.loads(text)
        except ValueError as e:
            raise ValueError(f"plan: the text is not JSON: {e}") from None
        from ._validate import validate_plan
        validate_plan(d)
        data = _plandata.of_text(d)
        if data.per_rank and 0 <= rank < data.problem.cp_size and data.entries[0].rank != rank:
            # Another rank's own plan: this rank raises when it uses it, inside the call's agreement, so that
            # every rank that loaded the same text raises together (none waits in a collective).
            return _OtherRankPlan(data, rank)
        return cls(None, rank, data=data)

    def declare_no_forwarding(self):
        """The maker of this plan knows that no rank forwards rows (built without relays): per-rank plans then
        need no per-call resolution of the forwarding phases."""
        if self.per_rank and not self.own_forwarding_bits:
            self.forwarding_known = True
            self.set_forwarding(0)
        return self

    def conservative_forwarding_bits(self):
        """Every forwarding phase that some rank could use: those of each (pass, stage, kind) whose first
        phase carries rows (what a rank's own plan can run without the agreement; empty phases cost one
        empty collective each)."""
        bits = 0
        for pi, pp in enumerate((self.fwd, self.bwd)):
            N = len(pp.stages_comm)
            for s, st in enumerate(pp.stages_comm):
                for ki, c in enumerate((st.qo, st.kv)):
                    if c.active:
                        bits |= 1 << ((pi * N + s) * 2 + ki)
        return bits

    def set_forwarding(self, bits):
        """Which forwarding phases run (a rank's own plan: the OR of every rank's own bits, from the
        agreement). Re-lays the passes only when they change."""
        if not self.per_rank or self._forwarding == bits:
            return
        for pi, (pp, name) in enumerate(((self.fwd, "fwd"), (self.bwd, "bwd"))):
            N = len(pp.stages_comm)
            for s, st in enumerate(pp.stages_comm):
                st.qo_fwd.active = bool(bits >> ((pi * N + s) * 2) & 1)
                st.kv_fwd.active = bool(bits >> ((pi * N + s) * 2 + 1) & 1)
            pp.reduces = _reduce_points(pp, name)
        self.relays = bool(bits)
        self._forwarding = bits
        self._devices = {}

    @classmethod
    def all_ranks(cls, result):
        """One TorchPlan per rank from a single read of the plan (benchmarks, single-process simulations)."""
        data = _plandata.of_result(result)
        return [cls(result, r, data=data) for r in range(data.problem.cp_size)]

    def on(self, device):
        """The plan's index tensors on `device` (copied once per device)."""
        key = str(device)
        dp = self._devices.get(key)
        if dp is None:
            with torch.inference_mode(False):  # kept across calls: ordinary tensors even if first made in eval
                dp = _DevicePlan(self, torch.device(device))
            self._devices[key] = dp
        return dp

    def index_rows_missing(self, device):
        """An error text when the plan's index rows are the executor's to write and none were written for
        `device` (cpsched.torch.ingest_topk writes them where the indices are), else None."""
        if not self.deferred:
            return None
        dp = self._devices.get(str(device))
        if dp is None or (self.fwd.deferred_entries and dp.fwd.indices is None) or \
                (self.bwd.deferred_entries and dp.bwd.indices is None):
            return (f"plan: its index rows are written from the rank's top-k rows on their device "
                    f"(cpsched.torch.ingest_topk), and none were written on {device}")
        return None

    def __repr__(self):
        return (f"<cpsched.torch.TorchPlan rank {self.rank} of P={self.cp_size} S={self.seqlen} "
                f"heads {self.hq}:{self.hkv} d {self.dqk}/{self.dv}{' shared' if self.kv_shared else ''} "
                f"stages={self.num_stages}{' relays' if self.relays else ''} {self.layout!r}>")


class _OtherRankPlan(TorchPlan):
    """A rank's own plan text loaded by another rank (from_json): it runs nothing; the call that uses it raises
    `error` in its agreement."""

    def __init__(self, data, rank):  # noqa: super().__init__ is not called: there is nothing of this rank to build
        pr = data.problem
        self.result, self.solver, self.rank = None, "?", rank
        self.cp_size, self.seqlen = pr.cp_size, pr.seqlen
        self.layout = Layout(self.seqlen, pr.host_ranges)
        self.per_rank, self.forwarding_known = True, True
        self.error = (f"plan: the text holds the plan of rank {data.entries[0].rank} only (a rank's own plan), not "
                      f"rank {rank}'s")

    def __repr__(self):
        return f"<cpsched.torch.TorchPlan of rank {self.rank}: {self.error}>"


class _DevicePass:
    __slots__ = ("stage0", "stages", "comm", "qo_rows", "kv_rows", "indices", "reduces", "program", "__weakref__")

    def __init__(self, pp, device):
        def mv(c):
            if c is None:
                return None
            return Coll(c.in_splits, c.out_splits, c.send_rows.to(device), c.n_send, c.n_recv, c.recv_at, c.active)
        self.stage0 = pp.stage0
        self.stages = pp.stages
        self.comm = [Stage(st.qo_off, st.kv_off, st.qo_rows, st.kv_rows, st.qo_after, st.kv_after, mv(st.qo),
                           mv(st.kv), mv(st.qo_fwd), mv(st.kv_fwd)) for st in pp.stages_comm]
        self.qo_rows = pp.qo_rows
        self.kv_rows = pp.kv_rows
        self.indices = pp.indices.to(device) if pp.indices is not None else None
        self.reduces = pp.reduces
        self.program = pp.program


class _DevicePlan:
    def __init__(self, tp, device):
        self.tp = tp
        self.device = device
        self.fwd = _DevicePass(tp.fwd, device)
        self.bwd = _DevicePass(tp.bwd, device)
