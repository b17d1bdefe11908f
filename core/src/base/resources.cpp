#include "cpsched/base/resources.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <fmt/format.h>

#include "cpsched/plan/plan.hpp"
#include "cpsched/problem/task_grid.hpp"

namespace cpsched {

namespace {

// Bytes per item of the structures the estimate counts, with the allocator's
// overhead of each heap block (about 32 bytes).
constexpr std::int64_t kHeapBlock = 32;
// A cell: the struct, its three vectors' blocks, its dense/sparse index slot
// and the two row/col builders used while the grid is built.
constexpr std::int64_t kCellBytes = sizeof(Cell) + 3 * kHeapBlock + 64 + 2 * (24 + kHeapBlock);
// A (slice, cell) pair: the piece, its needed rows and cols (final and while building).
constexpr std::int64_t kTouchBytes = sizeof(Slice) + 4 * sizeof(Range);
// Per task: the assignment, a solver's per-task arrays (binary_greedy and
// balanced_bytes keep a few), the builder's task indices and its transfers.
constexpr std::int64_t kTaskBytes = 4 + 64 + 12 + 2 * (56 + sizeof(Range));
// Per task and pass: the comm splits on both sides of its transfers.
constexpr std::int64_t kTaskCommBytes = 2 * 72;
// A tight attention arg (a clipped piece gives up to three).
constexpr std::int64_t kArgBytes = sizeof(AttnArg);
// A transferred range, per pass: its comm split on the sender (size, range,
// group, dst list) and the receiver (size, source, group), and the range
// itself in its transfer. Each (piece, group) adds at most one range of rows
// and one of cols.
constexpr std::int64_t kRangeBytes = 8 + 16 + 4 + 24 + kHeapBlock + 8 + 4 + 4 + 2 * sizeof(Range);

std::int64_t sat(__int128 v) {
  return v > std::numeric_limits<std::int64_t>::max() ? std::numeric_limits<std::int64_t>::max()
                                                       : static_cast<std::int64_t>(v);
}

}  // namespace

std::int64_t ResourceEstimate::total_bytes(bool sim_numeric) const {
  return sat(__int128{grid_bytes} + plan_bytes + (sim_numeric ? sim_numeric_bytes : 0));
}

ResourceEstimate estimate_resources(const Problem& p) { return estimate_resources(p, p.sharding); }

ResourceEstimate estimate_resources(const Problem& p, const Sharding& sh) {
  ResourceEstimate e;
  const auto& blocks = sh.blocks;
  const std::int64_t nb = sh.num_blocks();
  e.blocks = nb;
  // Cells each slice touches, as the grid builds them: a full slice touches
  // every (q block, k block) of its rectangle; a diagonal one is walked by
  // q block (the grid walks it the same way).
  __int128 touches = 0, args = 0;  // args: tight attention args per head group (a full piece clips to 1, others to <= 3)
  for (const Slice& s : p.mask.slices()) {
    const __int128 before = touches;
    const int qb0 = sh.block_of(s.q.begin), qb1 = sh.block_of(s.q.end - 1);
    if (qb0 < 0 || qb1 < 0) continue;
    if (s.type == MaskType::full) {
      const int kb0 = sh.block_of(s.k.begin), kb1 = sh.block_of(s.k.end - 1);
      if (kb0 < 0 || kb1 < 0) continue;
      touches += __int128{qb1 - qb0 + 1} * (kb1 - kb0 + 1);
      args += touches - before;
      continue;
    }
    for (int qb = qb0; qb <= qb1; ++qb) {
      const Range need = slice_needed_cols(s, blocks[static_cast<std::size_t>(qb)], s.k);
      if (need.empty()) continue;
      touches += sh.block_of(need.end - 1) - sh.block_of(need.begin) + 1;
    }
    args += 3 * (touches - before);
  }
  const __int128 cells = std::min<__int128>(touches, __int128{nb} * nb);
  const __int128 G = p.num_groups();
  const __int128 tasks = cells * G;
  e.touches = sat(touches);
  e.cells = sat(cells);
  e.tasks = sat(tasks);
  e.grid_bytes = sat(cells * kCellBytes + touches * kTouchBytes + __int128{nb} * (sizeof(Range) + sizeof(Rank)));
  // Plan: per task the assignment, transfers and comm; per head group the
  // tight args of every piece and its transferred ranges, in each of the two
  // passes (an upper bound: local pieces move nothing).
  e.plan_bytes =
      sat(tasks * (kTaskBytes + 2 * kTaskCommBytes) + args * G * kArgBytes * 2 + touches * G * 2 * kRangeBytes * 2);
  // sim numeric: fp32 Q, O, dO, dQ and their reference (hq), K, V, dK, dV,
  // their reference and the ranks' copies (hkv), and lse (3 x hq).
  // d_qk rows (Q, dQ, K, dK) and d_v rows (O, dO, V, dV; none for V when shared).
  const __int128 S = p.seqlen(), dqk = p.heads.dqk(), dv = p.heads.dv(), hq = p.heads.q, hkv = p.heads.kv;
  const __int128 dkv = dqk + (p.heads.kv_shared ? 0 : dv);
  e.sim_numeric_bytes = sat(4 * S * (hq * (3 * dqk + 3 * dv) + 4 * hkv * dkv + 3 * hq));
  return e;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

std::int64_t parse_memory_size(std::string_view text, std::string_view what) {
  std::string t(text);
  auto bad = [&] {
    return Error(fmt::format("{}: '{}' is not a memory size; expected bytes or a number with K, M, G or T "
                             "(powers of 1024), e.g. 16G",
                             what, text));
  };
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (!t.empty() && (t.back() == 'B' || t.back() == 'b')) t.pop_back();  // "16GB", "512MiB"
  if (t.size() >= 2 && (t.back() == 'i' || t.back() == 'I')) t.pop_back();
  double scale = 1;
  if (!t.empty() && std::isalpha(static_cast<unsigned char>(t.back()))) {
    const std::string_view units = "KMGT";
    const auto u = units.find(static_cast<char>(std::toupper(static_cast<unsigned char>(t.back()))));
    if (u == std::string_view::npos) throw bad();
    scale = std::pow(1024.0, static_cast<double>(u + 1));
    t.pop_back();
  }
  if (t.empty()) throw bad();
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v) || v <= 0) throw bad();
  const double bytes = v * scale;
  if (bytes >= 9.2e18) throw bad();
  return static_cast<std::int64_t>(bytes);
}

