// The sampling procedure is part of the results users compare, so it is fixed
// here step by step and must not change silently:
//
//   engine  = std::mt19937_64(seed)
//   cap     = max(1, S / 4)                 (longest piece)
//   stream  = concatenation of rounds; round r:
//     1. draw documents until the round holds >= kRoundPacks * S tokens; one
//        draw: u = uniform_below(total count), the bin is the first whose
//        cumulative count exceeds u, the length is the bin's midpoint;
//     2. cut each document into pieces of `cap` tokens (the last one shorter);
//     3. shuffle the round's pieces with Fisher-Yates, i from n-1 down to 1
//        swapping i with uniform_below(i + 1);
//   pack k  = stream tokens [k*S, (k+1)*S); a piece that straddles a pack
//             boundary is split, its tail opening the next pack.
//
// Rounds hold many packs so that the pieces of one long document are scattered
// over several packs instead of staying neighbours.
#include "mask/doc_packing.hpp"

#include <algorithm>
#include <string>

#include "cpsched/base/error.hpp"

namespace cpsched::detail {

namespace {
constexpr Token kRoundPacks = 16;
}

std::uint64_t uniform_below(std::mt19937_64& engine, std::uint64_t n) {
  // Values below 2^64 mod n would make the low residues more likely.
  const std::uint64_t threshold = (0 - n) % n;
  for (;;) {
    const std::uint64_t x = engine();
    if (x >= threshold) return x % n;
  }
}

namespace {

class PieceStream {
 public:
  PieceStream(const DocHistogram& hist, Token seqlen, std::uint64_t seed)
      : hist_(hist), seqlen_(seqlen), cap_(std::max<Token>(1, seqlen / 4)), engine_(seed) {
    for (const auto& b : hist_.bins) total_ += static_cast<std::uint64_t>(b.count);
  }

  // The next round of shuffled pieces.
  std::vector<Token> next_round() {
    std::vector<Token> pieces;
    Token held = 0;
    while (held < kRoundPacks * seqlen_) {
      Token len = draw_document();
      held += len;
      for (; len > cap_; len -= cap_) pieces.push_back(cap_);
      pieces.push_back(len);
    }
    for (std::size_t i = pieces.size(); i-- > 1;) {
      const auto j = static_cast<std::size_t>(uniform_below(engine_, i + 1));
      std::swap(pieces[i], pieces[j]);
    }
    return pieces;
  }

 private:
  Token draw_document() {
    std::uint64_t u = uniform_below(engine_, total_);
    for (const auto& b : hist_.bins) {
      const auto c = static_cast<std::uint64_t>(b.count);
      if (u < c) return b.representative();
      u -= c;
    }
    throw Error("internal error: histogram sampling ran past the last bin");
  }

  const DocHistogram& hist_;
  Token seqlen_;
  Token cap_;
  std::mt19937_64 engine_;
  std::uint64_t total_ = 0;
};

}  // namespace

std::vector<Token> histogram_pack(const DocHistogram& hist, Token seqlen, std::uint64_t seed, int pack) {
  if (seqlen < 1) throw Error("histogram packing needs a sequence of at least 1 token, got " + std::to_string(seqlen));
  if (pack < 0) throw Error("pack index must be >= 0, got " + std::to_string(pack));
  PieceStream stream(hist, seqlen, seed);
  const Token first = static_cast<Token>(pack) * seqlen;  // stream position of the pack
  const Token last = first + seqlen;
  std::vector<Token> lengths;
  Token pos = 0;
  while (pos < last) {
    for (Token piece : stream.next_round()) {
      const Token b = std::max(pos, first);
      const Token e = std::min(pos + piece, last);
      if (e > b) lengths.push_back(e - b);
      pos += piece;
      if (pos >= last) break;
    }
  }
  return lengths;
}

}  // namespace cpsched::detail
