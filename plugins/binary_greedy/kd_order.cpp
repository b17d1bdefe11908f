#include "kd_order.hpp"

#include <algorithm>
#include <bit>
#include <string>

#include <cpsched/base/error.hpp>

#include "sort_keys.hpp"
#include "thread_pool.hpp"

namespace cpsched::bg {

namespace {

// Spreads the low 32 bits of x to the even bit positions of the result.
std::uint64_t spread(std::uint64_t x) {
  x &= 0xffffffffULL;
  x = (x | (x << 16)) & 0x0000ffff0000ffffULL;
  x = (x | (x << 8)) & 0x00ff00ff00ff00ffULL;
  x = (x | (x << 4)) & 0x0f0f0f0f0f0f0f0fULL;
  x = (x | (x << 2)) & 0x3333333333333333ULL;
  x = (x | (x << 1)) & 0x5555555555555555ULL;
  return x;
}

}  // namespace

std::vector<KdKeys::Path> KdKeys::paths(int n) {
  std::vector<Path> out(static_cast<std::size_t>(std::max(n, 0)));
  for (int x = 0; x < n; ++x) {
    Path p;
    int start = 0, size = n;
    while (size > 1) {
      const int mid = size / 2;
      const bool right = x >= start + mid;
      p.bits = (p.bits << 1) | (right ? 1U : 0U);
      ++p.len;
      if (right) {
        start += mid;
        size -= mid;
      } else {
        size = mid;
      }
    }
    out[static_cast<std::size_t>(x)] = p;
  }
  return out;
}

KdKeys::KdKeys(int m, int n) : q_(paths(m)), k_(paths(n)) {
  auto deepest = [](const std::vector<Path>& ps) {
    int d = 0;
    for (const Path& p : ps) d = std::max(d, p.len);
    return d;
  };
  // 64 bits hold grids of up to 2^32 chunks a side.
  if (deepest(q_) + deepest(k_) > 64) throw Error("binary_greedy: grid of " + std::to_string(m) + " x " + std::to_string(n) +
                              " chunks is too large for the task order key");
}

std::uint64_t KdKeys::key(int qc, int kc) const {
  // Both dimensions split alternately (q first) while both have more than one
  // chunk left; then the longer path continues alone.
  const Path& a = q_[static_cast<std::size_t>(qc)];
  const Path& b = k_[static_cast<std::size_t>(kc)];
  const int common = std::min(a.len, b.len);
  const std::uint64_t qtop = a.len > common ? a.bits >> (a.len - common) : a.bits;
  const std::uint64_t ktop = b.len > common ? b.bits >> (b.len - common) : b.bits;
  std::uint64_t bits = (spread(qtop) << 1) | spread(ktop);
  const Path& longer = a.len > common ? a : b;
  const int tail = longer.len - common;
  bits = (bits << tail) | (longer.bits & ((std::uint64_t{1} << tail) - 1));
  const int len = a.len + b.len;
  return len == 0 ? 0 : bits << (64 - len);  // left-aligned: compare as bit strings
}

void published_task_order_generic(const std::vector<Cell>& cells, int G, int nb, const std::vector<double>& compute,
                                  ThreadPool& pool, std::vector<std::int32_t>& out) {
  struct Entry {
    KeyPair key;
    std::int32_t task;
  };
  const std::size_t T = cells.size() * static_cast<std::size_t>(G);
  const KdKeys keys(G * nb, G * nb);
  std::vector<Entry> e(T);
  pool.parallel_for(cells.size(), 1024, [&](int, std::size_t c0, std::size_t c1) {
    for (std::size_t c = c0; c < c1; ++c)
      for (int g = 0; g < G; ++g) {
        const std::size_t t = c * static_cast<std::size_t>(G) + static_cast<std::size_t>(g);
        e[t] = {{descending_key(compute[t]), keys.key(g * nb + cells[c].qblock, g * nb + cells[c].kblock)},
                static_cast<std::int32_t>(t)};
      }
  });
  // Keys are unique per task, so the order is total and any sort gives it.
  std::sort(e.begin(), e.end(), [](const Entry& x, const Entry& y) { return x.key < y.key; });
  out.resize(T);
  for (std::size_t i = 0; i < T; ++i) out[i] = e[i].task;
}

void published_task_order(const std::vector<Cell>& cells, int G, int nb, const std::vector<double>& compute,
                          ThreadPool& pool, std::vector<std::int32_t>& out) {
  // Shortcut: with G a power of two the recursion's first splits fall on group
  // boundaries (q and k alike), so the order is group-major and, inside every
  // group, the kd order of the (nb x nb) cell grid. If moreover the G tasks of
  // a cell share one compute value, the order is: cells by (compute desc, cell
  // key), and each run of equal compute emitted group by group.
  const std::size_t C = cells.size();
  const auto Gs = static_cast<std::size_t>(G);
  bool shortcut = std::has_single_bit(static_cast<unsigned>(G));
  for (std::size_t c = 0; shortcut && c < C; ++c)
    for (std::size_t g = 1; g < Gs; ++g) shortcut = shortcut && compute[c * Gs + g] == compute[c * Gs];
  if (!shortcut) {
    published_task_order_generic(cells, G, nb, compute, pool, out);
    return;
  }
  struct Entry {
    KeyPair key;
    std::int32_t cell;
  };
  const KdKeys keys(nb, nb);
  std::vector<Entry> e(C);
  for (std::size_t c = 0; c < C; ++c)
    e[c] = {{descending_key(compute[c * Gs]), keys.key(cells[c].qblock, cells[c].kblock)},
            static_cast<std::int32_t>(c)};
  std::sort(e.begin(), e.end(), [](const Entry& x, const Entry& y) { return x.key < y.key; });
  out.resize(C * Gs);
  std::size_t n = 0;
  for (std::size_t r0 = 0; r0 < C;) {
    std::size_t r1 = r0 + 1;
    while (r1 < C && e[r1].key.a == e[r0].key.a) ++r1;
    for (std::size_t g = 0; g < Gs; ++g)
      for (std::size_t i = r0; i < r1; ++i)
        out[n++] = static_cast<std::int32_t>(static_cast<std::size_t>(e[i].cell) * Gs + g);
    r0 = r1;
  }
}

}  // namespace cpsched::bg
