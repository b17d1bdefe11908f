#include "refinement.hpp"

#include <algorithm>

#include "instance.hpp"

namespace cpsched::bg {

template <int W>
void refine(const Instance& in, const std::vector<Word>& masks, const std::vector<std::int32_t>& order,
            const std::vector<std::uint16_t>& degree, double max_load, int passes, std::vector<Rank>& rank, std::vector<double>& load) {
  using M = RankMask<W>;
  const std::size_t kv0 = static_cast<std::size_t>(in.num_chunks) * W;
  Word m[W];
  for (int pass = 0; pass < passes; ++pass) {
    // No rank at the limit: no task moves, in this pass or any later one.
    if (*std::max_element(load.begin(), load.end()) < max_load) return;
    bool moved = false;
    for (const std::int32_t ti : order) {
      const auto t = static_cast<std::size_t>(ti);
      const Rank cur = rank[t];
      const double cur_load = load[static_cast<std::size_t>(cur)];
      if (cur_load < max_load) continue;
      M::and_of(m, masks.data() + static_cast<std::size_t>(in.qchunk[t]) * W,
                masks.data() + kv0 + static_cast<std::size_t>(in.kchunk[t]) * W);
      const double c = in.compute[t];
      // The current rank never wins: its load + c is not below its load.
      m[cur >> 6] &= ~(Word{1} << (cur & 63));
      const Rank target = argmin_load<W>(m, degree[t] - 1, load.data(), in.P, c, cur_load);
      if (target >= 0) {
        load[static_cast<std::size_t>(cur)] -= c;
        load[static_cast<std::size_t>(target)] += c;
        rank[t] = target;
        moved = true;
      }
    }
    if (!moved) return;  // the same state again: later passes would not move either
  }
}

template void refine<1>(const Instance&, const std::vector<Word>&, const std::vector<std::int32_t>&,
                        const std::vector<std::uint16_t>&, double, int,
                        std::vector<Rank>&, std::vector<double>&);
template void refine<2>(const Instance&, const std::vector<Word>&, const std::vector<std::int32_t>&,
                        const std::vector<std::uint16_t>&, double, int,
                        std::vector<Rank>&, std::vector<double>&);
template void refine<4>(const Instance&, const std::vector<Word>&, const std::vector<std::int32_t>&,
                        const std::vector<std::uint16_t>&, double, int,
                        std::vector<Rank>&, std::vector<double>&);
template void refine<8>(const Instance&, const std::vector<Word>&, const std::vector<std::int32_t>&,
                        const std::vector<std::uint16_t>&, double, int,
                        std::vector<Rank>&, std::vector<double>&);
template void refine<16>(const Instance&, const std::vector<Word>&, const std::vector<std::int32_t>&,
                        const std::vector<std::uint16_t>&, double, int,
                         std::vector<Rank>&, std::vector<double>&);

}  // namespace cpsched::bg
