// Mask generators (docs/design.md#masks): document lengths from a spec, then one slice
// list per kind. Every kind emits slices that never overlap, so areas add up.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "mask/doc_packing.hpp"

namespace cpsched {

namespace {

// Range kinds first, then index kinds (is_index_kind).
constexpr std::array<std::pair<MaskKind, std::string_view>, 14> kKindNames{{
    {MaskKind::full, "full"},
    {MaskKind::causal, "causal"},
    {MaskKind::full_document, "full_document"},
    {MaskKind::causal_document, "causal_document"},
    {MaskKind::sliding_window, "sliding_window"},
    {MaskKind::prefix_lm, "prefix_lm"},
    {MaskKind::share_question, "share_question"},
    {MaskKind::block_causal_document, "block_causal_document"},
    {MaskKind::slices, "slices"},
    {MaskKind::topk, "topk"},
    {MaskKind::block_topk, "block_topk"},
    {MaskKind::bsr, "bsr"},
    {MaskKind::dsa, "dsa"},
    {MaskKind::nsa, "nsa"},
}};

class SliceList {
 public:
  // Adds rows [q0, q1) x cols [k0, k1) of the document starting at `base`;
  // empty pieces are dropped so callers can emit boundary cases blindly.
  void add(Token base, Token q0, Token q1, Token k0, Token k1, MaskType t) {
    if (q1 > q0 && k1 > k0) slices_.push_back(Slice{{base + q0, base + q1}, {base + k0, base + k1}, t});
  }
  std::vector<Slice> take() { return std::move(slices_); }

