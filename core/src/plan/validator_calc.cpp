// Plan validator: attention args inside their buffers, mapped back to global
// coordinates, and exactly-once coverage of the mask by exact area accounting.
#include <algorithm>
#include <tuple>

#include "plan/validator_internal.hpp"

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

void check_cells(const Assignment& a, const char* pass, std::vector<Item>& items, Problems& pr) {
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
    if (!seen[static_cast<std::size_t>(t)] && grid.area(t) > 0)
      pr.add("{}: task {} (q block {}, kv block {}, group {}, {} entries, on rank {}) is computed by no arg", pass,
             t, grid.cell_of(t).qblock, grid.cell_of(t).kblock, t % G, grid.area(t), a.rank[static_cast<std::size_t>(t)]);
}

// One computed (group, query, key) of an index arg, global coordinates.
struct Pair {
  int group;
  Token q, k;
  Rank rank;
  int stage;
  std::size_t arg;
};

// An index arg's entries through the buffer maps: in its rows, in the
// pool, inside its hull `k`, rows of its head group; the pairs it computes
// go to `pairs`, the kv rows it reads to `read`.
template <class Where>
void index_arg(const AttnArg& x, const CalcMeta& calc, const RankMaps& m, Rank r, int stage, std::size_t i,
               std::vector<Pair>& pairs, std::vector<Range>& read, Problems& pr, Where&& where) {
  if (!x.is_index()) {
    pr.add("{}: a range arg in the plan of an index mask (token top-k masks are computed by index args)", where());
    return;
  }
  const auto width = static_cast<std::size_t>(x.index_width);
  if (x.index_offset < 0 || static_cast<std::size_t>(x.index_offset) + static_cast<std::size_t>(x.q.size()) * width >
                                calc.indices.size()) {
    pr.add("{}: index rows [{}, {} + {} x {}) are outside the pool of {} indices", where(), x.index_offset,
           x.index_offset, x.q.size(), width, calc.indices.size());
    return;
  }
  const BufferMap& qm = x.q_buf == BufferId::local ? m.local : m.remote[0];
  const BufferMap& km = x.k_buf == BufferId::local ? m.local : m.remote[1];
  const int group = x.group < 0 ? 0 : x.group;
  const std::int32_t* pool = calc.indices.data() + x.index_offset;
  const auto valid = std::count_if(pool, pool + x.q.size() * x.index_width, [](std::int32_t e) { return e >= 0; });
  if (valid != x.index_area)
    pr.add("{}: index_area is {} but the arg's rows hold {} entries", where(), x.index_area, valid);
  for (Token row = x.q.begin; row < x.q.end; ++row) {
    Token q = -1;
    qm.walk({row, row + 1}, [&](Range, Token g, int grp) {
      q = g;
      if (grp != -1 && grp != x.group)
        pr.add("{}: reads remote rows of head group {} for head group {}", where(), grp, x.group);
    });
    const std::int32_t* e = calc.indices.data() + x.index_offset + (row - x.q.begin) * static_cast<Token>(width);
    for (std::size_t j = 0; j < width; ++j) {
      if (e[j] == -1) continue;
      if (!x.k.contains(e[j])) {
        pr.add("{}: index entry [{}, {}] = {} is outside the arg's k rows [{}, {})", where(), row - x.q.begin, j,
               e[j], x.k.begin, x.k.end);
        continue;
      }
      Token k = -1;
      km.walk({e[j], e[j] + 1}, [&](Range, Token g, int grp) {
        k = g;
        if (grp != -1 && grp != x.group)
          pr.add("{}: reads remote rows of head group {} for head group {}", where(), grp, x.group);
      });
      if (x.k_buf == BufferId::remote) read.push_back({e[j], e[j] + 1});
      pairs.push_back({group, q, k, r, stage, i});
    }
  }
}

