#include "routing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace cpsched::sim {

void Faults::add(std::string msg) {
  if (shown_.size() < kShown) shown_.push_back(std::move(msg));
  ++total_;
}

std::vector<Token> output_offsets(const GroupCollectiveArg& a) {
  std::vector<Token> off(a.output_split_sizes.size() + 1, 0);
  for (std::size_t j = 0; j < a.output_split_sizes.size(); ++j) off[j + 1] = off[j] + a.output_split_sizes[j];
  return off;
}

namespace {

// False (with a fault) when the arg's arrays disagree in length or content.
bool arg_consistent(const GroupCollectiveArg& a, const StageComm& sc, RowKind kind, const HeadLayout& heads,
                    Token local_rows, int P, const std::string& where, bool fwd, Faults& faults) {
  const std::size_t ni = a.input_split_sizes.size(), no = a.output_split_sizes.size();
  if (a.input_ranges.size() != ni || a.input_groups.size() != ni || a.dst_indices.size() != ni) {
    faults.add(fmt::format("{}: input arrays differ in length (sizes {}, ranges {}, groups {}, dst {})", where, ni,
                           a.input_ranges.size(), a.input_groups.size(), a.dst_indices.size()));
    return false;
  }
  if (a.src_index.size() != no || a.output_groups.size() != no) {
    faults.add(fmt::format("{}: output arrays differ in length (sizes {}, src {}, groups {})", where, no,
                           a.src_index.size(), a.output_groups.size()));
    return false;
  }
  bool ok = true;
  for (std::size_t i = 0; i < ni; ++i) {
    const Range r = a.input_ranges[i];
    if (r.size() != a.input_split_sizes[i] || r.begin < 0 || r.end > local_rows || r.end < r.begin) {
      faults.add(fmt::format("{}: input split {} range [{}, {}) does not fit size {} in a {} of {} rows", where, i,
                             r.begin, r.end, a.input_split_sizes[i],
                             fwd ? "first-phase receive buffer" : "local buffer", local_rows));
      ok = false;
    }
    if (!heads.valid_group(a.input_groups[i])) {
      faults.add(fmt::format("{}: input split {} has invalid head group {}", where, i, a.input_groups[i]));
      ok = false;
    }
    for (Rank d : a.dst_indices[i])
      if (d < 0 || d >= P) {
        faults.add(fmt::format("{}: input split {} names rank {} (P = {})", where, i, d, P));
        ok = false;
      }
  }
  Token total = 0;
  for (std::size_t j = 0; j < no; ++j) {
    if (a.output_split_sizes[j] < 0 || a.src_index[j] < 0 || a.src_index[j] >= P ||
        !heads.valid_group(a.output_groups[j])) {
      faults.add(fmt::format("{}: output split {} is invalid (size {}, src {}, group {})", where, j,
                             a.output_split_sizes[j], a.src_index[j], a.output_groups[j]));
      ok = false;
    }
    total += a.output_split_sizes[j];
  }
  if (fwd) return ok;  // the first phase checks the declared count of both
  total += first_phase_tokens(forwarding(sc, kind));
  const Token declared = kind == RowKind::qo ? sc.num_remote_qo_tokens : sc.num_remote_kv_tokens;
  if (declared != total) {
    faults.add(fmt::format("{}: num_remote_{}_tokens is {} but the output splits hold {}", where,
                           kind == RowKind::qo ? "qo" : "kv", declared, total));
    ok = false;
  }
  return ok;
}

}  // namespace

