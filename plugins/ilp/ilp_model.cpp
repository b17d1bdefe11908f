#include "ilp_model.hpp"

#include <glpk.h>

#include <algorithm>
#include <cmath>

#include "cpsched/search/state.hpp"

namespace cpsched::ilp {

namespace {

// Nonzeros added in bulk: (row, column, coefficient), 1-based.
struct Matrix {
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0.0};
  void add(int row, int col, double v) {
    ia.push_back(row);
    ja.push_back(col);
    ar.push_back(v);
  }
};

// The cells whose placements order the head groups, most significant first:
// cells whose q and kv blocks live on different ranks (the likeliest to be
// spread over ranks), largest first, then the others. As many as keep the
// lexicographic weights P^k below 2^20.
std::vector<int> pick_symmetry_cells(const TaskGrid& g) {
  const auto& cells = g.cells();
  std::vector<int> order(cells.size());
  for (std::size_t c = 0; c < cells.size(); ++c) order[c] = static_cast<int>(c);
  auto remote = [&](int c) {
    const Cell& x = cells[static_cast<std::size_t>(c)];
    return g.sharding().host[static_cast<std::size_t>(x.qblock)] != g.sharding().host[static_cast<std::size_t>(x.kblock)];
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (remote(a) != remote(b)) return remote(a);
    return cells[static_cast<std::size_t>(a)].area > cells[static_cast<std::size_t>(b)].area;
  });
  std::size_t k = 1;
  for (double w = g.cp_size(); w * g.cp_size() <= 1048576.0 && k < order.size(); w *= g.cp_size()) ++k;
  order.resize(std::min(k, order.size()));
  return order;
}

}  // namespace

double objective_bytes(const search::ByteModel& m, Objective obj, const std::vector<Rank>& placement) {
  const search::State st(m, placement, 0, obj == Objective::bottleneck ? 1.0 : 0.0);
  return obj == Objective::bottleneck ? st.bottleneck() : st.total();
}

int IlpModel::items() const {
  return form_ == Form::per_group ? static_cast<int>(m_.tasks()) : m_.num_cells();
}

