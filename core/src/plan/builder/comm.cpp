// The group-collective args (CommMeta) of every rank and stage.
#include <algorithm>
#include <numeric>
#include <bit>
#include <cstdlib>
#include <span>
#include <tuple>

#include "cpsched/hardware/node_map.hpp"
#include "plan/builder/internal.hpp"

namespace cpsched::plan_detail {

namespace {

// A forwarding the relay sends once its first phase has arrived. Its dsts
// and their xfers sit in the Emitter's pools (no allocation per forward).
struct Forward {
  RowKind kind;
  int stage;
  Rank relay;
  int group;
  Range global;          // the piece's global tokens
  std::size_t relay_pos; // the relay's index in the first phase's destinations
  Token relay_off;       // where the piece sits in the relay's stage receive buffer
  std::size_t first;     // its dsts: fwd_dsts[first, first + count), xfers likewise in fwd_xs
  std::size_t count;
};

struct Emitter {
  const Sharding& sh;
  const std::vector<Token>& block_off;
  std::vector<PassPlan*>& pass;
  const RelayOptions& relay;
  std::vector<std::pair<std::int32_t, XferRun>>& runs;  // (xfer, run), offsets stage-relative
  std::vector<Forward>& forwards;
  std::vector<Rank>& fwd_dsts;
  std::vector<std::int32_t>& fwd_xs;
  std::vector<Bytes> nic_in;  // per rank: bytes received from other nodes so far (relay choice)
  std::vector<Rank> direct;
  std::vector<std::int32_t> direct_x;
  std::vector<Token> direct_off;
  // Summary (pricing): the tokens go to the sheet's sink, one split per
  // (phase, kind, stage, src, dst); where the sink asks for the layout the
  // runs are kept with offsets counted here (summary_fill, per (dst, stage,
  // kind)) as receive() would place them, so that the sheet cuts args where
  // a plan's buffers would.
  SheetSink* summary = nullptr;
  std::vector<Token> summary_fill;
  int stages = 0;
  Token summary_receive(RowKind kind, int stage, Rank dst, Token size) {
    Token& fill = summary_fill[(static_cast<std::size_t>(dst) * static_cast<std::size_t>(stages) +
                                static_cast<std::size_t>(stage - 1)) * 2 + static_cast<std::size_t>(index_of(kind))];
    const Token o = fill;
    fill += size;
    return o;
  }
  // >= 0: only this rank's comm is written (PlanOptions::rank); the order of
  // everything is the full plan's, so its part is the same.
  Rank only = -1;
  bool mine(Rank r) const { return only < 0 || r == only; }

  StageComm& stage_of(Rank r, int stage) {
    return pass[static_cast<std::size_t>(r)]->comm.stages[static_cast<std::size_t>(stage - 1)];
  }

  // Appends an output split of `size` rows from src to dst's stage (first
  // phase or forwarding) and returns its stage-relative offset.
  Token receive(RowKind kind, int stage, Rank dst, Rank src, int group, Token size, bool fwd) {
    StageComm& rc = stage_of(dst, stage);
    GroupCollectiveArg& out = fwd ? (kind == RowKind::qo ? rc.qo_fwd : rc.kv_fwd) : (kind == RowKind::qo ? rc.qo : rc.kv);
    Token& fill = kind == RowKind::qo ? rc.num_remote_qo_tokens : rc.num_remote_kv_tokens;
    const Token o = fill;
    out.output_split_sizes.push_back(size);
    out.src_index.push_back(src);
    out.output_groups.push_back(group);
    fill += size;
    return o;
  }

