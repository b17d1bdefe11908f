#pragma once
// Stage 1: candidate edges, their scores, and the greedy choice under K.
//
// A candidate edge moves a chunk (q or kv block of one head group) from its
// host to another rank r. Its weight, from the last feasible assignment, is
//   W = 0.95 x (A(chunk, r) + U(chunk) / P) + 0.05 x mean / P
// (A: the chunk's compute already placed on r, U: its compute not placed),
// and its score W / max(cost, 1e-6). Edges are taken in (score descending,
// edge index ascending) order while both ends' running cost stays <= K.
// The edge index orders q edges before kv edges, chunks ascending, ranks
// ascending, as the published implementation numbers them.
//
// Most edges of a chunk share one score (all ranks with A = 0), so the
// scorer keeps one *run* per (chunk, distinct score) instead of one entry per
// edge; expanding the runs in (score, chunk, rank) order gives exactly the
// per-edge order, because equal scores order by edge index and a chunk's edge
// indices are contiguous and rank-ordered.
#include <cstdint>
#include <vector>

#include <cpsched/problem/problem.hpp>

#include "rank_mask.hpp"
#include "sort_keys.hpp"

namespace cpsched::bg {

struct Instance;
class ThreadPool;

struct EdgeRun {
  double score = 0.0;
  double cost = 0.0;        // of the edge (shared run: of each of its edges)
  std::int32_t gchunk = 0;  // kind * num_chunks + chunk
  std::int16_t rank = -1;   // one edge to/from this rank; -1: the chunk's shared-score ranks
  std::int16_t host = 0;    // the chunk's host, one end of every edge of the run
};

class EdgeScorer {
 public:
  // Scores every edge against `basis` (rank per task of the last feasible
  // assignment; null before the first one) and sorts the runs.
  void score(const Instance& in, const std::vector<Rank>* basis, ThreadPool& pool, int words);

  const std::vector<EdgeRun>& runs() const { return runs_; }
  // Ranks of global chunk gc that have a run of their own (excluded from its shared run).
  const Word* separate(int gc) const { return separate_.data() + static_cast<std::size_t>(gc) * words_; }

 private:
  std::vector<EdgeRun> runs_;
  std::vector<std::uint64_t> keys_, key_tmp_;
  std::vector<EdgeRun> run_tmp_;
  std::vector<std::uint32_t> radix_count_;
  std::vector<std::vector<EdgeRun>> part_runs_;
  std::vector<std::vector<double>> part_acc_;  // per-part scratch: compute placed per rank
  std::vector<std::vector<int>> part_touched_;  // per-part scratch: ranks with compute placed
  std::vector<std::vector<std::size_t>> part_stamp_;
  std::vector<Word> separate_;
  int words_ = 1;
};

// The allowed ranks of every chunk: masks[gc * W ...] for gc = kind * num_chunks + chunk.
// Every chunk may run on its host.
template <int W>
void select_edges(const Instance& in, const EdgeScorer& scorer, double K, std::vector<double>& node_cost,
                  std::vector<Word>& masks);
// Iteration 0 of the search takes every edge, whatever K.
template <int W>
void select_all_edges(const Instance& in, std::vector<Word>& masks);

}  // namespace cpsched::bg