 private:
  std::vector<Slice> slices_;
};

// Token i sees [i - left, i + right] inside a document of n tokens. Rows are
// grouped by which edges of the window the document clips: at most three
// slices, one per group, so they cannot overlap.
void sliding_window_document(SliceList& out, Token a, Token n, Token left, Token right) {
  const Token L = std::min(left, n - 1);
  const Token R = std::min(right, n - 1);
  // Whole-document shapes first (a one-token document counts as causal).
  if (L == n - 1 && R == 0) return out.add(a, 0, n, 0, n, MaskType::causal);
  if (L == 0 && R == n - 1) return out.add(a, 0, n, 0, n, MaskType::inv_causal);
  if (L == n - 1 && R == n - 1) return out.add(a, 0, n, 0, n, MaskType::full);
  if (L + R <= n) {
    out.add(a, 0, L, 0, L + R, MaskType::causal);             // left edge clipped: j in [0, i+R]
    out.add(a, L, n - R, 0, n, MaskType::bi_causal);          // whole window: j in [i-L, i+R]
    out.add(a, n - R, n, n - R - L, n, MaskType::inv_causal); // right edge clipped: j in [i-L, n)
  } else {
    out.add(a, 0, n - R, 0, n, MaskType::causal);             // left edge clipped
    out.add(a, n - R, L, 0, n, MaskType::full);               // both edges clipped
    out.add(a, L, n, 0, n, MaskType::inv_causal);             // right edge clipped
  }
}

// Full prefix of p tokens; the rest is causal over the whole document
// (bottom-right aligned, so row a+p+i sees [a, a+p+i]).
void prefix_lm_document(SliceList& out, Token a, Token n, double fraction) {
  const Token p = std::clamp<Token>(std::llround(fraction * static_cast<double>(n)), 0, n);
  out.add(a, 0, p, 0, p, MaskType::full);
  out.add(a, p, n, 0, n, MaskType::causal);
}

// A causal question of q tokens, then `answers` answers of near-equal length
// (the first ones one token longer); each sees the whole question and itself.
void share_question_document(SliceList& out, Token a, Token n, double fraction, int answers) {
  const Token q = std::clamp<Token>(std::llround(fraction * static_cast<double>(n)), 0, n);
  out.add(a, 0, q, 0, q, MaskType::causal);
  const Token m = n - q;
  const Token base = m / answers;
  const Token extra = m % answers;
  Token s = q;
  for (int t = 0; t < answers; ++t) {
    const Token e = s + base + (t < extra ? 1 : 0);
    out.add(a, s, e, 0, q, MaskType::full);
    out.add(a, s, e, s, e, MaskType::causal);
    s = e;
  }
}

// Block b's rows see every earlier block of the document and itself, fully:
// one full slice per block covering [doc start, block end).
void block_causal_document(SliceList& out, Token a, Token n, Token block) {
  for (Token s = 0; s < n; s += block) out.add(a, s, std::min(n, s + block), 0, std::min(n, s + block), MaskType::full);
}

void check_spec(const MaskSpec& spec) {
  switch (spec.kind) {
    case MaskKind::sliding_window:
      if (spec.window_left < 0 || spec.window_right < 0)
        throw Error("sliding_window: window (left, right) must be >= 0, got (" + std::to_string(spec.window_left) +
                    ", " + std::to_string(spec.window_right) + ")");
      break;
    case MaskKind::prefix_lm:
      if (!(spec.prefix_fraction >= 0.0 && spec.prefix_fraction <= 1.0))
        throw Error("prefix_lm: prefix_fraction must be in [0, 1], got " + std::to_string(spec.prefix_fraction));
      break;
    case MaskKind::share_question:
      if (!(spec.question_fraction >= 0.0 && spec.question_fraction <= 1.0))
        throw Error("share_question: question_fraction must be in [0, 1], got " +
                    std::to_string(spec.question_fraction));
      if (spec.num_answers < 1)
        throw Error("share_question: num_answers must be >= 1, got " + std::to_string(spec.num_answers));
      break;
    case MaskKind::block_causal_document:
      if (spec.block_size < 1)
        throw Error("block_causal_document: block_size must be >= 1, got " + std::to_string(spec.block_size));
      break;
    default:
      break;
  }
}

}  // namespace

std::string_view to_string(MaskKind k) {
  for (const auto& [kind, name] : kKindNames)
    if (kind == k) return name;
  return "unknown";
}

bool parse_mask_kind(std::string_view s, MaskKind& out) {
  for (const auto& [kind, name] : kKindNames) {
    if (name == s) {
      out = kind;
      return true;
    }
  }
  return false;
}

bool is_index_kind(MaskKind k) {
  return k == MaskKind::topk || k == MaskKind::block_topk || k == MaskKind::bsr || k == MaskKind::dsa ||
         k == MaskKind::nsa;
}

std::vector<std::string> mask_kind_names() {
  std::vector<std::string> names;
  for (const auto& kv : kKindNames)
    if (!is_index_kind(kv.first)) names.emplace_back(kv.second);
  return names;
}

std::vector<std::string> index_mask_kind_names() {
  std::vector<std::string> names;
  for (const auto& kv : kKindNames)
    if (is_index_kind(kv.first)) names.emplace_back(kv.second);
  return names;
}

std::vector<Token> document_lengths(const MaskSpec& spec, Token seqlen) {
  if (seqlen < 1) throw Error("a mask needs a sequence of at least 1 token, got " + std::to_string(seqlen));
  if (!spec.lengths.empty()) {
    Token sum = 0;
    for (std::size_t i = 0; i < spec.lengths.size(); ++i) {
      if (spec.lengths[i] < 1)
        throw Error("document length " + std::to_string(i) + " must be >= 1, got " + std::to_string(spec.lengths[i]));
      sum += spec.lengths[i];
    }
    if (sum != seqlen)
      throw Error("document lengths add up to " + std::to_string(sum) + " tokens, but the sequence has " +
                  std::to_string(seqlen) + " tokens");
    return spec.lengths;
  }
  if (!spec.histogram.bins.empty()) {
    spec.histogram.validate();
    return detail::histogram_pack(spec.histogram, seqlen, spec.seed, spec.pack);
  }
  return {seqlen};
}

RangeMask make_mask(const MaskSpec& spec, Token seqlen) {
  if (seqlen < 1) throw Error("a mask needs a sequence of at least 1 token, got " + std::to_string(seqlen));
  if (is_index_kind(spec.kind))
    throw Error("make_mask: kind " + std::string(to_string(spec.kind)) + " is an index mask; use make_index_mask");
  check_spec(spec);
  SliceList out;
  auto per_document = [&](auto&& emit) {
    Token a = 0;
    for (Token n : document_lengths(spec, seqlen)) {
      emit(a, n);
      a += n;
    }
  };
  switch (spec.kind) {
    case MaskKind::full:
      out.add(0, 0, seqlen, 0, seqlen, MaskType::full);
      break;
    case MaskKind::causal:
      out.add(0, 0, seqlen, 0, seqlen, MaskType::causal);
      break;
    case MaskKind::full_document:
      per_document([&](Token a, Token n) { out.add(a, 0, n, 0, n, MaskType::full); });
      break;
    case MaskKind::causal_document:
      per_document([&](Token a, Token n) { out.add(a, 0, n, 0, n, MaskType::causal); });
      break;
    case MaskKind::sliding_window:
      per_document(
          [&](Token a, Token n) { sliding_window_document(out, a, n, spec.window_left, spec.window_right); });
      break;
    case MaskKind::prefix_lm:
      per_document([&](Token a, Token n) { prefix_lm_document(out, a, n, spec.prefix_fraction); });
      break;
    case MaskKind::share_question:
      per_document([&](Token a, Token n) {
        share_question_document(out, a, n, spec.question_fraction, spec.num_answers);
      });
      break;
    case MaskKind::block_causal_document:
      per_document([&](Token a, Token n) { block_causal_document(out, a, n, spec.block_size); });
      break;
    case MaskKind::slices: {
      if (spec.slices.empty()) throw Error("mask kind 'slices' needs at least one slice");
      RangeMask mask(seqlen, spec.slices);
      mask.validate();
      return mask;
    }
    case MaskKind::topk:
    case MaskKind::block_topk:
    case MaskKind::bsr:
    case MaskKind::dsa:
    case MaskKind::nsa:
      break;  // refused above
  }
  RangeMask mask(seqlen, out.take());
  mask.validate();
  return mask;
}

}  // namespace cpsched
