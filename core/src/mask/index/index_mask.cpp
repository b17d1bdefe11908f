// Index masks (index_mask.hpp): the arrays, their validation and areas.
// Validation is one multi-threaded pass over the entries; every error names
// the array's source and the first offending entry by its multi-index, the
// same entry whatever the thread count.
#include "cpsched/mask/index/index_mask.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <thread>

#include "cpsched/base/error.hpp"
#include "cpsched/base/parallel_for.hpp"
#include "mask/index/internal.hpp"

namespace cpsched {

namespace index_detail {

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  // Read once: std::thread::hardware_concurrency reads /sys on every call,
  // and every plan build asks (collect_transfers).
  static const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return hw;
}

void run_threads(int n, const std::function<void(int)>& fn) {
  parallel_for(static_cast<std::size_t>(std::max(n, 0)), n, [&](std::size_t t) { fn(static_cast<int>(t)); });
}

std::string shape_string(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string source_of(const IndexArray& a, const char* name) {
  return a.source.empty() ? fmt::format("<{}>", name) : a.source;
}

void FirstError::rethrow() const {
  const std::pair<std::int64_t, std::string>* best = nullptr;
  for (const auto& f : found)
    if (f.first != std::numeric_limits<std::int64_t>::max() && (!best || f.first < best->first)) best = &f;
  if (best) throw Error(best->second);
}

void check_array_data(const IndexArray& a, const char* name) {
  for (std::int64_t d : a.shape)
    if (d < 0) throw Error(fmt::format("{}: {} shape {} has a negative dimension", source_of(a, name), name, shape_string(a.shape)));
  if (a.size() > 0 && a.data == nullptr) throw Error(fmt::format("{}: {} has shape {} but no data", source_of(a, name), name, shape_string(a.shape)));
}

namespace {

std::string index_string(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::int64_t n = shape[d] > 0 ? shape[d] : 1;
    idx[d] = flat % n;
    flat /= n;
  }
  return shape_string(idx);
}

// One indptr array of a bsr mask: rank, size, rows start at 0 and never
// decrease. Returns the total nnz over heads.
std::int64_t check_indptr(const IndexMask& m, const IndexArray& p, const char* name) {
  const std::string src = source_of(p, name);
  const std::int64_t w = m.num_query_blocks() + 1;
  const bool one_d_ok = m.kv_heads == 1;
  const bool ok = (p.shape.size() == 2 && p.shape[0] == m.kv_heads && p.shape[1] == w) ||
                  (one_d_ok && p.shape.size() == 1 && p.shape[0] == w);
  if (!ok)
    throw Error(fmt::format("{}: {} shape {} does not match S = {}, block_q = {} and kv_heads = {} (expected [{}, {}]{})",
                            src, name, shape_string(p.shape), m.seqlen, m.block_q, m.kv_heads, m.kv_heads, w,
                            one_d_ok ? fmt::format(" or [{}]", w) : std::string()));
  check_array_data(p, name);
  auto at = [&](std::int64_t h, std::int64_t x) { return p.data[(p.shape.size() == 1 ? 0 : h * w) + x]; };
  auto where = [&](std::int64_t h, std::int64_t x) {
    return p.shape.size() == 1 ? fmt::format("{}[{}]", name, x) : fmt::format("{}[{}, {}]", name, h, x);
  };
  std::int64_t total = 0;
  for (std::int64_t h = 0; h < m.kv_heads; ++h) {
    if (at(h, 0) != 0)
      throw Error(fmt::format("{}: {} = {}, expected 0 (each head's row starts at 0)", src, where(h, 0), at(h, 0)));
    for (std::int64_t x = 1; x < w; ++x)
      if (at(h, x) < at(h, x - 1))
        throw Error(fmt::format("{}: {} = {} is less than {} = {} (an indptr row must not decrease)", src, where(h, x),
                                at(h, x), where(h, x - 1), at(h, x - 1)));
    total += at(h, w - 1);
  }
  return total;
}

void check_bsr_indices(const IndexArray& a, const char* name, std::int64_t nnz, const char* indptr_name) {
  const std::string src = source_of(a, name);
  if (a.shape.size() != 1 || a.shape[0] != nnz)
    throw Error(fmt::format("{}: {} shape {} does not match the {} nnz of {} (expected [{}])", src, name,
                            shape_string(a.shape), nnz, indptr_name, nnz));
  check_array_data(a, name);
}

}  // namespace

void check_structure(const IndexMask& m) {
  if (m.seqlen < 1 || m.seqlen > std::numeric_limits<std::int32_t>::max())
    throw Error(fmt::format("index mask: S = {} must be in [1, 2147483647]", m.seqlen));
  if (m.kv_heads < 1) throw Error(fmt::format("index mask: kv_heads = {} must be >= 1", m.kv_heads));
  if (m.kind != IndexMaskKind::topk && (m.block_q < 1 || m.block_k < 1))
    throw Error(fmt::format("index mask: block size [{}, {}] must be >= 1", m.block_q, m.block_k));
  const IndexArray& ix = m.indices;
  const std::string src = source_of(ix, "indices");
  switch (m.kind) {
    case IndexMaskKind::topk: {
      if (ix.shape.size() != 3)
        throw Error(fmt::format("{}: shape {} has {} dimensions (expected [S, H_kv, k] = [{}, {}, k])", src,
                                shape_string(ix.shape), ix.shape.size(), m.seqlen, m.kv_heads));
      if (ix.shape[0] != m.seqlen)
        throw Error(fmt::format("{}: shape {} does not match S = {} (expected [{}, H_kv, k])", src,
                                shape_string(ix.shape), m.seqlen, m.seqlen));
      if (ix.shape[1] != m.kv_heads)
        throw Error(fmt::format("{}: shape {} does not match kv_heads = {} (expected [{}, {}, k])", src,
                                shape_string(ix.shape), m.kv_heads, m.seqlen, m.kv_heads));
      check_array_data(ix, "indices");
      break;
    }
    case IndexMaskKind::block_topk: {
      const Token nqb = m.num_query_blocks();
      if (ix.shape.size() != 3)
        throw Error(fmt::format("{}: shape {} has {} dimensions (expected [H_kv, ceil(S / block_q), n] = [{}, {}, n])",
                                src, shape_string(ix.shape), ix.shape.size(), m.kv_heads, nqb));
      if (ix.shape[1] != nqb)
        throw Error(fmt::format("{}: shape {} does not match S = {} and block_q = {} (expected [H_kv, {}, n])", src,
                                shape_string(ix.shape), m.seqlen, m.block_q, nqb));
      if (ix.shape[0] != m.kv_heads)
        throw Error(fmt::format("{}: shape {} does not match kv_heads = {} (expected [{}, {}, n])", src,
                                shape_string(ix.shape), m.kv_heads, m.kv_heads, nqb));
      check_array_data(ix, "indices");
      break;
    }
    case IndexMaskKind::bsr: {
      if (m.indptr.empty() && m.indptr.shape.empty()) throw Error(fmt::format("{}: a bsr mask needs indptr", src));
      check_bsr_indices(ix, "indices", check_indptr(m, m.indptr, "indptr"), "indptr");
      const bool fp = !m.full_indptr.shape.empty(), fi = !m.full_indices.shape.empty();
      if (fp != fi)
        throw Error(fmt::format("{}: full_indptr and full_indices come together (got only {})",
                                fp ? source_of(m.full_indptr, "full_indptr") : source_of(m.full_indices, "full_indices"),
                                fp ? "full_indptr" : "full_indices"));
      if (fp) check_bsr_indices(m.full_indices, "full_indices", check_indptr(m, m.full_indptr, "full_indptr"), "full_indptr");
      break;
    }
    default:
      throw Error(fmt::format("index mask: unknown kind {}", static_cast<int>(m.kind)));
  }
}

std::string topk_entry_error(const IndexMask& m, std::int64_t i, std::int64_t h, std::int64_t j, std::int64_t row0) {
  const std::int64_t k = m.indices.shape[2];
  const std::int32_t* row = m.indices.data + ((i - row0) * m.kv_heads + h) * k;
  const std::int64_t v = row[j];
  const std::string at =
      row0 == 0 ? fmt::format("{}: indices[{}, {}, {}] = {}", source_of(m.indices, "indices"), i, h, j, v)
                : fmt::format("{}: indices[{}, {}, {}] = {} (query token {})", source_of(m.indices, "indices"),
                              i - row0, h, j, v, i);
  if (v < 0 || v >= m.seqlen) return fmt::format("{} is outside [0, {})", at, m.seqlen);
  if (m.causal && v > i) return fmt::format("{} selects a key after query {} (causal: true)", at, i);
  std::int64_t j0 = 0;
  while (j0 < j && row[j0] != v) ++j0;
  return fmt::format("{} selects key {} twice in row [{}, {}] (also indices[{}, {}, {}])", at, v, i - row0, h, i - row0,
                     h, j0);
}

void validate_topk_entries(const IndexMask& m, int threads) {
  const std::int64_t S = m.seqlen, H = m.kv_heads, k = m.indices.shape[2];
  if (k == 0) return;
  const int T = static_cast<int>(std::min<std::int64_t>(resolve_threads(threads), S));
  FirstError fe(T);
  run_threads(T, [&](int t) {
    const std::int64_t r0 = S * t / T, r1 = S * (t + 1) / T;
    Bits seen;
    seen.resize(S);
    for (std::int64_t i = r0; i < r1; ++i) {
      if (fe.before(i * H * k)) return;
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int32_t* row = m.indices.data + (i * H + h) * k;
        bool increasing = true;
        const std::int64_t bad = scan_topk_row<false>(row, k, i, S, m.causal, seen, [](std::int64_t) {}, increasing);
        if (bad >= 0) {
          fe.report(t, (i * H + h) * k + bad, topk_entry_error(m, i, h, bad));
          return;
        }
      }
    }
  });
  fe.rethrow();
}

