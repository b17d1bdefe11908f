#pragma once
// The placement model as a mixed-integer program (GLPK), on the byte model of
// plugins/balanced_bytes (token segments, docs/design.md#metrics forward bytes).
//
// Per-group form (exact):
//   x[t][r] in {0, 1}      task t runs on rank r;           sum_r x[t][r] = 1
//   y[s][g][r] in [0, 1]   segment s of a block reaches rank r != host(s) for
//                          head group g;   x[t][r] <= y[s][g(t)][r] for every
//                          segment s task t needs (QO: its q block's rows, KV:
//                          its kv block's cols). y needs no integrality: the
//                          objective pushes it down to max_t x[t][r].
//   balance                sum_t load(t) x[t][r] <= mu x mean   for every r
//   objective `total`      sum len(s) x (out + back bytes per token) x y
//   objective `bottleneck` B >= send_r, B >= recv_r for every r; minimise B
// Head groups (flattened) have identical cells, so group labels are
// exchangeable: permuting them maps a solution to one of equal bytes and
// loads. We keep one member of each orbit by ordering the groups
// lexicographically on the ranks of a few cells c_1..c_K (rank of c_k in
// group g = sum_r r x[c_k][g][r]; one row per pair of neighbouring groups with
// weights P^(K-k)); sorting the groups of any solution by that key satisfies it. Solving one group and
// copying it would not be valid: the balance constraint couples the groups.
//
// Aggregated form (a relaxation, no group symmetry left): per cell c and rank
// r the number n[c][r] in {0..G} of its groups placed there (sum_r n = G), and
// per segment z[s][r] in [0, G] >= n[c][r] for every cell c needing s. Any
// per-group placement gives n and z = max_c n <= the true number of groups
// that need s on r, so its optimum is a lower bound of the exact one; and a
// per-group placement whose bytes equal that bound is optimal.
#include <cstdint>
#include <vector>

#include "cpsched/search/byte_model.hpp"

struct glp_prob;

namespace cpsched::ilp {

enum class Objective { total, bottleneck };
enum class Form { per_group, aggregated };

struct ModelSize {
  int columns = 0, rows = 0, integers = 0;
  std::int64_t nonzeros = 0;
};

class IlpModel {
 public:
  // counts (per-group form only, optional): fix the number of groups of
  // each cell on each rank, counts[c * P + r] (realising an aggregated solution).
  IlpModel(const search::ByteModel& m, std::int64_t cap, Objective obj, Form form,
           const std::vector<int>* counts = nullptr);
  ~IlpModel();
  IlpModel(const IlpModel&) = delete;
  IlpModel& operator=(const IlpModel&) = delete;

  glp_prob* problem() const { return lp_; }
  // After a GLPK fatal error its environment, this problem included, is gone:
  // forget the pointer instead of deleting it.
  void forget_problem() { lp_ = nullptr; }
  Form form() const { return form_; }
  const ModelSize& size() const { return size_; }
  // Objective unit: the model works in MiB to keep coefficients moderate.
  static constexpr double kUnit = 1024.0 * 1024.0;

  // Column vector (1-based, index 0 unused) of a placement under this form.
  std::vector<double> columns_of(const std::vector<Rank>& placement) const;
  // Per-group form: the placement of a column vector (largest x per task).
  std::vector<Rank> placement_of(const std::vector<double>& cols) const;
  // Aggregated form: n[c][r] at index c * P + r.
  std::vector<int> counts_of(const std::vector<double>& cols) const;
  // Per-group form: the same placement with head groups relabelled to
  // satisfy the ordering rows (equal bytes and loads).
  std::vector<Rank> canonical(const std::vector<Rank>& placement) const;
  // The cells whose ranks order the head groups (lexicographically); empty
  // when there are no such rows.
  const std::vector<int>& symmetry_cells() const { return sym_cells_; }

 private:
  int items() const;
  int item_col(int item, Rank r) const { return 1 + item * P_ + r; }

  const search::ByteModel& m_;
  Objective obj_;
  Form form_;
  int P_;
  glp_prob* lp_ = nullptr;
  std::vector<int> key_col_;  // key * P + r -> column (0 for the host); key = slot(s, g) or s
  int b_col_ = 0;
  std::vector<int> sym_cells_;
  ModelSize size_;
};

// Bytes of a placement under an objective: forward total send, or the
// forward bottleneck max over ranks of max(send, recv).
double objective_bytes(const search::ByteModel& m, Objective obj, const std::vector<Rank>& placement);

}  // namespace cpsched::ilp
