// make_index_mask (mask_generators.hpp): index masks from .npy files (topk,
// block_topk, bsr) or generated (dsa, nsa; docs/masks.md).
//
// The generators draw every row from its own counter-based random stream,
// seeded by (seed, head, query), with integer-only arithmetic, so a seed
// gives the same indices on every platform and for any thread count.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <memory>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/io/npy_array.hpp"
#include "mask/index/internal.hpp"

namespace cpsched {

using namespace index_detail;

namespace {

// splitmix64 (Steele, Lea, Flood 2014): a fixed, portable stream.
struct RowRng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) by multiply-shift (bias < n / 2^64).
  std::uint64_t below(std::uint64_t n) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
  static RowRng of(std::uint64_t seed, std::uint64_t salt, std::uint64_t head, std::uint64_t row) {
    RowRng r{seed ^ salt};
    r.s = r.next() ^ (head * 0xD1B54A32D192ED03ull);
    r.s = r.next() ^ row;
    r.next();
    return r;
  }
};

// Appends r distinct values of [g0, g0 + g) (r <= g), ascending, each
// r-subset equally likely: Floyd's algorithm marks them in `seen` (bits over
// the value space), then a scan of the marked words emits them in order and
// leaves `seen` clear.
void sample_sorted(RowRng& rng, Token g0, Token g, Token r, Bits& seen, std::int32_t*& out) {
  if (r <= 0) return;
  for (Token j = g - r; j < g; ++j) {
    const Token t = static_cast<Token>(rng.below(static_cast<std::uint64_t>(j + 1)));
    if (seen.test_set(g0 + t)) seen.set(g0 + j);
  }
  for (Token w = g0 >> 6; w <= (g0 + g - 1) >> 6; ++w) {
    std::uint64_t x = seen.w[static_cast<std::size_t>(w)];
    seen.w[static_cast<std::size_t>(w)] = 0;
    while (x) {
      *out++ = static_cast<std::int32_t>(w * 64 + std::countr_zero(x));
      x &= x - 1;
    }
  }
}

std::vector<Token> doc_starts(const MaskSpec& spec, Token S) {
  std::vector<Token> starts;
  Token a = 0;
  for (Token n : document_lengths(spec, S)) starts.push_back(a), a += n;
  return starts;
}

Token doc_start_of(const std::vector<Token>& starts, Token i) {
  return *(std::upper_bound(starts.begin(), starts.end(), i) - 1);
}

std::shared_ptr<std::vector<std::int32_t>> allocate(const char* kind, Token S, std::int64_t heads, std::int64_t k) {
  const __int128 n = static_cast<__int128>(S) * heads * k;
  if (n > (static_cast<__int128>(1) << 36))
    throw Error(fmt::format("{}: S x kv_heads x {} = {} x {} x {} indices is over 2^36 ({} GiB of int32)", kind,
                            kind[0] == 'd' ? "topk" : "nsa_top", S, heads, k, static_cast<double>(n) * 4 / (1 << 30)));
  return std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(n));
}