  // One split of `block` (global range r) from host to every dst of `dsts`
  // (ascending; xs[i] is the xfer of dsts[i]).
  void emit(RowKind kind, int stage, Rank host, std::int32_t block, int group, Range r,
            const std::vector<Rank>& dsts, const std::vector<std::int32_t>& xs) {
    const std::vector<Rank>* to = &dsts;
    const std::vector<std::int32_t>* to_x = &xs;
    const std::size_t first_forward = forwards.size();
    if (relay.node_size >= 2) {
      pick_relays(kind, stage, host, group, r, dsts, xs);
      to = &direct;
      to_x = &direct_x;
    }
    if (summary) {
      for (std::size_t i = 0; i < to->size(); ++i) {
        summary->add(0, kind, stage, host, (*to)[i], r.size());
        if (summary->keeps_layout())
          runs.push_back({(*to_x)[i], XferRun{r, summary_receive(kind, stage, (*to)[i], r.size())}});
      }
      return;
    }
    if (mine(host)) {
      StageComm& sc = stage_of(host, stage);
      GroupCollectiveArg& in = kind == RowKind::qo ? sc.qo : sc.kv;
      const Range blk = sh.blocks[static_cast<std::size_t>(block)];
      const Token lb = block_off[static_cast<std::size_t>(block)] + (r.begin - blk.begin);
      in.input_split_sizes.push_back(r.size());
      in.input_ranges.push_back({lb, lb + r.size()});
      in.input_groups.push_back(group);
      in.dst_indices.push_back(*to);
    }
    direct_off.clear();
    for (std::size_t i = 0; i < to->size(); ++i) {
      Token o = 0;  // (another rank's offset, unknown and unused when only one rank is built)
      if (mine((*to)[i])) {
        o = receive(kind, stage, (*to)[i], host, group, r.size(), false);
        runs.push_back({(*to_x)[i], XferRun{r, o}});
      }
      direct_off.push_back(o);
    }
    for (std::size_t f = first_forward; f < forwards.size(); ++f)
      forwards[f].relay_off = direct_off[forwards[f].relay_pos];
  }

  // Cuts dsts into the direct receivers (`direct`) and one forwarding per
  // node of >= 2 receivers other than the host's.
  void pick_relays(RowKind kind, int stage, Rank host, int group, Range r, const std::vector<Rank>& dsts,
                   const std::vector<std::int32_t>& xs) {
    const NodeMap nodes{relay.node_size};
    const Bytes bytes = r.size() * (kind == RowKind::qo ? relay.qo_bytes : relay.kv_bytes);
    direct.clear();
    direct_x.clear();
    for (std::size_t i0 = 0; i0 < dsts.size();) {
      const int node = nodes.node_of(dsts[i0]);
      std::size_t i1 = i0 + 1;
      while (i1 < dsts.size() && nodes.node_of(dsts[i1]) == node) ++i1;
      if (node == nodes.node_of(host)) {
        for (std::size_t i = i0; i < i1; ++i) direct.push_back(dsts[i]), direct_x.push_back(xs[i]);
      } else if (i1 - i0 == 1) {
        direct.push_back(dsts[i0]), direct_x.push_back(xs[i0]);
        nic_in[static_cast<std::size_t>(dsts[i0])] += bytes;
      } else {
        std::size_t t = i0;  // fewest NIC bytes so far, ties by rank (dsts ascend)
        for (std::size_t i = i0 + 1; i < i1; ++i)
          if (nic_in[static_cast<std::size_t>(dsts[i])] < nic_in[static_cast<std::size_t>(dsts[t])]) t = i;
        nic_in[static_cast<std::size_t>(dsts[t])] += bytes;
        Forward f{kind, stage, dsts[t], group, r, direct.size(), 0, fwd_dsts.size(), i1 - i0 - 1};
        direct.push_back(dsts[t]), direct_x.push_back(xs[t]);
        for (std::size_t i = i0; i < i1; ++i)
          if (i != t) fwd_dsts.push_back(dsts[i]), fwd_xs.push_back(xs[i]);
        forwards.push_back(f);
      }
      i0 = i1;
    }
  }

