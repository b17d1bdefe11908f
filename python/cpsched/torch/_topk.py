"""Token top-k masks on the rows' device: a rank's summary and row runs counted with torch ops
(`summarize_topk`), and the index rows of a plan made from them written there (`write_index_rows`), so that
the host never reads the rank's [S/P, H_kv, k] keys (docs/torch.md, "Index masks on the device")."""
from __future__ import annotations

import numpy as np
import torch

from .. import TopkRowRuns, TopkSummary, _cpsched


def blocks_of(seqlen, cp_size, blocks_per_rank):
    """The sequential sharding's blocks [(begin, end), ...] (Sharding::sequential: each rank's shard cut
    into blocks_per_rank pieces, the first ones a token longer)."""
    out = []
    for b, e in _cpsched.sharding_ranges(seqlen, cp_size):
        b, n = int(b), int(e) - int(b)
        base, extra = divmod(n, blocks_per_rank)
        for i in range(blocks_per_rank):
            s = b + i * base + min(i, extra)
            out.append((s, s + base + (1 if i < extra else 0)))
    return out


def _runs(mask, cut):
    """Start and end (exclusive) positions of the runs of True in the 1-D bool tensor `mask`, runs also
    ending where `cut` (bool, True at the first position of a piece) starts a new piece."""
    prev = torch.zeros_like(mask)
    prev[1:] = mask[:-1]
    start = mask & (~prev | cut)
    nxt = torch.zeros_like(mask)
    nxt[:-1] = mask[1:]
    nxt_cut = torch.zeros_like(cut)
    nxt_cut[:-1] = cut[1:]
    end = mask & (~nxt | nxt_cut)
    return torch.nonzero(start).view(-1), torch.nonzero(end).view(-1) + 1


def _sorted_valid_rows(indices, first, seqlen, causal):
    """The rows sorted ascending per (query, head) as int64 (-1 first), or None when some entry is out of
    range, after its query (causal) or repeated in its row."""
    x = indices.to(torch.int64)
    n = x.shape[0]
    q = torch.arange(first, first + n, device=x.device, dtype=torch.int64).view(n, 1, 1)
    hi = q + 1 if causal else torch.full_like(q, seqlen)
    hi = torch.clamp(hi, max=seqlen)
    bad = (x != -1) & ((x < 0) | (x >= hi))
    xs = torch.sort(x, dim=2).values
    dup = (xs[..., 1:] == xs[..., :-1]) & (xs[..., 1:] != -1)
    if bool(bad.any()) or bool(dup.any()):
        return None
    return xs


