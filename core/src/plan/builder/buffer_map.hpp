#pragma once
// Where the global tokens of one block sit in a rank's buffer (plan.hpp's
// buffers): a single shift (the local shard), or the runs of a transfer's
// rows in the remote buffer. Shared by the range and the index args.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "plan/builder/internal.hpp"

namespace cpsched::plan_detail {

struct BufferMap {
  BufferId buf = BufferId::local;
  Token shift = 0;                    // local: buffer = global + shift
  const XferRun* first = nullptr;     // remote: the xfer's runs, sorted by token
  const XferRun* last = nullptr;

  struct Run {
    Range global;
    Token shift;
  };
  // The runs of r in the buffer; false when some token of r is not there.
  bool runs(Range r, std::vector<Run>& out) const {
    out.clear();
    if (first == nullptr) {
      out.push_back({r, shift});
      return true;
    }
    // Binary search for the first run that ends after r.begin: a piece
    // costs O(log runs + its runs), not O(runs) (one-token stripes give
    // transfers of thousands of ranges).
    auto it = std::upper_bound(first, last, r.begin, [](Token v, const XferRun& x) { return v < x.global.end; });
    Token covered = 0;
    for (; it != last && it->global.begin < r.end; ++it) {
      const Range y = it->global.intersect(r);
      if (!y.empty()) {
        out.push_back({y, it->off - it->global.begin});
        covered += y.size();
      }
    }
    return covered == r.size();
  }
  // Buffer row of global token t (which must be there).
  Token row_of(Token t) const {
    if (first == nullptr) return t + shift;
    auto it = std::upper_bound(first, last, t, [](Token v, const XferRun& x) { return v < x.global.end; });
    if (it == last || !it->global.contains(t))
      throw Error(fmt::format("plan builder (internal): key {} is not in the kv buffer", t));
    return t - it->global.begin + it->off;
  }
};

// The maps of one pass: a block read from the local shard (x < 0) or
// through transfer x.
struct BufferMaps {
  const Sharding& sh;
  const XferLayout& where;
  std::vector<Token> block_off = block_local_offsets(sh);

  BufferMap of(std::int32_t x, std::int32_t block) const {
    if (x < 0) {
      const auto b = static_cast<std::size_t>(block);
      return BufferMap{BufferId::local, block_off[b] - sh.blocks[b].begin, nullptr, nullptr};
    }
    const auto xi = static_cast<std::size_t>(x);
    const XferRun* base = where.runs.data();
    return BufferMap{BufferId::remote, 0, base + where.begin[xi], base + where.begin[xi + 1]};
  }
};

}  // namespace cpsched::plan_detail