namespace {
std::mutex g_budget_mutex;
MemoryBudget g_budget;  // bytes 0: not set
}  // namespace

void set_memory_budget(std::int64_t bytes, std::string source) {
  const std::lock_guard<std::mutex> lock(g_budget_mutex);
  g_budget = bytes > 0 ? MemoryBudget{bytes, std::move(source)} : MemoryBudget{};
}

MemoryBudget memory_budget_or_default(std::int64_t configured, std::string source) {
  return configured > 0 ? MemoryBudget{configured, std::move(source)} : default_memory_budget();
}

MemoryBudget default_memory_budget() {
  {
    const std::lock_guard<std::mutex> lock(g_budget_mutex);
    if (g_budget.bytes > 0) return g_budget;
  }
  if (const char* env = std::getenv("CPSCHED_MEMORY_BUDGET"); env != nullptr && *env != '\0')
    return {parse_memory_size(env, "CPSCHED_MEMORY_BUDGET"), "CPSCHED_MEMORY_BUDGET"};
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return {kb * 1024, "MemAvailable of /proc/meminfo"};
  }
  return {0, "unlimited"};
}

void check_resources(const Problem& p, const ResourceEstimate& e, const MemoryBudget& budget, bool sim_numeric) {
  if (budget.bytes <= 0) return;
  const std::int64_t need = e.total_bytes(sim_numeric);
  if (need <= budget.bytes) return;
  const bool by_blocks = p.grid.blocks_per_rank > 1;
  const std::string key = by_blocks ? "grid.blocks_per_rank" : "cp_size";
  std::string parts = fmt::format("grid {} ({} cells, {} slice pieces), plan {} ({} tasks = cells x {} head groups)",
                                  format_bytes(static_cast<double>(e.grid_bytes)), e.cells, e.touches,
                                  format_bytes(static_cast<double>(e.plan_bytes)), e.tasks, p.num_groups());
  if (sim_numeric) parts += fmt::format(", numeric simulation {}", format_bytes(static_cast<double>(e.sim_numeric_bytes)));
  const std::string change =
      by_blocks ? fmt::format("lower problem.grid.blocks_per_rank ({}) or problem.cp_size ({})", p.grid.blocks_per_rank,
                              p.cp_size())
                : fmt::format("lower problem.cp_size ({}) or problem.seqlen_per_rank", p.cp_size());
  throw LimitError(key, fmt::format("problem.{}: the estimated memory {} ({}) exceeds the memory budget {} ({}); {}, "
                                    "use a sparser mask{}, or raise the budget (memory_budget: <size, e.g. 64G> in the config, or "
                                    "CPSCHED_MEMORY_BUDGET=<size>)",
                                    key, format_bytes(static_cast<double>(need)), parts,
                                    format_bytes(static_cast<double>(budget.bytes)), budget.source, change,
                                    sim_numeric ? ", use the sim's mode: timing" : ""));
}

void check_resources(const Problem& p, bool sim_numeric) {
  const MemoryBudget b = default_memory_budget();
  if (b.bytes <= 0) return;
  check_resources(p, estimate_resources(p), b, sim_numeric);
}

}  // namespace cpsched