IlpModel::IlpModel(const search::ByteModel& m, std::int64_t cap, Objective obj, Form form,
                   const std::vector<int>* counts)
    : m_(m), obj_(obj), form_(form), P_(m.ranks()) {
  const TaskGrid& grid = m.grid();
  const int G = m.groups();
  const int S = m.num_segments();
  const bool per_group = form == Form::per_group;
  const int mult = per_group ? 1 : G;       // units of an item
  const int key_groups = per_group ? G : 1; // keys per segment
  const int I = items();
  auto up = [](int i) { return static_cast<std::size_t>(i); };
  lp_ = glp_create_prob();
  glp_set_obj_dir(lp_, GLP_MIN);

  // Columns: items on ranks, then segment keys on ranks, then B.
  const int nx = I * P_;
  if (nx > 0) glp_add_cols(lp_, nx);
  for (int j = 1; j <= nx; ++j) {
    if (mult == 1) {
      glp_set_col_kind(lp_, j, GLP_BV);
    } else {
      glp_set_col_kind(lp_, j, GLP_IV);
      glp_set_col_bnds(lp_, j, GLP_DB, 0.0, mult);
    }
  }
  key_col_.assign(up(S) * up(key_groups) * up(P_), 0);
  int ny = 0;
  for (int s = 0; s < S; ++s)
    for (int g = 0; g < key_groups; ++g)
      for (Rank r = 0; r < P_; ++r)
        if (r != m.segment(s).host) key_col_[(up(s) * up(key_groups) + up(g)) * up(P_) + up(r)] = nx + ++ny;
  if (ny > 0) glp_add_cols(lp_, ny);
  for (int j = nx + 1; j <= nx + ny; ++j) glp_set_col_bnds(lp_, j, GLP_DB, 0.0, mult);
  if (obj_ == Objective::bottleneck) {
    b_col_ = glp_add_cols(lp_, 1);
    glp_set_col_bnds(lp_, b_col_, GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(lp_, b_col_, 1.0);
  }
  auto key_col = [&](int s, int g, Rank r) {
    return key_col_[(up(s) * up(key_groups) + up(g)) * up(P_) + up(r)];
  };

  // Objective, and per-rank send / recv of each key column (forward, MiB).
  std::vector<std::vector<std::pair<int, double>>> send(up(P_)), recv(up(P_));
  for (int s = 0; s < S; ++s) {
    const search::Segment& seg = m.segment(s);
    const search::Price& pr = m.price(seg.dir);
    const double len = static_cast<double>(seg.tokens.size()) / kUnit;
    for (int g = 0; g < key_groups; ++g)
      for (Rank r = 0; r < P_; ++r) {
        const int col = key_col(s, g, r);
        if (col == 0) continue;
        if (obj_ == Objective::total) glp_set_obj_coef(lp_, col, len * pr.sum());
        send[up(seg.host)].emplace_back(col, len * pr.out);
        recv[up(r)].emplace_back(col, len * pr.out);
        if (pr.back > 0) {
          send[up(r)].emplace_back(col, len * pr.back);
          recv[up(seg.host)].emplace_back(col, len * pr.back);
        }
      }
  }

  Matrix a;
  int row = 0;
  // Every unit of an item on some rank.
  for (int i = 0; i < I; ++i) {
    ++row;
    for (Rank r = 0; r < P_; ++r) a.add(row, item_col(i, r), 1.0);
  }
  const int assign_rows = row;
  // Item on r => its segments reach r.
  for (int i = 0; i < I; ++i) {
    const int c = per_group ? m.unit_of(i) : i;
    const int g = per_group ? m.group_of(i) : 0;
    for (auto segs : {m.qo_segments(c), m.kv_segments(c)})
      for (std::int32_t s : segs)
        for (Rank r = 0; r < P_; ++r) {
          const int col = key_col(s, g, r);
          if (col == 0) continue;
          ++row;
          a.add(row, item_col(i, r), 1.0);
          a.add(row, col, -1.0);
        }
  }
  const int link_rows = row;
  // Balance, in units of the cap so that the row is well scaled.
  const double scale = cap > 0 ? static_cast<double>(cap) : 1.0;
  for (Rank r = 0; r < P_; ++r) {
    ++row;
    for (int i = 0; i < I; ++i) {
      const double load = per_group ? static_cast<double>(m.load(i))
                                    : static_cast<double>(grid.cells()[up(i)].area) * grid.problem().q_heads_per_task();
      a.add(row, item_col(i, r), load / scale);
    }
  }
  const int balance_rows = row;
  // Head groups in lexicographic order of the ranks of a few cells:
  // sum_k P^(K-1-k) (rank of cell c_k in group g - in group g+1) <= 0.
  // (Only when the groups are interchangeable: not with per-group cells.)
  if (per_group && grid.flattened() && G > 1 && !grid.cells().empty() && !grid.per_group_cells()) {
    sym_cells_ = pick_symmetry_cells(grid);
    for (int g = 0; g + 1 < G; ++g) {
      ++row;
      double w = 1;
      for (std::size_t k = sym_cells_.size(); k-- > 0; w *= P_) {
        const int t0 = sym_cells_[k] * G + g;
        for (Rank r = 1; r < P_; ++r) {
          a.add(row, item_col(t0, r), w * r);
          a.add(row, item_col(t0 + 1, r), -w * r);
        }
      }
    }
  }
  // Fixed counts: sum_g x[c][g][r] = counts[c][r].
  const int fixed_begin = row;
  if (per_group && counts != nullptr)
    for (int c = 0; c < m.num_cells(); ++c)
      for (Rank r = 0; r < P_; ++r) {
        ++row;
        for (int g = 0; g < G; ++g) a.add(row, item_col(c * G + g, r), 1.0);
      }
  const int fixed_end = row;
  // Bottleneck: send_r - B <= 0, recv_r - B <= 0.
  if (obj_ == Objective::bottleneck)
    for (Rank r = 0; r < P_; ++r)
      for (const auto* list : {&send[up(r)], &recv[up(r)]}) {
        ++row;
        for (const auto& [col, v] : *list) a.add(row, col, v);
        a.add(row, b_col_, -1.0);
      }

  if (row > 0) glp_add_rows(lp_, row);
  for (int i = 1; i <= assign_rows; ++i) glp_set_row_bnds(lp_, i, GLP_FX, mult, mult);
  for (int i = assign_rows + 1; i <= link_rows; ++i) glp_set_row_bnds(lp_, i, GLP_UP, 0.0, 0.0);
  for (int i = link_rows + 1; i <= balance_rows; ++i)
    glp_set_row_bnds(lp_, i, GLP_UP, 0.0, static_cast<double>(cap) / scale);
  for (int i = balance_rows + 1; i <= row; ++i) glp_set_row_bnds(lp_, i, GLP_UP, 0.0, 0.0);
  for (int i = fixed_begin + 1; i <= fixed_end; ++i) {
    const double n = (*counts)[static_cast<std::size_t>(i - fixed_begin - 1)];
    glp_set_row_bnds(lp_, i, GLP_FX, n, n);
  }
  glp_load_matrix(lp_, static_cast<int>(a.ia.size()) - 1, a.ia.data(), a.ja.data(), a.ar.data());

  size_.columns = glp_get_num_cols(lp_);
  size_.rows = row;
  size_.integers = nx;
  size_.nonzeros = static_cast<std::int64_t>(a.ia.size()) - 1;
}

IlpModel::~IlpModel() {
  if (lp_ != nullptr) glp_delete_prob(lp_);
}

std::vector<double> IlpModel::columns_of(const std::vector<Rank>& placement) const {
  std::vector<double> v(static_cast<std::size_t>(glp_get_num_cols(lp_)) + 1, 0.0);
  const int G = m_.groups();
  const bool per_group = form_ == Form::per_group;
  const int key_groups = per_group ? G : 1;
  for (TaskId t = 0; t < m_.tasks(); ++t) {
    const Rank r = placement[static_cast<std::size_t>(t)];
    const int c = m_.cell_of(t);
    v[static_cast<std::size_t>(item_col(per_group ? static_cast<int>(t) : c, r))] += 1.0;
  }
  // Keys: the largest item count that needs them (the least the rows allow).
  for (int i = 0; i < items(); ++i) {
    const int c = per_group ? m_.unit_of(i) : i;
    const int g = per_group ? m_.group_of(i) : 0;
    for (auto segs : {m_.qo_segments(c), m_.kv_segments(c)})
      for (std::int32_t s : segs)
        for (Rank r = 0; r < P_; ++r) {
          const int col = key_col_[(static_cast<std::size_t>(s) * static_cast<std::size_t>(key_groups) +
                                    static_cast<std::size_t>(g)) *
                                       static_cast<std::size_t>(P_) +
                                   static_cast<std::size_t>(r)];
          if (col == 0) continue;
          auto& y = v[static_cast<std::size_t>(col)];
          y = std::max(y, v[static_cast<std::size_t>(item_col(i, r))]);
        }
  }
  if (b_col_ != 0) {
    // B: the largest send or recv of the key columns (the last 2P rows).
    double b = 0;
    for (int i = glp_get_num_rows(lp_) - 2 * P_ + 1; i <= glp_get_num_rows(lp_); ++i) {
      const int len = glp_get_mat_row(lp_, i, nullptr, nullptr);
      std::vector<int> ind(static_cast<std::size_t>(len) + 1);
      std::vector<double> val(static_cast<std::size_t>(len) + 1);
      glp_get_mat_row(lp_, i, ind.data(), val.data());
      double sum = 0;
      for (int k = 1; k <= len; ++k)
        if (ind[static_cast<std::size_t>(k)] != b_col_)
          sum += val[static_cast<std::size_t>(k)] * v[static_cast<std::size_t>(ind[static_cast<std::size_t>(k)])];
      b = std::max(b, sum);
    }
    v[static_cast<std::size_t>(b_col_)] = b;
  }
  return v;
}

std::vector<Rank> IlpModel::placement_of(const std::vector<double>& cols) const {
  std::vector<Rank> p(static_cast<std::size_t>(m_.tasks()), 0);
  for (TaskId t = 0; t < m_.tasks(); ++t) {
    Rank best = 0;
    for (Rank r = 1; r < P_; ++r)
      if (cols[static_cast<std::size_t>(item_col(static_cast<int>(t), r))] >
          cols[static_cast<std::size_t>(item_col(static_cast<int>(t), best))])
        best = r;
    p[static_cast<std::size_t>(t)] = best;
  }
  return p;
}

std::vector<int> IlpModel::counts_of(const std::vector<double>& cols) const {
  std::vector<int> n(static_cast<std::size_t>(m_.num_cells()) * static_cast<std::size_t>(P_), 0);
  for (int c = 0; c < m_.num_cells(); ++c)
    for (Rank r = 0; r < P_; ++r)
      n[static_cast<std::size_t>(c) * static_cast<std::size_t>(P_) + static_cast<std::size_t>(r)] =
          static_cast<int>(std::lround(cols[static_cast<std::size_t>(item_col(c, r))]));
  return n;
}

std::vector<Rank> IlpModel::canonical(const std::vector<Rank>& placement) const {
  if (sym_cells_.empty()) return placement;
  const int G = m_.groups();
  const auto uG = static_cast<std::size_t>(G);
  std::vector<int> order(uG);
  for (int g = 0; g < G; ++g) order[static_cast<std::size_t>(g)] = g;
  auto key = [&](int g) {
    std::vector<Rank> k;
    for (int c : sym_cells_) k.push_back(placement[static_cast<std::size_t>(c) * uG + static_cast<std::size_t>(g)]);
    return k;
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) < key(b); });
  std::vector<Rank> out(placement.size());
  for (std::size_t c = 0; c * uG < placement.size(); ++c)
    for (std::size_t g = 0; g < uG; ++g) out[c * uG + g] = placement[c * uG + static_cast<std::size_t>(order[g])];
  return out;
}

}  // namespace cpsched::ilp
