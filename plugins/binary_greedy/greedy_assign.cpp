#include "greedy_assign.hpp"

#include <limits>

#include "instance.hpp"

namespace cpsched::bg {

template <int W>
void assign_greedy(const Instance& in, const std::vector<Word>& masks, const std::vector<std::int32_t>& order,
                   const std::vector<std::uint16_t>& degree, std::vector<Rank>& rank, std::vector<double>& load) {
  using M = RankMask<W>;
  const std::size_t kv0 = static_cast<std::size_t>(in.num_chunks) * W;
  const double mean = in.mean;
  rank.resize(in.num_tasks());
  load.assign(static_cast<std::size_t>(in.P), 0.0);
  Word m[W];
  for (const std::int32_t ti : order) {
    const auto t = static_cast<std::size_t>(ti);
    Rank r = in.qhost[t];
    if (in.local[t] == 0) {
      M::and_of(m, masks.data() + static_cast<std::size_t>(in.qchunk[t]) * W,
                masks.data() + kv0 + static_cast<std::size_t>(in.kchunk[t]) * W);
      const Rank u = in.usp[t];
      if (M::test(m, u) && load[static_cast<std::size_t>(u)] < mean) {
        r = u;
      } else if (!(M::test(m, r) && load[static_cast<std::size_t>(r)] < mean)) {
        r = argmin_load<W>(m, degree[t], load.data(), in.P, 0.0, std::numeric_limits<double>::infinity());
      }
    }
    rank[t] = r;
    load[static_cast<std::size_t>(r)] += in.compute[t];
  }
}

template void assign_greedy<1>(const Instance&, const std::vector<Word>&, const std::vector<std::int32_t>&,
                               const std::vector<std::uint16_t>&, std::vector<Rank>&, std::vector<double>&);
template void assign_greedy<2>(const Instance&, const std::vector<Word>&, const std::vector<std::int32_t>&,
                               const std::vector<std::uint16_t>&, std::vector<Rank>&, std::vector<double>&);
template void assign_greedy<4>(const Instance&, const std::vector<Word>&, const std::vector<std::int32_t>&,
                               const std::vector<std::uint16_t>&, std::vector<Rank>&, std::vector<double>&);
template void assign_greedy<8>(const Instance&, const std::vector<Word>&, const std::vector<std::int32_t>&,
                               const std::vector<std::uint16_t>&, std::vector<Rank>&, std::vector<double>&);
template void assign_greedy<16>(const Instance&, const std::vector<Word>&, const std::vector<std::int32_t>&,
                                const std::vector<std::uint16_t>&, std::vector<Rank>&, std::vector<double>&);

}  // namespace cpsched::bg