std::vector<Route> match_routes(const Plan& plan, Pass pass, int stage, RowKind kind, const HeadLayout& heads,
                                const std::vector<Token>& local_rows, Faults& faults, bool fwd) {
  const int P = static_cast<int>(plan.ranks.size());
  std::vector<const GroupCollectiveArg*> args(static_cast<std::size_t>(P), nullptr);
  for (int r = 0; r < P; ++r) {
    const auto& stages = pass_plan(plan.ranks[static_cast<std::size_t>(r)], pass).comm.stages;
    const std::string where = fmt::format("{} stage {} {}{} of rank {}", to_string(pass), stage, to_string(kind),
                                          fwd ? " forwarding" : "", r);
    if (static_cast<int>(stages.size()) < stage) {
      faults.add(where + ": the rank's CommMeta has only " + std::to_string(stages.size()) + " stages");
      continue;
    }
    const StageComm& sc = stages[static_cast<std::size_t>(stage - 1)];
    const GroupCollectiveArg& a = fwd ? forwarding(sc, kind) : collective(sc, kind);
    const Token rows = fwd ? first_phase_tokens(collective(sc, kind)) : local_rows[static_cast<std::size_t>(r)];
    if (arg_consistent(a, sc, kind, heads, rows, P, where, fwd, faults))
      args[static_cast<std::size_t>(r)] = &a;
  }

  // sends[p]: (dst, input split) in the sender's order; recvs[d]: (src, output split).
  std::vector<std::vector<std::pair<Rank, int>>> sends(static_cast<std::size_t>(P)), recvs(sends.size());
  for (int r = 0; r < P; ++r) {
    const GroupCollectiveArg* a = args[static_cast<std::size_t>(r)];
    if (a == nullptr) continue;
    for (std::size_t i = 0; i < a->dst_indices.size(); ++i)
      for (Rank d : a->dst_indices[i]) {
        if (d == r)
          faults.add(fmt::format("{} stage {} {}{}: rank {} input split {} names itself as a destination",
                                 to_string(pass), stage, to_string(kind), fwd ? " forwarding" : "", r, i));
        else
          sends[static_cast<std::size_t>(r)].emplace_back(d, static_cast<int>(i));
      }
    for (std::size_t j = 0; j < a->src_index.size(); ++j)
      recvs[static_cast<std::size_t>(r)].emplace_back(a->src_index[j], static_cast<int>(j));
    // Stable: keeps each side's order within one peer.
    std::stable_sort(sends[static_cast<std::size_t>(r)].begin(), sends[static_cast<std::size_t>(r)].end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    std::stable_sort(recvs[static_cast<std::size_t>(r)].begin(), recvs[static_cast<std::size_t>(r)].end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
  }

  std::vector<Route> routes;
  auto peer_slice = [](const std::vector<std::pair<Rank, int>>& v, Rank peer) {
    auto lo = std::lower_bound(v.begin(), v.end(), peer, [](const auto& x, Rank p) { return x.first < p; });
    auto hi = std::upper_bound(lo, v.end(), peer, [](Rank p, const auto& x) { return p < x.first; });
    return std::make_pair(lo, hi);
  };
  for (int p = 0; p < P; ++p) {
    const auto& s = sends[static_cast<std::size_t>(p)];
    for (auto it = s.begin(); it != s.end();) {
      const Rank d = it->first;
      auto end = std::find_if(it, s.end(), [d](const auto& x) { return x.first != d; });
      const auto [rlo, rhi] = peer_slice(recvs[static_cast<std::size_t>(d)], p);
      const auto n_send = end - it, n_recv = rhi - rlo;
      const std::string pair = fmt::format("{} stage {} {}{} from rank {} to rank {}", to_string(pass), stage,
                                           to_string(kind), fwd ? " forwarding" : "", p, d);
      if (args[static_cast<std::size_t>(d)] != nullptr && n_send != n_recv)
        faults.add(fmt::format("{}: sender has {} splits for it, receiver expects {}", pair, n_send, n_recv));
      auto r = rlo;
      for (auto x = it; x != end && r != rhi; ++x, ++r) {
        const GroupCollectiveArg& a = *args[static_cast<std::size_t>(p)];
        const GroupCollectiveArg& b = *args[static_cast<std::size_t>(d)];
        const std::size_t i = static_cast<std::size_t>(x->second), j = static_cast<std::size_t>(r->second);
        if (a.input_split_sizes[i] != b.output_split_sizes[j] || a.input_groups[i] != b.output_groups[j]) {
          faults.add(fmt::format("{}: input split {} ({} tokens, group {}) meets output split {} ({} tokens, group {})",
                                 pair, i, a.input_split_sizes[i], a.input_groups[i], j, b.output_split_sizes[j],
                                 b.output_groups[j]));
          continue;
        }
        routes.push_back({p, x->second, d, r->second});
      }
      it = end;
    }
  }
  // Receivers expecting splits from a sender that sends them nothing.
  for (int d = 0; d < P; ++d) {
    const auto& rv = recvs[static_cast<std::size_t>(d)];
    for (auto it = rv.begin(); it != rv.end();) {
      const Rank p = it->first;
      auto end = std::find_if(it, rv.end(), [p](const auto& x) { return x.first != p; });
      if (p >= 0 && p < P && args[static_cast<std::size_t>(p)] != nullptr) {
        const auto [slo, shi] = peer_slice(sends[static_cast<std::size_t>(p)], d);
        if (slo == shi)
          faults.add(fmt::format("{} stage {} {} from rank {} to rank {}: receiver expects {} splits, sender sends none",
                                 to_string(pass), stage, to_string(kind), p, d, end - it));
      }
      it = end;
    }
  }
  std::sort(routes.begin(), routes.end(), [](const Route& x, const Route& y) {
    return std::tie(x.src, x.in, x.dst) < std::tie(y.src, y.in, y.dst);
  });
  return routes;
}

}  // namespace cpsched::sim
