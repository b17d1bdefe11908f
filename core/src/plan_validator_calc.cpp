// Plan validator: attention args inside their buffers, mapped back to global
// coordinates, and exactly-once coverage of the mask by exact area accounting.
#include <algorithm>
#include <tuple>

#include "plan_validator_internal.hpp"

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
    seen[static_cast<std::size_t>(task)] = true;
    const Rank want = a.rank[static_cast<std::size_t>(task)];
    // Inside the mask: the pieces' entries that the cell's slices hold.
    Token inside = 0;
    for (std::size_t i = i0; i < i1; ++i) {
      Token in = 0;
      const Band& b = items[i].band;
      for (const Slice& s : it->pieces)
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
    if (sum != it->area)
      pr.add("{}: task {} (q block {}, kv block {}, group {}) has {} unmasked entries but the args compute {} "
             "({} of them inside the mask)",
             pass, task, f.qb, f.kb, f.gi, it->area, sum, inside);
    i0 = i1;
  }
  for (TaskId t = 0; t < grid.num_tasks(); ++t)
    if (!seen[static_cast<std::size_t>(t)])
      pr.add("{}: task {} (q block {}, kv block {}, group {}, {} entries, on rank {}) is computed by no arg", pass,
             t, grid.cell_of(t).qblock, grid.cell_of(t).kblock, t % G, grid.area(t), a.rank[static_cast<std::size_t>(t)]);
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
  check_cells(a, pass, items, pr);
  return loads;
}

}  // namespace cpsched::validate_detail