def summarize_topk(indices, session, causal=True):
    """This rank's TopkRowRuns (its TopkSummary, and per run of each cell's rows the widest row and the
    pairs) of its own top-k rows `indices` [S/P, H_kv, k] (int32 / int64, -1 padded, global keys), counted
    with torch ops on the indices' device: the same arrays as Session.summarize_topk_runs on the host. A
    row that is not valid is reported with the host's exact error (its check runs on a CPU copy then).
    Returns (runs, sorted rows): the rows sorted ascending per (query, head), which write_index_rows reads."""
    o = session.options
    S, P, bpr, rank = int(o["seqlen"]), int(o["cp_size"]), int(o["blocks_per_rank"]), o["rank"]
    if rank is None:
        raise ValueError("session: per-rank top-k summaries need the Session's rank (Session(..., rank=r))")
    lo, hi = (int(x) for x in _cpsched.sharding_ranges(S, P)[rank])
    n, H = int(indices.shape[0]), int(indices.shape[1])
    if n != hi - lo:
        raise ValueError(f"indices: this rank (rank {rank}) hosts {hi - lo} of S = {S} tokens in the sequential "
                         f"layout, the indices have {n} rows")
    xs = _sorted_valid_rows(indices, lo, S, causal)
    if xs is None:  # the host's check names the first bad entry exactly as everywhere else
        session.summarize_topk(indices.detach().cpu().contiguous().numpy(), causal=causal)
        raise ValueError("indices: the rows are not a valid top-k selection")  # (the host's check raised above)
    dev = xs.device
    blocks = blocks_of(S, P, bpr)
    nb = len(blocks)
    starts = torch.tensor([b for b, _ in blocks], dtype=torch.int64, device=dev)
    own = blocks[rank * bpr:(rank + 1) * bpr]  # this rank's query blocks
    qb_of_row = torch.repeat_interleave(torch.arange(bpr, device=dev),
                                        torch.tensor([e - b for b, e in own], device=dev))  # [n]
    valid = xs >= 0
    kb = torch.searchsorted(starts, xs, right=True) - 1  # [n, H, k]; garbage where not valid
    rows_i = torch.arange(n, device=dev).view(n, 1, 1).expand_as(xs)
    heads_i = torch.arange(H, device=dev).view(1, H, 1).expand_as(xs)
    # keys per (head, key block, row): C[h, kb, i]
    flat = ((heads_i * nb + kb) * n + rows_i)[valid]
    C = torch.bincount(flat, minlength=H * nb * n).view(H, nb, n)
    # runs of rows with keys in a (head, key block), cut at query block starts
    nz = (C > 0).reshape(-1)
    row_cut = torch.zeros(n, dtype=torch.bool, device=dev)
    row_cut[torch.tensor([b - lo for b, _ in own], device=dev)] = True
    cut = row_cut.repeat(H * nb)
    rs, re = _runs(nz, cut)
    seg = torch.zeros(nz.numel(), dtype=torch.int64, device=dev)
    seg[rs] = 1
    seg = torch.cumsum(seg, 0) - 1  # run index of each position inside a run
    Cf = C.reshape(-1)
    pos = torch.nonzero(nz).view(-1)
    nr = rs.numel()
    width = torch.zeros(nr, dtype=torch.int64, device=dev).scatter_reduce(0, seg[pos], Cf[pos], "amax")
    area = torch.zeros(nr, dtype=torch.int64, device=dev).scatter_add(0, seg[pos], Cf[pos])
    r_head = rs // (nb * n)
    r_kb = (rs // n) % nb
    r_row = rs % n
    r_end = r_row + (re - rs)
    r_qb = qb_of_row[r_row]
    # runs in the summary's order: (head, query block, key block, first row)
    key = ((r_head * bpr + r_qb) * nb + r_kb) * n + r_row
    order = torch.argsort(key)
    r_head, r_qb, r_kb, r_row, r_end = r_head[order], r_qb[order], r_kb[order], r_row[order], r_end[order]
    width, area = width[order], area[order]
    cell_key = (r_head * bpr + r_qb) * nb + r_kb
    cells_k, runs_per_cell = torch.unique_consecutive(cell_key, return_counts=True)
    cell_area = torch.zeros(cells_k.numel(), dtype=torch.int64, device=dev).scatter_add(
        0, torch.repeat_interleave(torch.arange(cells_k.numel(), device=dev), runs_per_cell), area)
    # distinct keys per (head, query block): a bitmap over the keys, runs cut at key block starts
    bq = qb_of_row.view(n, 1, 1).expand_as(xs)
    bits = torch.zeros(H * bpr * S, dtype=torch.bool, device=dev)
    bits[((heads_i * bpr + bq) * S + xs)[valid]] = True
    key_cut = torch.zeros(S, dtype=torch.bool, device=dev)
    key_cut[starts] = True
    cs, ce = _runs(bits, key_cut.repeat(H * bpr))
    c_hq = cs // S
    c_t = cs % S
    c_e = c_t + (ce - cs)
    c_kb = torch.searchsorted(starts, c_t, right=True) - 1
    col_cell = c_hq * nb + c_kb  # same key as cell_key: (head x bpr + qb) x nb + kb
    # everything the host needs, in one copy each
    cells_k, runs_per_cell, cell_area = cells_k.cpu().numpy(), runs_per_cell.cpu().numpy(), cell_area.cpu().numpy()
    col_cell = col_cell.cpu().numpy()
    col_ranges = np.stack([c_t.cpu().numpy(), c_e.cpu().numpy()], 1).astype(np.int64)
    row_ranges = np.stack([r_row.cpu().numpy() + lo, r_end.cpu().numpy() + lo], 1).astype(np.int64)
    h = cells_k // (bpr * nb)
    qb = (cells_k // nb) % bpr + rank * bpr
    kbk = cells_k % nb
    cells = np.stack([h, qb, kbk, cell_area], 1).astype(np.int64)
    row_off = np.concatenate([[0], np.cumsum(runs_per_cell)]).astype(np.int64)
    col_counts = np.searchsorted(col_cell, cells_k, side="right") - np.searchsorted(col_cell, cells_k, side="left")
    if int(col_counts.sum()) != len(col_cell):
        raise AssertionError("summarize_topk: a key run lies in no cell")
    col_off = np.concatenate([[0], np.cumsum(col_counts)]).astype(np.int64)
    summary = TopkSummary(rank, (cells, row_off, row_ranges, col_off, col_ranges), seqlen=S)
    return TopkRowRuns(summary, width.cpu().numpy(), area.cpu().numpy(), H, causal), xs


def write_index_rows(tp, xs):
    """The (forward, backward) index pools of a TorchPlan made from row runs (its `deferred_entries`), on
    the rows' device, from the rank's rows sorted per (query, head) (`summarize_topk`): per index arg and
    query row, the row's keys inside the arg's key block in ascending order as k-buffer rows, -1 padded to
    the arg's width, exactly what the C++ builder writes from the rows (write_deferred_index_rows)."""
    dev = xs.device
    S, H = tp.seqlen, int(xs.shape[1])
    lo, _ = tp.layout.host_ranges[tp.rank][0]
    blocks = blocks_of(S, tp.cp_size, tp.blocks_per_rank)
    starts = torch.tensor([b for b, _ in blocks], dtype=torch.int64, device=dev)
    ends = torch.tensor([e for _, e in blocks], dtype=torch.int64, device=dev)
    pools = []
    done = {}
    for pp in (tp.fwd, tp.bwd):
        if not pp.deferred_entries:
            pools.append(None)
            continue
        args = [a for lst in [pp.stage0] + pp.stages for a in lst if a.index_width > 0]
        sig = tuple((a.q0, a.q1, a.k0, a.k1, a.group, a.q_remote, a.k_remote, a.index_offset, a.index_width)
                    for a in args)
        if sig in done and done[sig][0] == pp.deferred_entries:
            pools.append(done[sig][1])  # the backward description is the forward's
            continue
        rem = pp.remote_rows.get("kv")
        if any(a.k_remote for a in args) and rem is None:
            raise ValueError("plan: its index args read remote keys but it lists no remote_kv_rows")
        inv = {}  # group -> global key -> remote KV row

        def inverse(group):
            t = inv.get(group)
            if t is None:
                kg, kh = (x.to(dev) for x in rem)
                t = torch.full((S,), -1, dtype=torch.int64, device=dev)
                sel = torch.nonzero((kh == group) | (kh < 0)).view(-1)
                t[kg[sel]] = sel
                inv[group] = t
            return t

        pool = torch.full((pp.deferred_entries,), -1, dtype=torch.int64, device=dev)
        bad = torch.zeros((), dtype=torch.bool, device=dev)  # checked once at the end: one sync per pass
        for a in args:
            if a.q_remote:
                raise ValueError("plan: an index arg of another rank's queries; a plan from row runs computes the "
                                 "rank's own queries only")
            g = max(a.group, 0)
            head = g if H > 1 else 0
            k0 = (rem[0][a.k0] if a.k_remote else torch.tensor(a.k0 + lo)).to(dev)
            b = torch.searchsorted(starts, k0.view(1), right=True) - 1
            klo, khi = starts[b], ends[b]
            sel = xs[a.q0:a.q1, head]  # [n, k], ascending, -1 first
            c_lo = (sel < klo).sum(1)
            c_hi = (sel < khi).sum(1)
            w = a.index_width
            j = torch.arange(w, device=dev).view(1, w)
            at = c_lo.view(-1, 1) + j
            ok = at < c_hi.view(-1, 1)
            keys = torch.gather(sel, 1, at.clamp(max=sel.shape[1] - 1))
            if a.k_remote:
                rows = inverse(g)[keys.clamp(0, S - 1)]
            else:
                rows = keys - lo
            rows = torch.where(ok, rows, torch.full_like(rows, -1))
            bad |= ((c_hi - c_lo) > w).any() | (ok & (rows < 0)).any()
            pool[a.index_offset:a.index_offset + (a.q1 - a.q0) * w] = rows.reshape(-1)
        if bool(bad):
            raise ValueError(f"indices: rank {tp.rank}'s rows select keys that its plan has no room or no buffer row "
                             f"for (rows other than those it was made from?)")
        done[sig] = (pp.deferred_entries, pool)
        pools.append(pool)
    return pools