BlockRows::BlockRows(const IndexMask& mask) : m(mask) {
  if (m.kind != IndexMaskKind::bsr) return;
  const std::int64_t nqb = m.num_query_blocks();
  base.assign(static_cast<std::size_t>(m.kv_heads), 0);
  for (std::int64_t h = 1; h < m.kv_heads; ++h)
    base[static_cast<std::size_t>(h)] = base[static_cast<std::size_t>(h - 1)] + indptr_at(m.indptr, h - 1, nqb);
  if (!m.full_indptr.shape.empty()) {
    full_base.assign(static_cast<std::size_t>(m.kv_heads), 0);
    for (std::int64_t h = 1; h < m.kv_heads; ++h)
      full_base[static_cast<std::size_t>(h)] =
          full_base[static_cast<std::size_t>(h - 1)] + indptr_at(m.full_indptr, h - 1, nqb);
  }
}

std::pair<std::int64_t, std::int64_t> BlockRows::partial(std::int64_t h, std::int64_t qb) const {
  if (m.kind == IndexMaskKind::block_topk) {
    const std::int64_t n = m.indices.shape[2];
    const std::int64_t a = (h * m.num_query_blocks() + qb) * n;
    return {a, a + n};
  }
  const std::int64_t b = base[static_cast<std::size_t>(h)];
  return {b + indptr_at(m.indptr, h, qb), b + indptr_at(m.indptr, h, qb + 1)};
}

