#pragma once
// The solver's flat view of a task grid: tasks, "chunks" (a block of one head
// group: the unit that QO or KV edges move) and edge costs, all priced once
// per solve through the CostModel.
#include <cstdint>
#include <vector>

#include <cpsched/plugin/cost_model.hpp>
#include <cpsched/problem/task_grid.hpp>

namespace cpsched::bg {

class ThreadPool;

enum EdgeKind : int { kQo = 0, kKv = 1 };

struct Instance {
  int P = 0;           // ranks
  int G = 1;           // head groups scheduled independently (1 when not flattened)
  int nb = 0;          // blocks of the sharding
  int num_chunks = 0;  // per kind: G * nb. Chunk c = g * nb + b: group-major, the
                       // order in which the published implementation lays out
                       // flattened head groups (group g at offset g * S).

  // Tasks are indexed by *position*: their rank in the order stage 2 starts
  // from, (compute descending, published grid order), before it is bucketed
  // by degree. task_of[pos] is the grid task (t = cell * G + g). Per position:
  std::vector<std::int32_t> task_of;
  std::vector<std::int32_t> qchunk, kchunk;
  std::vector<double> compute;     // CostModel::compute
  std::vector<Rank> qhost;
  std::vector<Rank> usp;           // USP-affinity rank (Appendix A)
  std::vector<std::uint8_t> local;  // q host == kv host
  // Tasks (positions) of each chunk, per kind: chunk_tasks[chunk_begin[i] .. chunk_begin[i+1])
  // with i = kind * num_chunks + c.
  std::vector<std::int32_t> chunk_begin;
  std::vector<std::int32_t> chunk_tasks;

  std::vector<Rank> block_host;
  // Edge cost of moving (kind, block) to rank r. When every r != host costs
  // the same (the common case), cost_value holds it and cost_row is -1; else
  // cost_row is the offset of a row of P costs in cost_rows.
  std::vector<double> cost_value;       // index kind * nb + b
  std::vector<std::int64_t> cost_row;   // index kind * nb + b
  std::vector<double> cost_rows;

  // Every compute value is an integer and their total is below 2^53, so
  // every partial sum is exact whatever the grouping (the area model).
  bool integral_compute = false;
  double total = 0.0;      // sum of compute
  double mean = 0.0;       // total / P
  double threshold = 0.0;  // initial upper bound of K
  double min_edge_cost = 0.0;

  int block_of(int chunk) const { return chunk % nb; }
  Rank host_of(int chunk) const { return block_host[static_cast<std::size_t>(chunk % nb)]; }
  bool uniform_cost(int kind, int b) const { return cost_row[static_cast<std::size_t>(kind * nb + b)] < 0; }
  double edge_cost(int kind, int b, int r) const {
    const std::int64_t row = cost_row[static_cast<std::size_t>(kind * nb + b)];
    return row < 0 ? cost_value[static_cast<std::size_t>(kind * nb + b)]
                   : cost_rows[static_cast<std::size_t>(row + r)];
  }
  std::size_t num_tasks() const { return qchunk.size(); }
};

// Fills `out` (reusing its storage). Calls the cost model from this thread only.
void build_instance(const TaskGrid& grid, const CostModel& cost, ThreadPool& pool, Instance& out);

}  // namespace cpsched::bg
