#include "cpsched/base/memory_budget.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <fmt/format.h>

#include "cpsched/base/error.hpp"

namespace cpsched {

std::int64_t validator_chunk_bytes(std::int64_t budget_bytes) {
  constexpr std::int64_t lo = std::int64_t{4} << 20, hi = std::int64_t{256} << 20;
  if (budget_bytes <= 0) return hi;
  return std::clamp(budget_bytes / 10, lo, hi);
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

MemoryBudget configured_memory_budget() {
  {
    const std::lock_guard<std::mutex> lock(g_budget_mutex);
    if (g_budget.bytes > 0) return g_budget;
  }
  if (const char* env = std::getenv("CPSCHED_MEMORY_BUDGET"); env != nullptr && *env != '\0')
    return {parse_memory_size(env, "CPSCHED_MEMORY_BUDGET"), "CPSCHED_MEMORY_BUDGET"};
  return {0, "unlimited"};
}

MemoryBudget default_memory_budget() {
  if (MemoryBudget b = configured_memory_budget(); b.bytes > 0) return b;
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

}  // namespace cpsched