std::pair<std::int64_t, std::int64_t> BlockRows::full(std::int64_t h, std::int64_t qb) const {
  if (full_base.empty()) return {0, 0};
  const std::int64_t b = full_base[static_cast<std::size_t>(h)];
  return {b + indptr_at(m.full_indptr, h, qb), b + indptr_at(m.full_indptr, h, qb + 1)};
}

namespace {

// "src: indices[h, qb, j] = v" (block_topk) or "src: indices[p] = v (head h,
// query block qb)" (bsr).
std::string block_entry_at(const IndexMask& m, const IndexArray& a, const char* name, std::int64_t p, std::int64_t h,
                           std::int64_t qb) {
  if (m.kind == IndexMaskKind::block_topk) {
    const std::int64_t n = a.shape[2];
    return fmt::format("{}: {}[{}, {}, {}] = {}", source_of(a, name), name, h, qb, p % n, a.data[p]);
  }
  return fmt::format("{}: {}[{}] = {} (head {}, query block {})", source_of(a, name), name, p, a.data[p], h, qb);
}

std::string block_pos_name(const IndexMask& m, const IndexArray& a, const char* name, std::int64_t p, std::int64_t h,
                           std::int64_t qb) {
  if (m.kind == IndexMaskKind::block_topk) return fmt::format("{}[{}, {}, {}]", name, h, qb, p % a.shape[2]);
  return fmt::format("{}[{}]", name, p);
}

// Range and causality of block entry v of query block qb; empty when fine.
std::string block_entry_problem(const IndexMask& m, std::int64_t v, std::int64_t qb, std::int64_t nkb) {
  if (v < 0 || v >= nkb) return fmt::format(" is outside [0, {})", nkb);
  if (m.causal) {
    const Range q = index_detail::query_block(m, qb), k = index_detail::key_block(m, v);
    if (k.begin > q.end - 1)
      return fmt::format(" selects key block {} (keys [{}, {})) after query block {} (queries [{}, {})) (causal: true)",
                         v, k.begin, k.end, qb, q.begin, q.end);
  }
  return {};
}

}  // namespace

