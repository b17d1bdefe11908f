#include "edge_selection.hpp"

#include <algorithm>
#include <bit>

#include "instance.hpp"
#include "sort_keys.hpp"
#include "thread_pool.hpp"

namespace cpsched::bg {

namespace {

// Appendix A's weight, in the published operation order.
inline double weight(double placed, double unplaced, double mean, int P) {
  return (placed + unplaced / P) * 0.95 + mean / P * 0.05;
}
inline double score_of(double w, double cost) { return w / std::max(cost, 1e-6); }

}  // namespace

void EdgeScorer::score(const Instance& in, const std::vector<Rank>* basis, ThreadPool& pool, int words) {
  words_ = words;
  const int NC = in.num_chunks;
  const int P = in.P;
  const std::size_t nglobal = 2 * static_cast<std::size_t>(NC);
  separate_.assign(nglobal * static_cast<std::size_t>(words), 0);
  const int parts = pool.parts_for(nglobal, 64);
  if (static_cast<int>(part_runs_.size()) < parts) {
    part_runs_.resize(static_cast<std::size_t>(parts));
    part_acc_.resize(static_cast<std::size_t>(parts));
    part_touched_.resize(static_cast<std::size_t>(parts));
    part_stamp_.resize(static_cast<std::size_t>(parts));
  }

  pool.parallel_for(nglobal, 64, [&](int part, std::size_t g0, std::size_t g1) {
    std::vector<EdgeRun>& out = part_runs_[static_cast<std::size_t>(part)];
    std::vector<double>& acc = part_acc_[static_cast<std::size_t>(part)];
    out.clear();
    acc.resize(static_cast<std::size_t>(P));
    std::vector<std::size_t>& stamp = part_stamp_[static_cast<std::size_t>(part)];
    stamp.assign(static_cast<std::size_t>(P), 0);  // acc[r] is valid iff stamp[r] == gc + 1
    std::vector<int>& touched = part_touched_[static_cast<std::size_t>(part)];
    for (std::size_t gc = g0; gc < g1; ++gc) {
      const int kind = static_cast<int>(gc) / NC;
      const int c = static_cast<int>(gc) % NC;
      const int b = in.block_of(c);
      const Rank h = in.host_of(c);
      // U = (chunk sum) - (placed sum) as published. A basis (a feasible
      // assignment) places every task, and both sums add the same values in
      // the same order, so U is exactly 0 then; without one, nothing is placed.
      double unplaced = 0.0;
      std::size_t nt = 0;
      const std::int32_t i0 = in.chunk_begin[gc], i1 = in.chunk_begin[gc + 1];
      if (basis == nullptr) {
        for (std::int32_t i = i0; i < i1; ++i) unplaced += in.compute[static_cast<std::size_t>(in.chunk_tasks[static_cast<std::size_t>(i)])];
      } else {
        touched.resize(static_cast<std::size_t>(P) + 1);
        auto flush = [&](std::size_t r, double v) {
          if (stamp[r] != gc + 1) {
            stamp[r] = gc + 1;
            touched[nt++] = static_cast<int>(r);
            acc[r] = v;
          } else {
            acc[r] += v;
          }
        };
        if (in.integral_compute) {
          // Exact integer sums: any grouping gives the published value, so
          // sum each run of tasks on one rank in a register first.
          std::size_t cur = ~std::size_t{0};
          std::int64_t run = 0;
          for (std::int32_t i = i0; i < i1; ++i) {
            const auto t = static_cast<std::size_t>(in.chunk_tasks[static_cast<std::size_t>(i)]);
            const auto r = static_cast<std::size_t>((*basis)[t]);
            if (r != cur) {
              if (cur != ~std::size_t{0}) flush(cur, static_cast<double>(run));
              cur = r;
              run = 0;
            }
            run += static_cast<std::int64_t>(in.compute[t]);
          }
          if (cur != ~std::size_t{0}) flush(cur, static_cast<double>(run));
        } else {
          for (std::int32_t i = i0; i < i1; ++i) {
            const auto t = static_cast<std::size_t>(in.chunk_tasks[static_cast<std::size_t>(i)]);
            flush(static_cast<std::size_t>((*basis)[t]), in.compute[t]);
          }
        }
      }
      touched.resize(nt);
      Word* sep = separate_.data() + gc * static_cast<std::size_t>(words);
      const auto g32 = static_cast<std::int32_t>(gc);
      if (in.uniform_cost(kind, b)) {
        const double cost = in.edge_cost(kind, b, 0);
        const double shared = score_of(weight(0.0, unplaced, in.mean, P), cost);
        std::sort(touched.begin(), touched.end());
        for (int r : touched) {
          const double a = acc[static_cast<std::size_t>(r)];
          if (r == h || a == 0.0) continue;
          const double s = score_of(weight(a, unplaced, in.mean, P), cost);
          if (s == shared) continue;  // same score: stays in the shared run, in rank order
          out.push_back({s, cost, g32, static_cast<std::int16_t>(r), static_cast<std::int16_t>(h)});
          sep[r >> 6] |= Word{1} << (r & 63);
        }
        if (P > 1) out.push_back({shared, cost, g32, -1, static_cast<std::int16_t>(h)});
      } else {
        for (int r = 0; r < P; ++r) {
          if (r == h) continue;
          const double a = stamp[static_cast<std::size_t>(r)] == gc + 1 ? acc[static_cast<std::size_t>(r)] : 0.0;
          const double cost = in.edge_cost(kind, b, r);
          out.push_back({score_of(weight(a, unplaced, in.mean, P), cost), cost, g32, static_cast<std::int16_t>(r),
                         static_cast<std::int16_t>(h)});
          sep[r >> 6] |= Word{1} << (r & 63);
        }
      }
    }
  });

  // The runs come out in (chunk, rank) order: chunks ascending across parts,
  // and inside a chunk equal scores only among single-rank runs, emitted in
  // rank order. So a stable sort on the score alone gives the order
  // (score descending, chunk, rank) that the edge indices define.
  runs_.clear();
  keys_.clear();
  for (int p = 0; p < parts; ++p)
    for (const EdgeRun& r : part_runs_[static_cast<std::size_t>(p)]) {
      runs_.push_back(r);
      keys_.push_back(descending_key(r.score));
    }
  radix_sort_stable(keys_, runs_, key_tmp_, run_tmp_, radix_count_);
}

template <int W>
void select_edges(const Instance& in, const EdgeScorer& scorer, double K, std::vector<double>& node,
                  std::vector<Word>& masks) {
  using M = RankMask<W>;
  const int NC = in.num_chunks;
  const int P = in.P;
  node.assign(static_cast<std::size_t>(P), 0.0);
  masks.resize(2 * static_cast<std::size_t>(NC) * W);
  for (std::size_t gc = 0, b = 0; gc < 2 * static_cast<std::size_t>(NC); ++gc, b = b + 1 == static_cast<std::size_t>(in.nb) ? 0 : b + 1)
    M::only(masks.data() + gc * W, in.block_host[b]);

  // Ranks that can still take the cheapest edge. A closed rank rejects every
  // later edge, so skipping it changes nothing; with fewer than two open
  // ranks no edge fits any more.
  const double cmin = in.min_edge_cost;
  Word open[W];
  M::clear(open);
  int n_open = 0;
  if (cmin <= K) {
    M::first(open, P);
    n_open = P;
  }
  auto take = [&](double& nh, Rank h, double& nr, Rank r, double cost, Word* m) {
    nh += cost;
    nr += cost;
    M::set(m, r);
    if (nh + cmin > K) {
      open[h >> 6] &= ~(Word{1} << (h & 63));
      --n_open;
    }
    if (nr + cmin > K) {
      open[r >> 6] &= ~(Word{1} << (r & 63));
      --n_open;
    }
  };

  for (const EdgeRun& run : scorer.runs()) {
    if (n_open < 2) break;
    const Rank h = run.host;
    if (!M::test(open, h)) continue;
    Word* m = masks.data() + static_cast<std::size_t>(run.gchunk) * W;
    double& nh = node[static_cast<std::size_t>(h)];
    const double cost = run.cost;
    if (run.rank >= 0) {
      double& nr = node[static_cast<std::size_t>(run.rank)];
      if (nh + cost <= K && nr + cost <= K) take(nh, h, nr, run.rank, cost, m);
      continue;
    }
    // Shared run: the chunk's other ranks in increasing order, one cost, one
    // host end, so once the host's budget is spent no later edge fits.
    if (nh + cost > K) continue;
    const Word* sep = scorer.separate(run.gchunk);
    bool host_full = false;
    for (int w = 0; w < W && !host_full; ++w) {
      for (Word x = open[w] & ~sep[w]; x != 0; x &= x - 1) {
        const int r = w * 64 + std::countr_zero(x);
        if (r == h) continue;
        double& nr = node[static_cast<std::size_t>(r)];
        if (nr + cost <= K) {
          take(nh, h, nr, r, cost, m);
          if (nh + cost > K) {
            host_full = true;
            break;
          }
        }
      }
    }
  }
}

template <int W>
void select_all_edges(const Instance& in, std::vector<Word>& masks) {
  masks.resize(2 * static_cast<std::size_t>(in.num_chunks) * W);
  for (std::size_t gc = 0; gc < 2 * static_cast<std::size_t>(in.num_chunks); ++gc)
    RankMask<W>::first(masks.data() + gc * W, in.P);
}

#define CPSCHED_BG_INSTANTIATE(W)                                                                      \
  template void select_edges<W>(const Instance&, const EdgeScorer&, double, std::vector<double>&,     \
                                std::vector<Word>&);                                                   \
  template void select_all_edges<W>(const Instance&, std::vector<Word>&);
CPSCHED_BG_INSTANTIATE(1)
CPSCHED_BG_INSTANTIATE(2)
CPSCHED_BG_INSTANTIATE(4)
CPSCHED_BG_INSTANTIATE(8)
CPSCHED_BG_INSTANTIATE(16)
#undef CPSCHED_BG_INSTANTIATE

}  // namespace cpsched::bg