  // The forwarding phase: after every first-phase split, so forwarded rows
  // follow the first phase in each receive buffer; by (stage, kind, relay),
  // emission order inside, so receivers get them ordered by source.
  void emit_forwards() {
    std::stable_sort(forwards.begin(), forwards.end(), [](const Forward& x, const Forward& y) {
      return std::tie(x.stage, x.kind, x.relay) < std::tie(y.stage, y.kind, y.relay);
    });
    for (const Forward& f : forwards) {
      const auto dsts = std::span<const Rank>(fwd_dsts).subspan(f.first, f.count);
      if (summary) {
        for (std::size_t i = 0; i < f.count; ++i) {
          summary->add(1, f.kind, f.stage, f.relay, dsts[i], f.global.size());
          if (summary->keeps_layout())
            runs.push_back({fwd_xs[f.first + i], XferRun{f.global, summary_receive(f.kind, f.stage, dsts[i], f.global.size())}});
        }
        continue;
      }
      if (mine(f.relay)) {
        StageComm& sc = stage_of(f.relay, f.stage);
        GroupCollectiveArg& in = f.kind == RowKind::qo ? sc.qo_fwd : sc.kv_fwd;
        in.input_split_sizes.push_back(f.global.size());
        in.input_ranges.push_back({f.relay_off, f.relay_off + f.global.size()});
        in.input_groups.push_back(f.group);
        in.dst_indices.emplace_back(dsts.begin(), dsts.end());
      }
      for (std::size_t i = 0; i < f.count; ++i) {
        if (!mine(dsts[i])) continue;
        const Token o = receive(f.kind, f.stage, dsts[i], f.relay, f.group, f.global.size(), true);
        runs.push_back({fwd_xs[f.first + i], XferRun{f.global, o}});
      }
    }
  }
};

// Cuts the rows several dsts need from one (block, group) into maximal pieces
// with the same set of dsts, in token order. A sweep over the ranges' ends
// keeps the dsts whose ranges cover the current piece (a bitmap over the run,
// listed per piece): O(E log E + output + pieces x run / 64) for E ranges
// (scanning every dst for every piece was O(pieces x dsts), which one-token
// column stripes sent to every rank make quadratic). Its buffers are reused
// from run to run.
class Refiner {
 public:
  template <class Emit>
  void operator()(const std::vector<const Xfer*>& run, const std::vector<std::int32_t>& run_ids, Emit&& emit) {
    ev_.clear();
    for (std::size_t i = 0; i < run.size(); ++i)
      for (Range r : run[i]->rows.ranges()) {
        ev_.push_back({r.begin, static_cast<std::int32_t>(i) + 1});
        ev_.push_back({r.end, -(static_cast<std::int32_t>(i) + 1)});
      }
    std::sort(ev_.begin(), ev_.end(), [](const Event& a, const Event& b) { return a.pos < b.pos; });
    active_.assign((run.size() + 63) / 64, 0);  // run indices: ascending dst
    cur_d_.clear();
    cur_x_.clear();
    Range cur{};
    for (std::size_t e = 0; e < ev_.size();) {
      const Token pos = ev_[e].pos;
      for (; e < ev_.size() && ev_[e].pos == pos; ++e) {
        const auto i = static_cast<std::size_t>(std::abs(ev_[e].who) - 1);
        if (ev_[e].who > 0) active_[i / 64] |= std::uint64_t{1} << (i % 64);
        else active_[i / 64] &= ~(std::uint64_t{1} << (i % 64));
      }
      if (e == ev_.size()) break;
      const Range piece{pos, ev_[e].pos};
      d_.clear();
      xs_.clear();
      for (std::size_t w = 0; w < active_.size(); ++w)
        for (std::uint64_t bits = active_[w]; bits != 0; bits &= bits - 1) {
          const std::size_t i = w * 64 + static_cast<std::size_t>(std::countr_zero(bits));
          d_.push_back(run[i]->dst);
          xs_.push_back(run_ids[i]);
        }
      if (!cur.empty() && cur.end == piece.begin && d_ == cur_d_) {
        cur.end = piece.end;
        continue;
      }
      if (!cur.empty()) emit(cur, cur_d_, cur_x_);
      cur = d_.empty() ? Range{} : piece;
      cur_d_.swap(d_);
      cur_x_.swap(xs_);
    }
    if (!cur.empty()) emit(cur, cur_d_, cur_x_);
  }