void validate_block_entries(const IndexMask& m, int threads) {
  const BlockRows rows(m);
  const std::int64_t R = rows.rows(), nqb = m.num_query_blocks(), nkb = num_key_blocks(m);
  const int T = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(resolve_threads(threads), R)));
  const bool padded = m.kind == IndexMaskKind::block_topk;
  // Phase 0: the partial (or only) lists; phase 1: the full lists against them.
  for (int phase = 0; phase < (rows.full_base.empty() ? 1 : 2); ++phase) {
    FirstError fe(T);
    const IndexArray& arr = phase == 0 ? m.indices : m.full_indices;
    const char* name = phase == 0 ? "indices" : "full_indices";
    run_threads(T, [&](int t) {
      Bits seen;
      seen.resize(nkb);
      for (std::int64_t r = R * t / T; r < R * (t + 1) / T; ++r) {
        const std::int64_t h = r / nqb, qb = r % nqb;
        const auto [pa, pb] = rows.partial(h, qb);
        const auto [a, b] = phase == 0 ? std::pair{pa, pb} : rows.full(h, qb);
        if (fe.before(a)) return;
        if (phase == 1)
          for (std::int64_t p = pa; p < pb; ++p) seen.set(m.indices.data[p]);
        for (std::int64_t p = a; p < b; ++p) {
          const std::int64_t v = arr.data[p];
          if (padded && v == -1) continue;
          std::string problem = block_entry_problem(m, v, qb, nkb);
          if (problem.empty() && seen.test_set(v)) {
            // Which earlier entry selected it: the partial list, or this list.
            std::int64_t q0 = -1;
            for (std::int64_t x = a; x < p && q0 < 0; ++x)
              if (arr.data[x] == v) q0 = x;
            if (q0 >= 0)
              problem = fmt::format(" selects key block {} twice (also {})", v, block_pos_name(m, arr, name, q0, h, qb));
            else
              for (std::int64_t x = pa; x < pb; ++x)
                if (m.indices.data[x] == v) {
                  problem = fmt::format(" is also in the partial list (indices[{}]); a block is partial or full, not both", x);
                  break;
                }
          }
          if (!problem.empty()) {
            fe.report(t, p, block_entry_at(m, arr, name, p, h, qb) + problem);
            return;
          }
        }
        for (std::int64_t p = a; p < b; ++p)
          if (arr.data[p] >= 0) seen.clear(arr.data[p]);
        if (phase == 1)
          for (std::int64_t p = pa; p < pb; ++p) seen.clear(m.indices.data[p]);
      }
    });
    fe.rethrow();
  }
}

}  // namespace index_detail

using namespace index_detail;

std::string_view to_string(IndexMaskKind k) {
  switch (k) {
    case IndexMaskKind::topk: return "topk";
    case IndexMaskKind::block_topk: return "block_topk";
    case IndexMaskKind::bsr: return "bsr";
  }
  return "unknown";
}

std::int64_t IndexArray::size() const {
  if (shape.empty()) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

namespace {

std::int64_t checked_count(const std::vector<std::int64_t>& shape, std::size_t have, const std::string& source) {
  std::int64_t n = shape.empty() ? 0 : 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw Error(fmt::format("{}: shape {} has a negative dimension", source, shape_string(shape)));
    if (d > 0 && n > std::numeric_limits<std::int64_t>::max() / d)
      throw Error(fmt::format("{}: shape {} is too large", source, shape_string(shape)));
    n *= d;
  }
  if (static_cast<std::uint64_t>(n) != have)
    throw Error(fmt::format("{}: {} values do not fill shape {} ({} values)", source, have, shape_string(shape), n));
  return n;
}

}  // namespace

