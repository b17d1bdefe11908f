// The ports' stage cut (plan/builder.hpp, "Stages", rule B).
#include <algorithm>
#include <cmath>

#include "plan/builder/internal.hpp"

namespace cpsched::plan_detail {

namespace {

// Each stage may fill a port up to kGrowth times the share of the stage
// before; the shares sum to 1 + kSlack of the busiest port's bytes, so a
// port loaded like the busiest one fills every stage and a lighter port
// sends all it can early. Fitted on the fixed layout's document masks
// (docs/bounds.md#the-fixed-layout).
constexpr double kGrowth = 1.5;
constexpr double kSlack = 0.1;

// Port index: rank, direction (out / in), link class (between / inside nodes).
std::size_t port_of(Rank r, bool out, bool intra) {
  return (static_cast<std::size_t>(r) * 2 + (out ? 0 : 1)) * 2 + (intra ? 1 : 0);
}

}  // namespace

std::vector<int> assign_stages_by_ports(const Transfers& tr, const SendOrder& order, int stages, const PortCosts& ports) {
  std::vector<int> stage(tr.xfers.size(), 1);
  if (stages <= 1 || tr.xfers.empty()) return stage;
  const std::size_t P = tr.dst_begin.size() - 1;
  auto bytes_of = [&](std::size_t i) {
    const Xfer& x = tr.xfers[i];
    return x.tokens * (x.kind == RowKind::qo ? order.qo_out : order.kv_out);
  };
  auto intra = [&](const Xfer& x) { return ports.node_size == 0 || x.host / ports.node_size == x.dst / ports.node_size; };
  auto load_of = [&](std::size_t i) {
    return static_cast<double>(bytes_of(i)) * (intra(tr.xfers[i]) ? ports.intra_cost : 1.0);
  };

  // Every port's load over the pass; the busiest sets the stages' room.
  std::vector<double> total(P * 4, 0.0);
  for (std::size_t i = 0; i < tr.xfers.size(); ++i) {
    const Xfer& x = tr.xfers[i];
    total[port_of(x.host, true, intra(x))] += load_of(i);
    total[port_of(x.dst, false, intra(x))] += load_of(i);
  }
  const double busiest = *std::max_element(total.begin(), total.end());
  std::vector<double> room(static_cast<std::size_t>(stages));
  double weights = 0;
  for (int s = 0; s < stages; ++s) weights += std::pow(kGrowth, s);
  for (int s = 0; s < stages; ++s)
    room[static_cast<std::size_t>(s)] = busiest * (1.0 + kSlack) * std::pow(kGrowth, s) / weights;

  // The receivers' send orders interleaved by the share of its receiver's
  // bytes sent before each transfer (exact, in 128-bit integers), ties by
  // receiver and then send order.
  struct Entry {
    Bytes before, total;
    std::size_t seq;  // position in order.seq
  };
  std::vector<Entry> entries;
  entries.reserve(tr.xfers.size());
  for (std::size_t d = 0; d < P; ++d) {
    const std::size_t x0 = tr.dst_begin[d], x1 = tr.dst_begin[d + 1];
    Bytes sum = 0;
    for (std::size_t i = x0; i < x1; ++i) sum += bytes_of(static_cast<std::size_t>(order.seq[i]));
    Bytes before = 0;
    for (std::size_t i = x0; i < x1; ++i) {
      entries.push_back({before, sum, i});
      before += bytes_of(static_cast<std::size_t>(order.seq[i]));
    }
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& l, const Entry& r) {
    return static_cast<__int128>(l.before) * r.total < static_cast<__int128>(r.before) * l.total;
  });

  // First fit: the first stage where both ports have room, else the last.
  std::vector<double> used(P * 4 * static_cast<std::size_t>(stages), 0.0);
  for (const Entry& e : entries) {
    const auto x = static_cast<std::size_t>(order.seq[e.seq]);
    const Xfer& xf = tr.xfers[x];
    const std::size_t out = port_of(xf.host, true, intra(xf)), in = port_of(xf.dst, false, intra(xf));
    const double load = load_of(x);
    int s = stages - 1;
    for (int k = 0; k < stages; ++k) {
      const std::size_t base = static_cast<std::size_t>(k) * P * 4;
      const double r = room[static_cast<std::size_t>(k)];
      if (used[base + out] + load <= r && used[base + in] + load <= r) {
        s = k;
        break;
      }
    }
    const std::size_t base = static_cast<std::size_t>(s) * P * 4;
    used[base + out] += load;
    used[base + in] += load;
    stage[x] = s + 1;
  }
  return stage;
}

}  // namespace cpsched::plan_detail
