// Plan validator: attention args inside their buffers, mapped back to global
// coordinates, and exactly-once coverage of the mask by exact area accounting.
#include <algorithm>
#include <limits>
#include <tuple>

#include "cpsched/base/memory_budget.hpp"

#include "plan/validator/internal.hpp"

namespace cpsched::validate_detail {

namespace {

// A piece of an arg inside one grid cell, global coordinates.
struct Item {
  std::int32_t qb, kb;
  int gi;       // group index 0..G-1
  Rank rank;
  int stage;
  std::size_t arg;
  Band band;
};

std::string origin(const Item& x) { return fmt::format("rank {} stage {} arg {}", x.rank, x.stage, x.arg); }

// Cuts a global band along the sharding's blocks.
template <class F>
void per_cell(const Band& b, const Sharding& sh, F&& f) {
  for (int qb = sh.block_of(b.q.begin); qb >= 0 && qb < sh.num_blocks() && sh.blocks[qb].begin < b.q.end; ++qb)
    for (int kb = sh.block_of(b.k.begin); kb >= 0 && kb < sh.num_blocks() && sh.blocks[kb].begin < b.k.end; ++kb) {
      const Band c = clip(b, sh.blocks[qb], sh.blocks[kb]);
      if (band_area(c) > 0) f(qb, kb, c);
    }
}

void check_cells(const Assignment& a, const char* pass, std::vector<Item>& items, Problems& pr, Rank only) {
  const TaskGrid& grid = *a.grid;
  const auto G = grid.num_groups();
  const auto& cells = grid.cells();
  std::sort(items.begin(), items.end(), [](const Item& x, const Item& y) {
    return std::tuple{x.qb, x.kb, x.gi, x.band.q.begin, x.band.k.begin} <
           std::tuple{y.qb, y.kb, y.gi, y.band.q.begin, y.band.k.begin};
  });
  std::vector<bool> seen(static_cast<std::size_t>(grid.num_tasks()), false);
  for (std::size_t i0 = 0; i0 < items.size();) {
    std::size_t i1 = i0;
    while (i1 < items.size() && items[i1].qb == items[i0].qb && items[i1].kb == items[i0].kb &&
           items[i1].gi == items[i0].gi)
      ++i1;
    const Item& f = items[i0];
    auto it = std::lower_bound(cells.begin(), cells.end(), std::pair{f.qb, f.kb}, [](const Cell& c, auto key) {
      return std::pair{c.qblock, c.kblock} < key;
    });
    Token sum = 0;
    for (std::size_t i = i0; i < i1; ++i) sum += band_area(items[i].band);
    if (it == cells.end() || it->qblock != f.qb || it->kblock != f.kb) {
      pr.add("{}: cell (q block {}, kv block {}) group {} has no unmasked entry but {} computes {} entries there",
             pass, f.qb, f.kb, f.gi, origin(f), sum);
      i0 = i1;
      continue;
    }
    const auto task = static_cast<TaskId>((it - cells.begin()) * G + f.gi);
    const Cell& tc = grid.cell_of(task);  // the task's own cell (groups may see different masks)
    seen[static_cast<std::size_t>(task)] = true;
    const Rank want = a.rank[static_cast<std::size_t>(task)];
    // Inside the mask: the pieces' entries that the cell's slices hold.
    Token inside = 0;
    for (std::size_t i = i0; i < i1; ++i) {
      Token in = 0;
      const Band& b = items[i].band;
      for (const Slice& s : tc.pieces)
        if (s.q.begin < b.q.end && b.q.begin < s.q.end && s.k.begin < b.k.end && b.k.begin < s.k.end)
          in += band_area(intersect(b, band_of(s)));
      inside += in;
      if (in != band_area(items[i].band))
        pr.add("{}: {} computes {} masked entries in rows [{}, {}) x cols [{}, {})", pass, origin(items[i]),
               band_area(items[i].band) - in, items[i].band.q.begin, items[i].band.q.end, items[i].band.k.begin,
               items[i].band.k.end);
      if (items[i].rank != want)
        pr.add("{}: task {} (q block {}, kv block {}, group {}) is placed on rank {} but {} computes part of it",
               pass, task, f.qb, f.kb, f.gi, want, origin(items[i]));
    }
    // No entry twice: pairwise overlap of pieces whose row ranges meet.
    for (std::size_t i = i0; i < i1; ++i)
      for (std::size_t j = i + 1; j < i1 && items[j].band.q.begin < items[i].band.q.end; ++j) {
        const Token o = band_area(intersect(items[i].band, items[j].band));
        if (o > 0)
          pr.add("{}: {} entries of task {} are computed twice, by {} and by {}", pass, o, task, origin(items[i]),
                 origin(items[j]));
      }
    if (sum != tc.area)
      pr.add("{}: task {} (q block {}, kv block {}, group {}) has {} unmasked entries but the args compute {} "
             "({} of them inside the mask)",
             pass, task, f.qb, f.kb, f.gi, tc.area, sum, inside);
    i0 = i1;
  }
  for (TaskId t = 0; t < grid.num_tasks(); ++t)
    if (!seen[static_cast<std::size_t>(t)] && grid.area(t) > 0 && (only < 0 || a.rank[static_cast<std::size_t>(t)] == only))
      pr.add("{}: task {} (q block {}, kv block {}, group {}, {} entries, on rank {}) is computed by no arg", pass,
             t, grid.cell_of(t).qblock, grid.cell_of(t).kblock, t % G, grid.area(t), a.rank[static_cast<std::size_t>(t)]);
}

// Index masks. The pairs an index plan computes are as many as the selected
// pairs (hundreds of millions at S = 128k, k = 2048), so they are checked in
// bounded memory: one pass over the args checks each arg on its own (pool
// bounds, index_area, entries inside the hull, head groups, loads) and keeps
// a small descriptor per arg; then, per head group, the query rows are cut
// into chunks of at most validator_chunk_bytes (resources.hpp) worth of
// selected pairs, and per chunk the pairs of the args' rows in it are
// collected, sorted and compared with the selection's rows.

// An index arg that passed its own checks.
struct IndexArgRef {
  const AttnArg* arg;
  const CalcMeta* calc;
  const RankMaps* maps;
  Rank rank;
  int stage;
  std::size_t index;
  int group;          // 0..G-1
  Token q_lo, q_hi;   // hull of its rows' global queries
};

// The checks of one index arg that need no other arg. Adds its computed
// pairs to the loads; returns false when its rows cannot be read (outside the pool).
template <class Where>
bool index_arg_alone(const AttnArg& x, const CalcMeta& calc, const RankMaps& m, Problems& pr, Where&& where,
                     std::int64_t heads, std::int64_t& load, Token& q_lo, Token& q_hi) {
  if (!x.is_index()) {
    pr.add("{}: a range arg in the plan of an index mask (token top-k masks are computed by index args)", where());
    return false;
  }
  const auto width = static_cast<std::size_t>(x.index_width);
  if (x.index_offset < 0 || static_cast<std::size_t>(x.index_offset) + static_cast<std::size_t>(x.q.size()) * width >
                                calc.indices.size()) {
    pr.add("{}: index rows [{}, {} + {} x {}) are outside the pool of {} indices", where(), x.index_offset,
           x.index_offset, x.q.size(), width, calc.indices.size());
    return false;
  }
  const BufferMap& qm = x.q_buf == BufferId::local ? m.local : m.remote[0];
  const BufferMap& km = x.k_buf == BufferId::local ? m.local : m.remote[1];
  const std::int32_t* pool = calc.indices.data() + x.index_offset;
  const auto valid = std::count_if(pool, pool + x.q.size() * x.index_width, [](std::int32_t e) { return e >= 0; });
  if (valid != x.index_area)
    pr.add("{}: index_area is {} but the arg's rows hold {} entries", where(), x.index_area, valid);
  q_lo = std::numeric_limits<Token>::max();
  q_hi = std::numeric_limits<Token>::min();
  qm.walk(x.q, [&](Range b, Token g, int grp) {
    q_lo = std::min(q_lo, g);
    q_hi = std::max(q_hi, g + b.size());
    if (grp != -1 && grp != x.group)
      pr.add("{}: reads remote rows of head group {} for head group {}", where(), grp, x.group);
  });
  // Entries read kv rows of another head group only if some segment of the hull holds one.
  bool foreign = false;
  km.walk(x.k, [&](Range, Token, int grp) { foreign = foreign || (grp != -1 && grp != x.group); });
  for (Token row = x.q.begin; row < x.q.end; ++row) {
    const std::int32_t* e = pool + (row - x.q.begin) * static_cast<Token>(width);
    for (std::size_t j = 0; j < width; ++j) {
      if (e[j] == -1) continue;
      if (!x.k.contains(e[j])) {
        pr.add("{}: index entry [{}, {}] = {} is outside the arg's k rows [{}, {})", where(), row - x.q.begin, j,
               e[j], x.k.begin, x.k.end);
        continue;
      }
      if (foreign)
        km.walk({e[j], e[j] + 1}, [&](Range, Token, int grp) {
          if (grp != -1 && grp != x.group)
            pr.add("{}: reads remote rows of head group {} for head group {}", where(), grp, x.group);
        });
      load += heads;
    }
  }
  return true;
}

// The global key of kv-buffer row `row` through `km`, remembering the last
// segment (an arg's keys mostly lie in one).
struct KeyMap {
  const BufferMap& km;
  std::size_t seg = 0;
  Token global(Token row) {
    const auto& segs = km.segs;
    if (seg < segs.size() && segs[seg].buf <= row && row < segs[seg].buf + segs[seg].global.size())
      return segs[seg].global.begin + (row - segs[seg].buf);
    auto it = std::upper_bound(segs.begin(), segs.end(), row, [](Token v, const Segment& x) { return v < x.buf; });
    if (it == segs.begin()) return -1;
    --it;
    if (row >= it->buf + it->global.size()) return -1;
    seg = static_cast<std::size_t>(it - segs.begin());
    return it->global.begin + (row - it->buf);
  }
};

// Every selected (group, query, key) computed exactly once, by the rank its
// task is placed on, and nothing else; chunk by chunk. Per chunk of query
// rows, one counter per selected pair (and who computed it first): each
// computed pair is found in its row's sorted keys by binary search, so no
// list of the computed pairs is kept or sorted.
// only >= 0: the args are that rank's, and only the pairs of the tasks placed
// on it must be computed (in the query rows the selection holds: a rank's plan
// from per-rank summaries holds its own).
void check_pairs(const Assignment& a, const char* pass, const std::vector<IndexArgRef>& args, Problems& pr,
                 std::size_t chunk_option, Rank only) {
  const TaskGrid& grid = *a.grid;
  const SelectionRows& sel = grid.selection();
  const Sharding& sh = grid.sharding();
  const int G = grid.flattened() ? grid.num_groups() : 1;
  const auto& cells = grid.cells();
  const auto nb = static_cast<std::int64_t>(sh.num_blocks());
  // Block pair -> cell: a dense table while it is small (4M entries), else a search.
  std::vector<std::int32_t> cell_at;
  if (nb * nb <= (std::int64_t{1} << 22)) {
    cell_at.assign(static_cast<std::size_t>(nb * nb), -1);
    for (std::size_t c = 0; c < cells.size(); ++c)
      cell_at[static_cast<std::size_t>(std::int64_t{cells[c].qblock} * nb + cells[c].kblock)] = static_cast<std::int32_t>(c);
  }
  auto cell_of = [&](int qb, int kb) -> std::int64_t {
    if (!cell_at.empty()) return cell_at[static_cast<std::size_t>(std::int64_t{qb} * nb + kb)];
    auto it = std::lower_bound(cells.begin(), cells.end(), std::pair{qb, kb},
                               [](const Cell& c, auto key) { return std::pair{c.qblock, c.kblock} < key; });
    if (it == cells.end() || it->qblock != qb || it->kblock != kb) return -1;
    return it - cells.begin();
  };
  // The rank that (q, k) of group g is placed on (-1: in no cell).
  auto placed_on = [&](Token q, Token k, int g) -> Rank {
    const int qb = sh.block_of(q), kb = sh.block_of(k);
    const std::int64_t c = qb >= 0 && kb >= 0 ? cell_of(qb, kb) : -1;
    return c < 0 ? -1 : a.rank[static_cast<std::size_t>(c * grid.num_groups() + (grid.flattened() ? g : 0))];
  };
  // Who computed a pair first: for the messages.
  struct By {
    Rank rank;
    std::int32_t stage;
    std::uint32_t arg;
  };
  constexpr std::int64_t kPairBytes = 1 + sizeof(By);
  const std::size_t chunk_pairs =
      chunk_option > 0 ? chunk_option
                       : static_cast<std::size_t>(std::max<std::int64_t>(
                             1024, validator_chunk_bytes(default_memory_budget().bytes) / kPairBytes));
  std::vector<std::uint8_t> hits;
  std::vector<By> first;
  std::vector<std::size_t> row_at;  // offset of row q0 + i's pairs in hits
  const Range held = sel.queries();
  for (int g = 0; g < G; ++g) {
    const int head = grid.per_group_cells() ? g : 0;
    for (Token q0 = held.begin; q0 < held.end;) {
      // Rows [q0, q1): at least one, else as many as fit the chunk.
      Token q1 = q0 + 1;
      std::size_t want = sel.row(head, q0).size();
      while (q1 < held.end && want + sel.row(head, q1).size() <= chunk_pairs) want += sel.row(head, q1++).size();
      row_at.assign(static_cast<std::size_t>(q1 - q0) + 1, 0);
      for (Token q = q0; q < q1; ++q)
        row_at[static_cast<std::size_t>(q - q0) + 1] = row_at[static_cast<std::size_t>(q - q0)] + sel.row(head, q).size();
      hits.assign(want, 0);
      first.resize(want);
      for (const IndexArgRef& d : args) {
        if (d.group != g || d.q_hi <= q0 || q1 <= d.q_lo) continue;
        const AttnArg& x = *d.arg;
        const BufferMap& qm = x.q_buf == BufferId::local ? d.maps->local : d.maps->remote[0];
        KeyMap km{x.k_buf == BufferId::local ? d.maps->local : d.maps->remote[1]};
        const auto width = static_cast<Token>(x.index_width);
        const By by{d.rank, static_cast<std::int32_t>(d.stage), static_cast<std::uint32_t>(d.index)};
        qm.walk(x.q, [&](Range b, Token gq, int) {
          // Buffer rows b hold global queries [gq, gq + |b|): those in [q0, q1).
          const Token lo = std::max(gq, q0), hi = std::min(gq + b.size(), q1);
          for (Token q = lo; q < hi; ++q) {
            const auto wanted = sel.row(head, q);
            const std::size_t base = row_at[static_cast<std::size_t>(q - q0)];
            const int qb = sh.block_of(q);
            int kb = -1;
            Range kr{0, 0};
            std::int64_t task = -1;
            const std::int32_t* e = d.calc->indices.data() + x.index_offset + (b.begin + (q - gq) - x.q.begin) * width;
            for (Token j = 0; j < width; ++j) {
              if (e[j] == -1 || !x.k.contains(e[j])) continue;  // the latter reported by index_arg_alone
              const Token k = km.global(e[j]);
              const auto* w = std::lower_bound(wanted.data(), wanted.data() + wanted.size(), k);
              if (w == wanted.data() + wanted.size() || *w != k) {
                pr.add("{}: rank {} stage {} arg {} computes (q {}, k {}) of group {}, which the mask does not select",
                       pass, by.rank, by.stage, by.arg, q, k, g);
                continue;
              }
              const std::size_t at = base + static_cast<std::size_t>(w - wanted.data());
              if (hits[at] == 0) {
                first[at] = by;
              } else if (hits[at] == 1) {
                pr.add("{}: entry (q {}, k {}) of group {} is computed twice, by rank {} stage {} arg {} and rank {} "
                       "stage {} arg {}",
                       pass, q, k, g, first[at].rank, first[at].stage, first[at].arg, by.rank, by.stage, by.arg);
              }
              if (hits[at] < 255) ++hits[at];
              // The task of (q, k): its placement must be this arg's rank.
              if (!kr.contains(k)) {
                kb = sh.block_of(k);
                kr = kb >= 0 ? sh.blocks[static_cast<std::size_t>(kb)] : Range{0, 0};
                const std::int64_t c = qb >= 0 && kb >= 0 ? cell_of(qb, kb) : -1;
                task = c < 0 ? -1 : c * grid.num_groups() + (grid.flattened() ? g : 0);
              }
              if (task >= 0 && a.rank[static_cast<std::size_t>(task)] != by.rank)
                pr.add("{}: task {} is placed on rank {} but rank {} stage {} arg {} computes (q {}, k {}) of it", pass,
                       task, a.rank[static_cast<std::size_t>(task)], by.rank, by.rank, by.stage, by.arg, q, k);
            }
          }
        });
      }
      for (Token q = q0; q < q1; ++q) {
        const auto wanted = sel.row(head, q);
        const std::size_t base = row_at[static_cast<std::size_t>(q - q0)];
        for (std::size_t w = 0; w < wanted.size(); ++w)
          if (hits[base + w] == 0 && (only < 0 || placed_on(q, wanted[w], g) == only))
            pr.add("{}: selected entry (q {}, k {}) of group {} is computed by no arg", pass, q, wanted[w], g);
      }
      q0 = q1;
    }
  }
}

}  // namespace

Loads check_calc(const Assignment& a, const Plan& plan, bool fwd, const std::vector<RankMaps>& maps, Problems& pr,
                 std::size_t index_chunk_pairs, Rank only) {
  const TaskGrid& grid = *a.grid;
  const auto P = static_cast<std::size_t>(grid.cp_size());
  const auto N = static_cast<std::size_t>(plan.num_stages);
  const int G = grid.num_groups();
  const bool flat = grid.flattened();
  const std::int64_t heads = grid.problem().q_heads_per_task();
  const char* pass = pass_name(fwd);
  Loads loads{std::vector<std::int64_t>(P, 0), std::vector<std::int64_t>(P, 0)};
  std::vector<Item> items;
  const bool index = grid.index_cells();
  std::vector<IndexArgRef> index_args;  // index masks: the args whose pairs are checked in chunks
  // last[k][s]: last stage reading rows received in stage s.
  std::vector<int> last[2] = {std::vector<int>(N + 1, 0), std::vector<int>(N + 1, 0)};

  bool deferred = false;  // some rank's index rows are the executor's to write: its pairs are not in the plan
  for (std::size_t r = 0; r < P; ++r) {
    if (only >= 0 && static_cast<Rank>(r) != only) continue;
    const PassPlan& pp = pass_of(plan.ranks[r], fwd);
    const RankMaps& m = maps[r];
    deferred = deferred || pp.calc.deferred_index_entries > 0;
    std::vector<Range> read[2];
    for (std::size_t s = 0; s <= N; ++s) {
      const std::vector<AttnArg>& args = s == 0 ? pp.calc.local_attn_args : pp.calc.remote_attn_args[s - 1];
      for (std::size_t i = 0; i < args.size(); ++i) {
        const AttnArg& x = args[i];
        const auto where = [&] { return fmt::format("{} rank {} stage {} arg {}", pass, r, s, i); };
        if (static_cast<int>(x.type) < 0 || static_cast<int>(x.type) > 3) {
          pr.add("{}: unknown mask type {}", where(), static_cast<int>(x.type));
          continue;
        }
        if (x.q.empty() || x.k.empty()) {
          pr.add("{}: empty range q [{}, {}) k [{}, {})", where(), x.q.begin, x.q.end, x.k.begin, x.k.end);
          continue;
        }
        if (flat ? x.group < 0 || x.group >= G : x.group != -1) {
          pr.add("{}: head group {} is outside the grid's groups", where(), x.group);
          continue;
        }
        const bool local_arg = x.q_buf == BufferId::local && x.k_buf == BufferId::local;
        if (s == 0 && !local_arg) {
          pr.add("{}: a stage-0 arg reads a remote buffer", where());
          continue;
        }
        if (plan.local_tail && s == N && !local_arg) {
          pr.add("{}: an arg of the local tail reads a remote buffer", where());
          continue;
        }
        bool inside = true;
        for (int k = 0; k < 2; ++k) {
          const Range rg = k == 0 ? x.q : x.k;
          const bool local = (k == 0 ? x.q_buf : x.k_buf) == BufferId::local;
          const Token lim = local ? m.local.size() : m.end[k][s];
          if (rg.begin < 0 || rg.end > lim) {
            pr.add("{}: {} range [{}, {}) is outside its {} buffer [0, {}){}", where(), k == 0 ? "q" : "k", rg.begin,
                   rg.end, local ? "local" : kind_name(k), lim, local ? "" : " received up to this stage");
            inside = false;
          } else if (!local) {
            read[k].push_back(rg);
            for (std::size_t s2 = 1; s2 <= s; ++s2)
              if (rg.begin < m.end[k][s2] && rg.end > m.end[k][s2 - 1])
                last[k][s2] = std::max(last[k][s2], static_cast<int>(s));
          }
        }
        if (!inside) continue;
        if (pp.calc.deferred_index_entries > 0) {
          // The executor writes these rows: the arg's shape and pairs only.
          if (!x.is_index() || x.index_offset < 0 || x.index_area < 0 ||
              x.index_offset + x.q.size() * x.index_width > pp.calc.deferred_index_entries ||
              x.index_area > x.q.size() * x.index_width || x.index_area < x.q.size())
            pr.add("{}: index arg of width {} at offset {} with {} pairs does not fit its {} rows and the {} entries the "
                   "executor writes",
                   where(), x.index_width, x.index_offset, x.index_area, x.q.size(), pp.calc.deferred_index_entries);
          loads.load[r] += x.index_area * heads;
          if (local_arg) loads.local[r] += x.index_area * heads;
          continue;
        }
        if (x.is_index() || index) {
          // (Its kv rows are read: the hull x.k is among read[1] above.)
          std::int64_t load = 0;
          Token q_lo = 0, q_hi = 0;
          if (index_arg_alone(x, pp.calc, m, pr, where, heads, load, q_lo, q_hi) && index)
            index_args.push_back({&x, &pp.calc, &m, static_cast<Rank>(r), static_cast<int>(s), i, flat ? x.group : 0,
                                  q_lo, q_hi});
          loads.load[r] += load;
          if (local_arg) loads.local[r] += load;
          continue;
        }
        arg_pieces(x, m, [&](const Band& g, const Band&, int qgrp, int kgrp) {
          for (int grp : {qgrp, kgrp})
            if (grp != -1 && grp != x.group)
              pr.add("{}: reads remote rows of head group {} for head group {}", where(), grp, x.group);
          const Token area = band_area(g);
          if (area == 0) return;
          loads.load[r] += area * heads;
          if (local_arg) loads.local[r] += area * heads;
          per_cell(g, grid.sharding(), [&](int qb, int kb, const Band& c) {
            items.push_back(Item{qb, kb, flat ? x.group : 0, static_cast<Rank>(r), static_cast<int>(s), i, c});
          });
        });
      }
    }
    // Every received row must be read: the transfers carry needed rows only.
    for (int k = 0; k < 2; ++k) {
      const RangeSet unread = RangeSet{Range{0, m.remote[k].size()}}.subtract(RangeSet(read[k]));
      for (Range u : unread.ranges())
        pr.add("{} rank {}: remote {} rows [{}, {}) are received but never read", pass, r, kind_name(k), u.begin,
               u.end);
    }
  }
  for (std::size_t r = 0; r < P; ++r)
    for (std::size_t s = 0; s < N; ++s) {
      const StageComm& sc = pass_of(plan.ranks[r], fwd).comm.stages[s];
      if (only >= 0) {
        // One rank's readers: the reduce (the same on every rank) waits at least for them.
        if (static_cast<Rank>(r) == only &&
            (sc.qo_reduce_after < last[0][s + 1] || sc.kv_reduce_after < last[1][s + 1] ||
             sc.qo_reduce_after > static_cast<int>(N) || sc.kv_reduce_after > static_cast<int>(N)))
          pr.add("{} rank {} stage {}: reduce_after is (QO {}, KV {}) but the rank reads its rows up to stage (QO {}, "
                 "KV {}) (of {} stages)",
                 pass, r, s + 1, sc.qo_reduce_after, sc.kv_reduce_after, last[0][s + 1], last[1][s + 1], N);
        continue;
      }
      if (sc.qo_reduce_after != last[0][s + 1] || sc.kv_reduce_after != last[1][s + 1])
        pr.add("{} rank {} stage {}: reduce_after is (QO {}, KV {}) but the last stages reading its rows are "
               "(QO {}, KV {})",
               pass, r, s + 1, sc.qo_reduce_after, sc.kv_reduce_after, last[0][s + 1], last[1][s + 1]);
    }
  if (index) {
    if (!deferred) check_pairs(a, pass, index_args, pr, index_chunk_pairs, only);
  } else {
    check_cells(a, pass, items, pr, only);
  }
  return loads;
}

}  // namespace cpsched::validate_detail