IndexArray IndexArray::view(std::span<const std::int32_t> data, std::vector<std::int64_t> shape, std::string source) {
  checked_count(shape, data.size(), source);
  IndexArray a;
  a.data = data.data();
  a.shape = std::move(shape);
  a.source = std::move(source);
  return a;
}

IndexArray IndexArray::own(std::shared_ptr<const std::vector<std::int32_t>> data, std::vector<std::int64_t> shape,
                           std::string source) {
  checked_count(shape, data->size(), source);
  IndexArray a;
  a.data = data->data();
  a.owner = std::move(data);
  a.shape = std::move(shape);
  a.source = std::move(source);
  return a;
}

IndexArray IndexArray::copy(std::span<const std::int32_t> data, std::vector<std::int64_t> shape, std::string source) {
  checked_count(shape, data.size(), source);
  auto buf = std::make_shared<std::vector<std::int32_t>>(data.begin(), data.end());
  return own(std::move(buf), std::move(shape), std::move(source));
}

IndexArray IndexArray::copy(std::span<const std::int64_t> data, std::vector<std::int64_t> shape, std::string source) {
  checked_count(shape, data.size(), source);
  auto buf = std::make_shared<std::vector<std::int32_t>>(data.size());
  for (std::size_t p = 0; p < data.size(); ++p) {
    const std::int64_t v = data[p];
    if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
      throw Error(fmt::format("{}: entry {} (flat position {}) = {} does not fit int32", source,
                              index_string(static_cast<std::int64_t>(p), shape), p, v));
    (*buf)[p] = static_cast<std::int32_t>(v);
  }
  return own(std::move(buf), std::move(shape), std::move(source));
}

void IndexMask::validate(int threads) const {
  check_structure(*this);
  if (kind == IndexMaskKind::topk)
    validate_topk_entries(*this, threads);
  else
    validate_block_entries(*this, threads);
}

__int128 IndexMask::area(int h) const {
  check_structure(*this);
  const int T = resolve_threads(0);
  std::vector<__int128> part(static_cast<std::size_t>(T), 0);
  const std::int64_t h0 = h < 0 ? 0 : h, h1 = h < 0 ? kv_heads : std::min<std::int64_t>(h + 1, kv_heads);
  if (kind == IndexMaskKind::topk) {
    // Counts the entries a valid mask selects (in range, causal when asked).
    const std::int64_t k = indices.shape[2];
    run_threads(T, [&](int t) {
      std::int64_t n = 0;
      for (std::int64_t i = seqlen * t / T; i < seqlen * (t + 1) / T; ++i) {
        const std::int64_t hi = causal ? i + 1 : seqlen;
        for (std::int64_t hh = h0; hh < h1; ++hh) {
          const std::int32_t* row = indices.data + (i * kv_heads + hh) * k;
          for (std::int64_t j = 0; j < k; ++j) n += static_cast<std::uint64_t>(std::int64_t{row[j]}) < static_cast<std::uint64_t>(hi);
        }
      }
      part[static_cast<std::size_t>(t)] = n;
    });
  } else {
    const BlockRows rows(*this);
    const std::int64_t nqb = num_query_blocks(), nkb = num_key_blocks(*this);
    run_threads(T, [&](int t) {
      __int128 n = 0;
      const std::int64_t R = (h1 - h0) * nqb;
      for (std::int64_t r = R * t / T; r < R * (t + 1) / T; ++r) {
        const std::int64_t hh = h0 + r / nqb, qb = r % nqb;
        const Range q = query_block(*this, qb);
        auto add = [&](const IndexArray& arr, std::pair<std::int64_t, std::int64_t> span) {
          for (std::int64_t p = span.first; p < span.second; ++p) {
            const std::int64_t v = arr.data[p];
            if (v < 0 || v >= nkb) continue;
            const Range kr = key_block(*this, v);
            n += causal ? causal_pairs(q, kr) : q.size() * kr.size();
          }
        };
        add(indices, rows.partial(hh, qb));
        if (!rows.full_base.empty()) add(full_indices, rows.full(hh, qb));
      }
      part[static_cast<std::size_t>(t)] = n;
    });
  }
  __int128 total = 0;
  for (__int128 x : part) total += x;
  return total;
}

}  // namespace cpsched
