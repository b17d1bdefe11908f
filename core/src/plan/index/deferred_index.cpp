#include "cpsched/plan/deferred_index.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"

namespace cpsched {

namespace {

// Global token <-> row of one buffer, by runs sorted by row.
struct BufferRuns {
  std::vector<RemoteRun> runs;  // tokens, row, group

  Token global_of(Token row) const {
    auto it = std::upper_bound(runs.begin(), runs.end(), row, [](Token x, const RemoteRun& r) { return x < r.row; });
    if (it == runs.begin() || row >= (it - 1)->row + (it - 1)->tokens.size())
      throw Error(fmt::format("deferred index rows: buffer row {} holds no token", row));
    --it;
    return it->tokens.begin + (row - it->row);
  }
};

BufferRuns local_runs(const Sharding& sh, Rank rank) {
  BufferRuns b;
  Token row = 0;
  for (std::size_t i = 0; i < sh.blocks.size(); ++i)
    if (sh.host[i] == rank) {
      b.runs.push_back({sh.blocks[i], row, -1});
      row += sh.blocks[i].size();
    }
  return b;
}

// Global token -> row of a buffer for one head group: runs sorted by token.
class KeyRows {
 public:
  KeyRows(const std::vector<RemoteRun>& runs, int group) {
    for (const RemoteRun& r : runs)
      if (r.group < 0 || group < 0 || r.group == group) by_token_.push_back(r);
    std::sort(by_token_.begin(), by_token_.end(),
              [](const RemoteRun& a, const RemoteRun& b) { return a.tokens.begin < b.tokens.begin; });
  }
  // The row of token t, or -1.
  Token row_of(Token t) const {
    auto it = std::upper_bound(by_token_.begin(), by_token_.end(), t,
                               [](Token x, const RemoteRun& r) { return x < r.tokens.begin; });
    if (it == by_token_.begin()) return -1;
    --it;
    return it->tokens.contains(t) ? it->row + (t - it->tokens.begin) : -1;
  }

 private:
  std::vector<RemoteRun> by_token_;
};

}  // namespace

std::vector<std::int32_t> write_deferred_index_rows(const PassPlan& pass, const Sharding& sharding, Rank rank,
                                                    const TopkRows& own) {
  const CalcMeta& calc = pass.calc;
  std::vector<std::int32_t> pool(static_cast<std::size_t>(calc.deferred_index_entries), -1);
  if (own.indices.shape.size() != 3)
    throw Error("deferred index rows: the rank's rows must be [rows, kv_heads, k]");
  const std::int64_t H = own.indices.shape[1], k = own.indices.shape[2];
  const Range mine = own.rows();
  const BufferRuns local = local_runs(sharding, rank);
  const BufferRuns remote_q{pass.comm.remote_qo_rows};
  std::vector<std::int32_t> keys;
  auto write = [&](const AttnArg& a) {
    if (!a.is_index()) return;
    const int head = H > 1 ? a.group : 0;
    const BufferRuns& qb = a.q_buf == BufferId::local ? local : remote_q;
    const KeyRows kr(a.k_buf == BufferId::local ? local.runs : pass.comm.remote_kv_rows,
                     a.k_buf == BufferId::local ? -1 : a.group);
    const Token k0 = (a.k_buf == BufferId::local ? local : BufferRuns{pass.comm.remote_kv_rows}).global_of(a.k.begin);
    const int kb = sharding.block_of(k0);
    const Range kblock = sharding.blocks[static_cast<std::size_t>(kb)];
    if (a.index_offset < 0 || a.index_offset + a.q.size() * a.index_width > calc.deferred_index_entries)
      throw Error(fmt::format("deferred index rows: an arg's rows [{}, {}) x {} at {} are outside the pool of {}",
                              a.q.begin, a.q.end, a.index_width, a.index_offset, calc.deferred_index_entries));
    for (Token r = a.q.begin; r < a.q.end; ++r) {
      const Token q = qb.global_of(r);
      if (!mine.contains(q))
        throw Error(fmt::format("deferred index rows: query {} is not among the rank's rows [{}, {})", q, mine.begin,
                                mine.end));
      const std::int32_t* row = own.indices.data + ((q - mine.begin) * H + head) * k;
      keys.clear();
      for (std::int64_t j = 0; j < k; ++j)
        if (row[j] >= 0 && kblock.contains(row[j])) keys.push_back(row[j]);
      std::sort(keys.begin(), keys.end());
      if (static_cast<std::int64_t>(keys.size()) > a.index_width)
        throw Error(fmt::format("deferred index rows: query {} selects {} keys in [{}, {}), the plan's arg has room "
                                "for {} (rows other than the plan's)",
                                q, keys.size(), kblock.begin, kblock.end, a.index_width));
      std::int32_t* out = pool.data() + a.index_offset + (r - a.q.begin) * a.index_width;
      for (std::size_t j = 0; j < keys.size(); ++j) {
        const Token row_k = kr.row_of(keys[j]);
        if (row_k < 0)
          throw Error(fmt::format("deferred index rows: query {} selects key {}, which no row of its k buffer holds",
                                  q, keys[j]));
        out[j] = static_cast<std::int32_t>(row_k);
      }
    }
  };
  for (const AttnArg& a : calc.local_attn_args) write(a);
  for (const auto& stage : calc.remote_attn_args)
    for (const AttnArg& a : stage) write(a);
  return pool;
}

}  // namespace cpsched