 private:
  struct Event {
    Token pos;
    std::int32_t who;  // run index + 1 at a range's begin, -(run index + 1) at its end
  };
  std::vector<Event> ev_;
  std::vector<std::uint64_t> active_;
  std::vector<Rank> cur_d_, d_;
  std::vector<std::int32_t> cur_x_, xs_;
};

// Xfer ids sorted by (kind, stage, host, block, group, dst). Xfers are stored
// by dst, so a stable counting sort over the other fields gives the order in
// O(xfers + buckets); a comparison sort takes over when the buckets would be
// too many.
std::vector<std::int32_t> emit_order(const Transfers& tr, const std::vector<int>& stage, int stages,
                                     const Sharding& sh, int groups) {
  const std::size_t n = tr.xfers.size(), nb = sh.blocks.size(), G = static_cast<std::size_t>(groups);
  // Blocks ranked by (host, block).
  std::vector<std::size_t> block_rank(nb);
  {
    std::vector<std::size_t> order(nb);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return sh.host[x] < sh.host[y]; });
    for (std::size_t i = 0; i < nb; ++i) block_rank[order[i]] = i;
  }
  const std::size_t buckets = 2 * static_cast<std::size_t>(stages) * nb * G;
  std::vector<std::int32_t> ids(n);
  if (buckets <= std::max<std::size_t>(std::size_t{1} << 16, 8 * n)) {
    auto bucket = [&](std::size_t i) {
      const Xfer& x = tr.xfers[i];
      return ((static_cast<std::size_t>(index_of(x.kind)) * static_cast<std::size_t>(stages) + static_cast<std::size_t>(stage[i] - 1)) * nb +
              block_rank[static_cast<std::size_t>(x.block)]) * G + static_cast<std::size_t>(x.group);
    };
    std::vector<std::int32_t> start(buckets + 1, 0);
    for (std::size_t i = 0; i < n; ++i) ++start[bucket(i) + 1];
    std::partial_sum(start.begin(), start.end(), start.begin());
    for (std::size_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(start[bucket(i)]++)] = static_cast<std::int32_t>(i);
    return ids;
  }
  std::iota(ids.begin(), ids.end(), 0);
  auto key = [&](std::int32_t i) {
    const Xfer& x = tr.xfers[static_cast<std::size_t>(i)];
    return std::tuple{x.kind, stage[static_cast<std::size_t>(i)], x.host, x.block, x.group, x.dst};
  };
  std::sort(ids.begin(), ids.end(), [&](std::int32_t l, std::int32_t r) { return key(l) < key(r); });
  return ids;
}

// Stage receive buffers are concatenated in stage order.
void set_recv_offsets(std::vector<PassPlan*>& pass, Rank only = -1) {
  for (std::size_t r = 0; r < pass.size(); ++r) {
    if (only >= 0 && static_cast<Rank>(r) != only) continue;
    PassPlan* p = pass[r];
    Token qo = 0, kv = 0;
    for (StageComm& sc : p->comm.stages) {
      sc.qo_recv_offset = qo;
      sc.kv_recv_offset = kv;
      qo += sc.num_remote_qo_tokens;
      kv += sc.num_remote_kv_tokens;
    }
  }
}

