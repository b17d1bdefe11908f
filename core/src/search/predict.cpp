#include "cpsched/search/predict.hpp"

#include <algorithm>
#include <cstdint>

namespace cpsched::search {

double predict_max_rank_time(const ByteModel& model, const std::vector<Rank>& rank, const TimeObjective& to) {
  const TaskGrid& grid = model.grid();
  const int P = model.ranks(), G = model.groups();
  const auto cells = static_cast<TaskId>(model.num_cells());
  struct Seconds {
    double compute = 0, local = 0, cast_in = 0, cast_out = 0, red_in = 0, red_out = 0;
  };
  std::vector<Seconds> sec(static_cast<std::size_t>(P));
  // Whether rank r already receives segment s of the current head group: bit s x P + r.
  const std::size_t bits = static_cast<std::size_t>(model.num_segments()) * static_cast<std::size_t>(P);
  std::vector<std::uint64_t> seen((bits + 63) / 64);
  for (int g = 0; g < G; ++g) {
    std::fill(seen.begin(), seen.end(), 0);
    for (TaskId c = 0; c < cells; ++c) {
      const TaskId t = c * G + g;
      const Rank r = rank[static_cast<std::size_t>(t)];
      const Rank qh = grid.q_host(t), kh = grid.k_host(t);
      Seconds& x = sec[static_cast<std::size_t>(r)];
      const double load = static_cast<double>(model.load(t)) * to.load_s;
      x.compute += load;
      if (qh == r && kh == r) x.local += load;
      for (RowKind d : {RowKind::qo, RowKind::kv}) {
        const Rank h = d == RowKind::qo ? qh : kh;
        if (h == r) continue;
        const Price& pr = model.price(d);
        const double byte_s = to.byte_s[to.link_class(h, r)];
        Seconds& y = sec[static_cast<std::size_t>(h)];
        const int unit = model.unit_of(t);
        for (std::int32_t s : d == RowKind::qo ? model.qo_segments(unit) : model.kv_segments(unit)) {
          const std::size_t bit = static_cast<std::size_t>(s) * static_cast<std::size_t>(P) + static_cast<std::size_t>(r);
          std::uint64_t& w = seen[bit / 64];
          const std::uint64_t m = std::uint64_t{1} << (bit % 64);
          if ((w & m) != 0) continue;
          w |= m;
          const double len = static_cast<double>(model.segment(s).tokens.size()) * byte_s;
          y.cast_out += len * pr.out;
          x.cast_in += len * pr.out;
          x.red_out += len * pr.back;
          y.red_in += len * pr.back;
        }
      }
    }
  }
  double worst = 0;
  for (const Seconds& x : sec)
    worst = std::max(worst, std::max(x.local, std::max(x.cast_in, x.cast_out)) + (x.compute - x.local) +
                                std::max(x.red_in, x.red_out));
  return worst;
}

}  // namespace cpsched::search