IndexMask generate_dsa(const MaskSpec& spec, Token S) {
  if (spec.topk < 1) throw Error(fmt::format("dsa: topk must be >= 1, got {}", spec.topk));
  if (spec.sink < 0 || spec.local < 0)
    throw Error(fmt::format("dsa: sink and local must be >= 0, got {} and {}", spec.sink, spec.local));
  // A query can select at most the S keys that exist (fewer: the keys of its
  // document up to itself), so the rows are never wider than S: a larger
  // topk gives the same selection (every row takes all its keys).
  const std::int64_t H = spec.kv_heads > 0 ? spec.kv_heads : 1, k = std::min<std::int64_t>(spec.topk, S);
  const std::vector<Token> starts = doc_starts(spec, S);
  auto buf = allocate("dsa", S, H, k);
  const int T = static_cast<int>(std::min<Token>(resolve_threads(0), S));
  run_threads(T, [&](int t) {
    Bits seen;
    seen.resize(S);
    for (Token i = S * t / T; i < S * (t + 1) / T; ++i) {
      const Token a = doc_start_of(starts, i), m = i - a + 1;  // keys [a, i]
      for (std::int64_t h = 0; h < H; ++h) {
        std::int32_t* row = buf->data() + (i * H + h) * k;
        std::int32_t* out = row;
        if (m <= k) {
          for (Token x = a; x <= i; ++x) *out++ = static_cast<std::int32_t>(x);
        } else {
          const Token s = std::min(spec.sink, k), l = std::min(spec.local, k - s), r = k - s - l;
          for (Token x = a; x < a + s; ++x) *out++ = static_cast<std::int32_t>(x);
          RowRng rng = RowRng::of(spec.seed, 0xD5A, static_cast<std::uint64_t>(h), static_cast<std::uint64_t>(i));
          sample_sorted(rng, a + s, m - s - l, r, seen, out);
          for (Token x = i + 1 - l; x <= i; ++x) *out++ = static_cast<std::int32_t>(x);
        }
        std::fill(out, row + k, -1);
      }
    }
  });
  IndexMask mask;
  mask.kind = IndexMaskKind::topk;
  mask.seqlen = S;
  mask.kv_heads = static_cast<int>(H);
  mask.causal = true;
  mask.indices = IndexArray::own(std::move(buf), {S, H, k}, "<dsa>");
  return mask;
}

IndexMask generate_nsa(const MaskSpec& spec, Token S) {
  if (spec.nsa_block < 1) throw Error(fmt::format("nsa: nsa_block must be >= 1, got {}", spec.nsa_block));
  if (spec.nsa_top < 1) throw Error(fmt::format("nsa: nsa_top must be >= 1, got {}", spec.nsa_top));
  if (spec.nsa_initial < 0 || spec.nsa_local < 0)
    throw Error(fmt::format("nsa: nsa_initial and nsa_local must be >= 0, got {} and {}", spec.nsa_initial, spec.nsa_local));
  if (spec.nsa_block > std::numeric_limits<std::int32_t>::max())
    throw Error(fmt::format("nsa: nsa_block = {} is too large", spec.nsa_block));
  // At most the key blocks that exist (ceil(S / nsa_block)): a larger
  // nsa_top gives the same selection (every row takes all its blocks).
  const Token B = spec.nsa_block, nkb = (S + B - 1) / B;
  const std::int64_t H = spec.kv_heads > 0 ? spec.kv_heads : 1, n = std::min<std::int64_t>(spec.nsa_top, nkb);
  const std::vector<Token> starts = doc_starts(spec, S);
  auto buf = allocate("nsa", S, H, n);
  const int T = static_cast<int>(std::min<Token>(resolve_threads(0), S));
  run_threads(T, [&](int t) {
    Bits seen;
    seen.resize(nkb);
    for (Token i = S * t / T; i < S * (t + 1) / T; ++i) {
      // The global blocks from the one holding the document's start to the query's.
      const Token fb = doc_start_of(starts, i) / B, lb = i / B, m = lb - fb + 1;
      for (std::int64_t h = 0; h < H; ++h) {
        std::int32_t* row = buf->data() + (h * S + i) * n;
        std::int32_t* out = row;
        if (m <= n) {
          for (Token b = fb; b <= lb; ++b) *out++ = static_cast<std::int32_t>(b);
        } else {
          const Token s = std::min<Token>(spec.nsa_initial, n), l = std::min<Token>(spec.nsa_local, n - s), r = n - s - l;
          for (Token b = fb; b < fb + s; ++b) *out++ = static_cast<std::int32_t>(b);
          RowRng rng = RowRng::of(spec.seed, 0x25A, static_cast<std::uint64_t>(h), static_cast<std::uint64_t>(i));
          sample_sorted(rng, fb + s, m - s - l, r, seen, out);
          for (Token b = lb + 1 - l; b <= lb; ++b) *out++ = static_cast<std::int32_t>(b);
        }
        std::fill(out, row + n, -1);
      }
    }
  });
  IndexMask mask;
  mask.kind = IndexMaskKind::block_topk;
  mask.seqlen = S;
  mask.kv_heads = static_cast<int>(H);
  mask.causal = true;
  mask.block_q = 1;
  mask.block_k = static_cast<int>(B);
  mask.indices = IndexArray::own(std::move(buf), {H, S, n}, "<nsa>");
  return mask;
}

