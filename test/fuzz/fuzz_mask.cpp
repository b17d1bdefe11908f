// Fuzz target: mask validation and the mask generators.
//
// The first byte picks the mode:
//  * even: a RangeMask from fuzzed slices (ranges may be empty, inverted or
//    out of [0, S)). validate() must accept or throw cpsched::Error; when it
//    accepts, no entry may belong to two slices, and area() and every slice's
//    clipped area and needed rows / cols must match a brute-force count
//    (S <= 48, so the counts stay cheap).
//  * odd: a generator spec (kind, document lengths, window, fractions, block
//    size, histogram, seed, pack) for a sequence of at most 4096 tokens.
//    make_mask must return a mask that validates, or throw cpsched::Error.
#include <cstdint>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/mask.hpp"
#include "cpsched/mask/generators.hpp"
#include "fuzz_input.hpp"

using namespace cpsched;

namespace {

void check_slices(fuzz::Bytes& in) {
  const Token S = in.range(1, 48);
  const auto n = static_cast<int>(in.range(0, 12));
  std::vector<Slice> slices;
  for (int i = 0; i < n; ++i) {
    Slice s;
    s.q = {in.range(-2, S + 2), in.range(-2, S + 2)};
    s.k = {in.range(-2, S + 2), in.range(-2, S + 2)};
    s.type = static_cast<MaskType>(in.range(0, 3));
    slices.push_back(s);
  }
  RangeMask mask;
  try {
    mask = RangeMask(S, slices);
    mask.validate();
  } catch (const Error&) {
    return;
  }
  Token total = 0;
  for (Token q = 0; q < S; ++q)
    for (Token k = 0; k < S; ++k) {
      int owners = 0;
      for (const Slice& s : mask.slices()) owners += slice_contains(s, q, k) ? 1 : 0;
      if (owners > 1) fuzz::broken();  // validate() let an overlap through
      total += owners;
    }
  if (mask.area() != total) fuzz::broken();
  // One clipping rectangle per slice, from the remaining bytes.
  for (const Slice& s : mask.slices()) {
    const Range qr{in.range(0, S), in.range(0, S)}, kr{in.range(0, S), in.range(0, S)};
    Token area = 0, r0 = -1, r1 = -1, c0 = -1, c1 = -1;
    for (Token q = qr.begin; q < qr.end; ++q)
      for (Token k = kr.begin; k < kr.end; ++k)
        if (slice_contains(s, q, k)) {
          ++area;
          r0 = r0 < 0 ? q : std::min(r0, q);
          r1 = std::max(r1, q + 1);
          c0 = c0 < 0 ? k : std::min(c0, k);
          c1 = std::max(c1, k + 1);
        }
    if (slice_area(s, qr, kr) != area) fuzz::broken();
    if (area > 0) {
      const Range rows = slice_needed_rows(s, qr, kr), cols = slice_needed_cols(s, qr, kr);
      if (rows.begin != r0 || rows.end != r1 || cols.begin != c0 || cols.end != c1) fuzz::broken();
    }
  }
}

void check_generator(fuzz::Bytes& in) {
  const Token S = in.range(1, 4096);
  MaskSpec spec;
  spec.kind = static_cast<MaskKind>(in.range(0, 8));
  const auto docs = in.range(0, 6);
  for (std::int64_t i = 0; i < docs; ++i) spec.lengths.push_back(in.range(-1, S));
  if (in.u8() % 4 == 0) {
    const auto bins = in.range(0, 3);
    for (std::int64_t i = 0; i < bins; ++i) {
      DocHistogram::Bin b;
      b.lo = in.range(-1, 2 * S);
      b.hi = in.range(-1, 2 * S);
      b.count = in.range(-1, 50);
      spec.histogram.bins.push_back(b);
    }
  }
  spec.seed = in.u64();
  spec.pack = static_cast<int>(in.range(-1, 3));
  spec.window_left = in.range(-1, S + 1);
  spec.window_right = in.range(-1, S + 1);
  spec.prefix_fraction = static_cast<double>(in.range(-100, 1100)) / 1000.0;
  spec.question_fraction = static_cast<double>(in.range(-100, 1100)) / 1000.0;
  spec.num_answers = static_cast<int>(in.range(-1, 9));
  spec.block_size = in.range(-1, S + 1);
  const auto n = in.range(0, 6);
  for (std::int64_t i = 0; i < n; ++i) {
    Slice s;
    s.q = {in.range(-1, S + 1), in.range(-1, S + 1)};
    s.k = {in.range(-1, S + 1), in.range(-1, S + 1)};
    s.type = static_cast<MaskType>(in.range(0, 3));
    spec.slices.push_back(s);
  }
  RangeMask mask;
  try {
    mask = make_mask(spec, S);
  } catch (const Error&) {
    return;
  }
  if (mask.seqlen() != S) fuzz::broken();
  try {
    mask.validate();
  } catch (const Error&) {
    fuzz::broken();  // make_mask returned a mask that does not validate
  }
  if (mask.area() > S * S) fuzz::broken();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Bytes in(data, size);
  if (in.u8() % 2 == 0) {
    check_slices(in);
  } else {
    check_generator(in);
  }
  return 0;
}