// Emits every run of transfers that share (kind, stage, host, block, group)
// in `ids` order: one piece per range when one destination or all need the
// same rows, else the refiner's pieces.
void emit_runs(Emitter& em, const Transfers& tr, const std::vector<std::int32_t>& ids, const std::vector<int>& stage,
               bool flat, const RelayOptions& relay, Rank only) {
  std::vector<const Xfer*> run;
  std::vector<std::int32_t> run_ids;
  std::vector<Rank> one_d(1), all_d;
  Refiner refine;
  std::vector<std::int32_t> one_x(1);
  for (std::size_t i0 = 0; i0 < ids.size();) {
    const Xfer& x0 = tr.xfers[static_cast<std::size_t>(ids[i0])];
    const int st = stage[static_cast<std::size_t>(ids[i0])];
    std::size_t i1 = i0 + 1;
    while (i1 < ids.size()) {
      const Xfer& x = tr.xfers[static_cast<std::size_t>(ids[i1])];
      if (x.kind != x0.kind || stage[static_cast<std::size_t>(ids[i1])] != st || x.host != x0.host ||
          x.block != x0.block || x.group != x0.group)
        break;
      ++i1;
    }
    // One rank built without relays: a run that neither comes from it nor
    // reaches it changes nothing of its part (with relays every run counts:
    // the NIC load so far picks the relays).
    if (only >= 0 && relay.node_size < 2 && x0.host != only) {
      bool reaches = false;
      for (std::size_t i = i0; i < i1 && !reaches; ++i) reaches = tr.xfers[static_cast<std::size_t>(ids[i])].dst == only;
      if (!reaches) {
        i0 = i1;
        continue;
      }
    }
    const int grp = flat ? x0.group : -1;
    // Every dst needs the same rows (whole blocks, full masks): each range is
    // one piece for all of them, as refine would cut it, without its sweep.
    bool same_rows = true;
    for (std::size_t i = i0 + 1; i < i1 && same_rows; ++i)
      same_rows = tr.xfers[static_cast<std::size_t>(ids[i])].rows == x0.rows;
    if (i1 == i0 + 1) {
      one_d[0] = x0.dst;
      one_x[0] = ids[i0];
      for (Range r : x0.rows.ranges()) em.emit(x0.kind, st, x0.host, x0.block, grp, r, one_d, one_x);
    } else if (same_rows) {
      run_ids.clear();
      all_d.clear();
      for (std::size_t i = i0; i < i1; ++i) {
        run_ids.push_back(ids[i]);
        all_d.push_back(tr.xfers[static_cast<std::size_t>(ids[i])].dst);
      }
      for (Range r : x0.rows.ranges()) em.emit(x0.kind, st, x0.host, x0.block, grp, r, all_d, run_ids);
    } else {
      run.clear();
      run_ids.clear();
      for (std::size_t i = i0; i < i1; ++i) {
        run.push_back(&tr.xfers[static_cast<std::size_t>(ids[i])]);
        run_ids.push_back(ids[i]);
      }
      refine(run, run_ids, [&](Range r, const std::vector<Rank>& d, const std::vector<std::int32_t>& xs) {
        em.emit(x0.kind, st, x0.host, x0.block, grp, r, d, xs);
      });
    }
    i0 = i1;
  }
}