IndexArray load_required(const std::filesystem::path& p, const char* kind, const char* key) {
  if (p.empty()) throw Error(fmt::format("{}: needs the .npy file '{}'", kind, key));
  return load_index_npy(p);
}

// The selection heads: the spec's, else the file's (dimension `dim` of a
// rank-`rank` array, 1 otherwise).
int heads_of(const MaskSpec& spec, const IndexArray& a, std::size_t rank, std::size_t dim) {
  if (spec.kv_heads > 0) return spec.kv_heads;
  if (a.shape.size() == rank && a.shape[dim] >= 1 && a.shape[dim] <= std::numeric_limits<int>::max())
    return static_cast<int>(a.shape[dim]);
  return 1;
}

IndexMask load_files(const MaskSpec& spec, Token S) {
  IndexMask m;
  m.seqlen = S;
  m.causal = spec.causal;
  const char* kind = spec.kind == MaskKind::topk ? "topk" : spec.kind == MaskKind::block_topk ? "block_topk" : "bsr";
  if (spec.block_q < 0 || spec.block_k < 0)
    throw Error(fmt::format("{}: block_size [{}, {}] must be >= 1", kind, spec.block_q, spec.block_k));
  switch (spec.kind) {
    case MaskKind::topk:
      m.kind = IndexMaskKind::topk;
      m.indices = load_required(spec.indices_file, kind, "indices");
      m.kv_heads = heads_of(spec, m.indices, 3, 1);
      break;
    case MaskKind::block_topk:
      m.kind = IndexMaskKind::block_topk;
      m.block_q = spec.block_q > 0 ? spec.block_q : 1;
      m.block_k = spec.block_k > 0 ? spec.block_k : 64;
      m.indices = load_required(spec.indices_file, kind, "indices");
      m.kv_heads = heads_of(spec, m.indices, 3, 0);
      break;
    default:
      m.kind = IndexMaskKind::bsr;
      m.block_q = spec.block_q > 0 ? spec.block_q : 128;
      m.block_k = spec.block_k > 0 ? spec.block_k : 128;
      m.indptr = load_required(spec.indptr_file, kind, "indptr");
      m.indices = load_required(spec.indices_file, kind, "indices");
      if (spec.full_indptr_file.empty() != spec.full_indices_file.empty())
        throw Error("bsr: full_indptr and full_indices come together (got only " +
                    std::string(spec.full_indptr_file.empty() ? "full_indices" : "full_indptr") + ")");
      if (!spec.full_indptr_file.empty()) {
        m.full_indptr = load_index_npy(spec.full_indptr_file);
        m.full_indices = load_index_npy(spec.full_indices_file);
      }
      m.kv_heads = heads_of(spec, m.indptr, 2, 0);
      break;
  }
  return m;
}

}  // namespace

IndexMask make_index_mask(const MaskSpec& spec, Token seqlen) {
  if (!is_index_kind(spec.kind))
    throw Error("make_index_mask: kind " + std::string(to_string(spec.kind)) + " is a range mask; use make_mask");
  if (seqlen < 1 || seqlen > std::numeric_limits<std::int32_t>::max())
    throw Error(fmt::format("{}: S = {} must be in [1, 2147483647] for an index mask", to_string(spec.kind), seqlen));
  if (spec.kv_heads < 0) throw Error(fmt::format("{}: kv_heads must be >= 1, got {}", to_string(spec.kind), spec.kv_heads));
  IndexMask m;
  switch (spec.kind) {
    case MaskKind::dsa: m = generate_dsa(spec, seqlen); break;
    case MaskKind::nsa: m = generate_nsa(spec, seqlen); break;
    default: m = load_files(spec, seqlen); break;
  }
  m.validate();
  return m;
}

}  // namespace cpsched