// Index masks: every selected (group, query, key) computed exactly once, by
// the rank its task is placed on, and nothing else.
void check_pairs(const Assignment& a, const char* pass, std::vector<Pair>& pairs, Problems& pr) {
  const TaskGrid& grid = *a.grid;
  const SelectionRows& sel = grid.selection();
  const Sharding& sh = grid.sharding();
  const int G = grid.flattened() ? grid.num_groups() : 1;
  std::sort(pairs.begin(), pairs.end(), [](const Pair& x, const Pair& y) {
    return std::tuple{x.group, x.q, x.k} < std::tuple{y.group, y.q, y.k};
  });
  const auto& cells = grid.cells();
  auto task_of = [&](int g, Token q, Token k) -> TaskId {
    const int qb = sh.block_of(q), kb = sh.block_of(k);
    auto it = std::lower_bound(cells.begin(), cells.end(), std::pair{qb, kb},
                               [](const Cell& c, auto key) { return std::pair{c.qblock, c.kblock} < key; });
    if (it == cells.end() || it->qblock != qb || it->kblock != kb) return -1;
    return static_cast<TaskId>((it - cells.begin()) * grid.num_groups() + (grid.flattened() ? g : 0));
  };
  std::size_t p = 0;
  for (int g = 0; g < G; ++g) {
    const int head = grid.per_group_cells() ? g : 0;
    for (Token q = 0; q < sel.seqlen(); ++q) {
      const auto want = sel.row(head, q);
      std::size_t w = 0;
      for (; p < pairs.size() && pairs[p].group == g && pairs[p].q == q; ++p) {
        const Pair& x = pairs[p];
        while (w < want.size() && want[w] < x.k) {
          pr.add("{}: selected entry (q {}, k {}) of group {} is computed by no arg", pass, q, want[w], g);
          ++w;
        }
        if (w < want.size() && want[w] == x.k) {
          ++w;
          const TaskId t = task_of(g, q, x.k);
          if (t >= 0 && a.rank[static_cast<std::size_t>(t)] != x.rank)
            pr.add("{}: task {} is placed on rank {} but rank {} stage {} arg {} computes (q {}, k {}) of it", pass, t,
                   a.rank[static_cast<std::size_t>(t)], x.rank, x.rank, x.stage, x.arg, q, x.k);
        } else if (p > 0 && pairs[p - 1].group == g && pairs[p - 1].q == q && pairs[p - 1].k == x.k) {
          pr.add("{}: entry (q {}, k {}) of group {} is computed twice, by rank {} stage {} arg {} and rank {} stage "
                 "{} arg {}",
                 pass, q, x.k, g, pairs[p - 1].rank, pairs[p - 1].stage, pairs[p - 1].arg, x.rank, x.stage, x.arg);
        } else {
          pr.add("{}: rank {} stage {} arg {} computes (q {}, k {}) of group {}, which the mask does not select", pass,
                 x.rank, x.stage, x.arg, q, x.k, g);
        }
      }
      for (; w < want.size(); ++w)
        pr.add("{}: selected entry (q {}, k {}) of group {} is computed by no arg", pass, q, want[w], g);
    }
  }
  for (; p < pairs.size(); ++p)
    pr.add("{}: rank {} stage {} arg {} computes (q {}, k {}) of group {}, outside the grid", pass, pairs[p].rank,
           pairs[p].stage, pairs[p].arg, pairs[p].q, pairs[p].k, pairs[p].group);
}

}  // namespace

Loads check_calc(const Assignment& a, const Plan& plan, bool fwd, const std::vector<RankMaps>& maps, Problems& pr) {
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
  std::vector<Pair> pairs;  // index masks: every computed (group, query, key)
  // last[k][s]: last stage reading rows received in stage s.
  std::vector<int> last[2] = {std::vector<int>(N + 1, 0), std::vector<int>(N + 1, 0)};

  for (std::size_t r = 0; r < P; ++r) {
    const PassPlan& pp = pass_of(plan.ranks[r], fwd);
    const RankMaps& m = maps[r];
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
        if (s == 0 && (x.q_buf != BufferId::local || x.k_buf != BufferId::local)) {
          pr.add("{}: a stage-0 arg reads a remote buffer", where());
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
        if (x.is_index() || index) {
          index_arg(x, pp.calc, m, static_cast<Rank>(r), static_cast<int>(s), i, pairs, read[1], pr, where);
          continue;
        }
        arg_pieces(x, m, [&](const Band& g, const Band&, int qgrp, int kgrp) {
          for (int grp : {qgrp, kgrp})
            if (grp != -1 && grp != x.group)
              pr.add("{}: reads remote rows of head group {} for head group {}", where(), grp, x.group);
          const Token area = band_area(g);
          if (area == 0) return;
          loads.load[r] += area * heads;
          if (s == 0) loads.stage0[r] += area * heads;
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
      if (sc.qo_reduce_after != last[0][s + 1] || sc.kv_reduce_after != last[1][s + 1])
        pr.add("{} rank {} stage {}: reduce_after is (QO {}, KV {}) but the last stages reading its rows are "
               "(QO {}, KV {})",
               pass, r, s + 1, sc.qo_reduce_after, sc.kv_reduce_after, last[0][s + 1], last[1][s + 1]);
    }
  if (index) {
    check_pairs(a, pass, pairs, pr);
    for (const Pair& x : pairs) {
      loads.load[static_cast<std::size_t>(x.rank)] += heads;
      if (x.stage == 0) loads.stage0[static_cast<std::size_t>(x.rank)] += heads;
    }
  } else {
    check_cells(a, pass, items, pr);
  }
  return loads;
}

}  // namespace cpsched::validate_detail