// Runs grouped by xfer (counting sort), in token order, adjacent ones merged;
// offsets in the receiver's stage buffer.
XferLayout group_runs_by_xfer(const std::vector<std::pair<std::int32_t, XferRun>>& runs, const Transfers& tr,
                              const std::vector<int>& stage, const std::vector<PassPlan*>& pass) {
  XferLayout out;
  out.begin.assign(tr.xfers.size() + 1, 0);
  for (const auto& [x, r] : runs) ++out.begin[static_cast<std::size_t>(x) + 1];
  std::partial_sum(out.begin.begin(), out.begin.end(), out.begin.begin());
  out.runs.resize(runs.size());
  {
    std::vector<std::size_t> fill(out.begin.begin(), out.begin.end() - 1);
    for (const auto& [x, r] : runs) {
      const Xfer& xf = tr.xfers[static_cast<std::size_t>(x)];
      // (No pass plans: a summary's offsets, relative to the stage's buffer.)
      Token base = 0;
      if (!pass.empty()) {
        const StageComm& sc = pass[static_cast<std::size_t>(xf.dst)]
                                  ->comm.stages[static_cast<std::size_t>(stage[static_cast<std::size_t>(x)] - 1)];
        base = xf.kind == RowKind::qo ? sc.qo_recv_offset : sc.kv_recv_offset;
      }
      out.runs[fill[static_cast<std::size_t>(x)]++] = XferRun{r.global, r.off + base};
    }
  }
  std::size_t w = 0;
  for (std::size_t x = 0; x < tr.xfers.size(); ++x) {
    const auto b = out.runs.begin() + static_cast<std::ptrdiff_t>(out.begin[x]);
    const auto e = out.runs.begin() + static_cast<std::ptrdiff_t>(out.begin[x + 1]);
    auto by_token = [](const XferRun& l, const XferRun& r) { return l.global.begin < r.global.begin; };
    if (!std::is_sorted(b, e, by_token)) std::sort(b, e, by_token);
    const std::size_t w0 = w;
    for (auto it = b; it != e; ++it) {
      if (w > w0) {
        XferRun& last = out.runs[w - 1];
        if (last.global.end == it->global.begin && last.off + last.global.size() == it->off) {
          last.global.end = it->global.end;
          continue;
        }
      }
      out.runs[w++] = *it;
    }
    out.begin[x] = w0;
  }
  out.begin[tr.xfers.size()] = w;
  out.runs.resize(w);
  return out;
}

}  // namespace

XferLayout layout_comm(const Assignment& a, const Transfers& tr, const std::vector<int>& stage, int stages,
                       const RelayOptions& relay, std::vector<PassPlan*>& pass, SheetSink* summary, Rank only) {
  const Sharding& sh = a.grid->sharding();
  const bool flat = a.grid->flattened();
  if (!summary)
    for (std::size_t r = 0; r < pass.size(); ++r)
      if (only < 0 || static_cast<Rank>(r) == only) pass[r]->comm.stages.assign(static_cast<std::size_t>(stages), StageComm{});
  const std::vector<Token> block_off = block_local_offsets(sh);
  std::vector<std::pair<std::int32_t, XferRun>> runs;
  std::vector<Forward> forwards;
  std::vector<Rank> fwd_dsts;
  std::vector<std::int32_t> fwd_xs;
  if (!summary) runs.reserve(tr.xfers.size());
  const auto P = static_cast<std::size_t>(a.grid->cp_size());
  Emitter em{sh, block_off, pass, relay, runs, forwards, fwd_dsts, fwd_xs, std::vector<Bytes>(P, 0), {}, {}, {},
             summary, {}, stages, only};
  if (summary && summary->keeps_layout()) em.summary_fill.assign(P * static_cast<std::size_t>(stages) * 2, 0);

  // Senders emit in (kind, stage, host, block, group) order and receivers
  // append as they go, so every receiver's splits come ordered by source.
  emit_runs(em, tr, emit_order(tr, stage, stages, sh, a.grid->num_groups()), stage, flat, relay, only);

  em.emit_forwards();

  if (summary) return summary->keeps_layout() ? group_runs_by_xfer(runs, tr, stage, pass) : XferLayout{};
  set_recv_offsets(pass, only);
  return group_runs_by_xfer(runs, tr, stage, pass);
}

void summary_comm(const Transfers& tr, const std::vector<int>& stage, SheetSink& sink) {
  for (std::size_t i = 0; i < tr.xfers.size(); ++i) {
    const Xfer& x = tr.xfers[i];
    if (x.tokens > 0) sink.add(0, x.kind, stage[i], x.host, x.dst, x.tokens);
  }
}

}  // namespace cpsched::plan_detail
