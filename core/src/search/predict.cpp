#include "cpsched/search/predict.hpp"

#include <algorithm>
#include <cstdint>

namespace cpsched::search {

namespace {
// The seen bits of one pass over the cells (16 MiB): the head groups are
// taken this many bits' worth at a time.
constexpr std::size_t kMaxBits = std::size_t{1} << 27;
}  // namespace

namespace {

// predict_max_rank_time's pass; `areas`: also on the tasks' exact areas.
std::pair<double, double> predict(const ByteModel& model, const std::vector<Rank>& rank, const TimeObjective& to,
                                  bool areas) {
  const TaskGrid& grid = model.grid();
  const int P = model.ranks(), G = model.groups();
  const auto uP = static_cast<std::size_t>(P);
  struct Seconds {
    double compute = 0, local = 0, cast_in = 0, cast_out = 0, red_in = 0, red_out = 0;
    double area_compute = 0, area_local = 0;  // on exact areas (areas)
  };
  std::vector<Seconds> sec(uP);
  std::vector<int> node(uP);
  for (Rank r = 0; r < P; ++r) node[static_cast<std::size_t>(r)] = to.nodes.node_of(r);
  std::vector<double> tokens(static_cast<std::size_t>(model.num_segments()));
  for (int s = 0; s < model.num_segments(); ++s)
    tokens[static_cast<std::size_t>(s)] = static_cast<double>(model.segment(s).tokens.size());
  // Whether rank r already receives segment s of head group g: bit (s x gs +
  // g - g0) x P + r, for a chunk of gs groups from g0 at a time (cell by
  // cell, so that a cell's hosts and segments are read once per chunk).
  const std::size_t per_group = tokens.size() * uP;
  const auto gs = static_cast<int>(
      std::clamp<std::size_t>(kMaxBits / std::max<std::size_t>(per_group, 1), 1, static_cast<std::size_t>(G)));
  std::vector<std::uint64_t> seen((per_group * static_cast<std::size_t>(gs) + 63) / 64);
  const auto& host = grid.sharding().host;
  const auto& cells = grid.cells();
  const bool per_group_cells = model.per_group();
  // Tokens of the segments of `segs` that rank r (group slot gg) does not yet receive; marks them.
  auto fresh = [&](std::span<const std::int32_t> segs, std::size_t gg, Rank r) {
    double n = 0;
    for (const std::int32_t s : segs) {
      const std::size_t bit = (static_cast<std::size_t>(s) * static_cast<std::size_t>(gs) + gg) * uP +
                              static_cast<std::size_t>(r);
      std::uint64_t& w = seen[bit / 64];
      const std::uint64_t m = std::uint64_t{1} << (bit % 64);
      if ((w & m) == 0) {
        w |= m;
        n += tokens[static_cast<std::size_t>(s)];
      }
    }
    return n;
  };
  auto charge = [&](Rank h, Rank r, double n, const Price& pr) {
    const double len = n * to.byte_s[node[static_cast<std::size_t>(h)] == node[static_cast<std::size_t>(r)] ? 0 : 1];
    Seconds& x = sec[static_cast<std::size_t>(r)];
    Seconds& y = sec[static_cast<std::size_t>(h)];
    y.cast_out += len * pr.out;
    x.cast_in += len * pr.out;
    x.red_out += len * pr.back;
    y.red_in += len * pr.back;
  };
  const Price& qo = model.price(RowKind::qo);
  const Price& kv = model.price(RowKind::kv);
  for (int g0 = 0; g0 < G; g0 += gs) {
    const int g1 = std::min(G, g0 + gs);
    std::fill(seen.begin(), seen.end(), 0);
    for (std::size_t c = 0; c < cells.size(); ++c) {
      const Rank qh = host[static_cast<std::size_t>(cells[c].qblock)];
      const Rank kh = host[static_cast<std::size_t>(cells[c].kblock)];
      for (int g = g0; g < g1; ++g) {
        const auto t = static_cast<TaskId>(c * static_cast<std::size_t>(G) + static_cast<std::size_t>(g));
        const Rank r = rank[static_cast<std::size_t>(t)];
        Seconds& x = sec[static_cast<std::size_t>(r)];
        const double load = to.task_seconds(t, model.load(t));
        x.compute += load;
        if (qh == r && kh == r) x.local += load;
        if (areas) {
          const double a = static_cast<double>(model.load(t)) * to.load_s;
          x.area_compute += a;
          if (qh == r && kh == r) x.area_local += a;
        }
        const int unit = per_group_cells ? static_cast<int>(t) : static_cast<int>(c);
        const auto gg = static_cast<std::size_t>(g - g0);
        if (qh != r)
          if (const double n = fresh(model.qo_segments(unit), gg, r); n > 0) charge(qh, r, n, qo);
        if (kh != r)
          if (const double n = fresh(model.kv_segments(unit), gg, r); n > 0) charge(kh, r, n, kv);
      }
    }
  }
  double worst = 0, area_worst = 0;
  for (const Seconds& x : sec) {
    const double comm_in = std::max(x.cast_in, x.cast_out), comm_back = std::max(x.red_in, x.red_out);
    worst = std::max(worst, std::max(x.local, comm_in) + (x.compute - x.local) + comm_back);
    if (areas)
      area_worst = std::max(area_worst, std::max(x.area_local, comm_in) + (x.area_compute - x.area_local) + comm_back);
  }
  return {worst, area_worst};
}

}  // namespace

double predict_max_rank_time(const ByteModel& model, const std::vector<Rank>& rank, const TimeObjective& to) {
  return predict(model, rank, to, false).first;
}

std::pair<double, double> predict_max_rank_times(const ByteModel& model, const std::vector<Rank>& rank,
                                                 const TimeObjective& to) {
  if (!to.kernel) {
    const double t = predict(model, rank, to, false).first;
    return {t, t};
  }
  return predict(model, rank, to, true);
}

}  // namespace cpsched::search
