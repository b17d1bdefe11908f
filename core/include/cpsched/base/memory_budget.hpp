#pragma once
// The memory budget resource estimates are checked against: the process's
// setting (set_memory_budget: the config's `memory_budget:` key in the
// command-line tool, SessionOptions::memory_budget in the library), else
// CPSCHED_MEMORY_BUDGET (bytes, or with a K/M/G/T suffix: "16G"), else
// MemAvailable of /proc/meminfo, else unlimited. It is one setting per
// process, as the memory it guards. (The estimates: problem/resources.hpp.)
#include <cstdint>
#include <string>
#include <string_view>

namespace cpsched {

// The validator's working memory for index plans: it checks the selected
// pairs in chunks of query rows of at most this many bytes (a tenth of the
// budget, between 4 MiB and 256 MiB; 256 MiB when unlimited).
std::int64_t validator_chunk_bytes(std::int64_t budget_bytes);

struct MemoryBudget {
  std::int64_t bytes = 0;  // <= 0: unlimited
  std::string source;      // where it came from, for the error message
};
// The process's setting, else CPSCHED_MEMORY_BUDGET, else MemAvailable, else
// unlimited. Throws Error on a malformed CPSCHED_MEMORY_BUDGET.
MemoryBudget default_memory_budget();
// The process's setting, else CPSCHED_MEMORY_BUDGET, else unlimited (no
// /proc/meminfo read).
MemoryBudget configured_memory_budget();
// Estimates below this are not checked against MemAvailable (only against a
// budget the caller set): a solve that small fits wherever the planner runs.
inline constexpr std::int64_t kMemAvailableFloor = std::int64_t{256} << 20;
// Sets the process's budget (bytes > 0; `source` names where it came from in
// error messages); 0 clears it. Thread safe.
void set_memory_budget(std::int64_t bytes, std::string source);
// `configured` > 0: that budget (from `source`); else default_memory_budget().
MemoryBudget memory_budget_or_default(std::int64_t configured, std::string source);
// "1073741824", "512M", "16G", "1.5T" (powers of 1024) -> bytes; throws Error
// naming `what` and the text on anything else.
std::int64_t parse_memory_size(std::string_view text, std::string_view what = "memory size");

// "1.5 GiB"
std::string format_bytes(double bytes);

}  // namespace cpsched
