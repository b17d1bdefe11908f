#pragma once
// Mask generators shared by every front end (DESIGN §2). All deterministic
// given their seed.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cpsched/mask.hpp"

namespace cpsched {

// A document-length histogram: bins of token lengths with counts. A bin's
// representative length is its midpoint.
struct DocHistogram {
  struct Bin {
    Token lo = 0;   // inclusive
    Token hi = 0;   // inclusive
    std::int64_t count = 0;
    Token representative() const { return (lo + hi) / 2; }
  };
  std::vector<Bin> bins;

  // CSV with a header and rows `"[lo, hi]",count,...` (the format of
  // shared/data/doc_length_distribution.csv). Throws cpsched::Error naming
  // file and line.
  static DocHistogram load_csv(const std::filesystem::path& file);
  void validate() const;
};

enum class MaskKind {
  full, causal, full_document, causal_document, sliding_window, prefix_lm,
  share_question, block_causal_document, slices
};
std::string_view to_string(MaskKind k);
bool parse_mask_kind(std::string_view s, MaskKind& out);
std::vector<std::string> mask_kind_names();

struct MaskSpec {
  MaskKind kind = MaskKind::causal;
  // Documents: explicit lengths (must sum to S), else packs sampled from
  // `histogram`, else one document of S tokens.
  std::vector<Token> lengths;
  DocHistogram histogram;
  std::uint64_t seed = 42;
  int pack = 0;                  // which pack of the sampled stream
  // sliding_window: token i sees [i - window_left, i + window_right] inside its document.
  Token window_left = 1024;
  Token window_right = 0;
  // prefix_lm: the first prefix_fraction of each document is a full-attention prefix.
  double prefix_fraction = 0.5;
  // share_question: each document is a question (question_fraction of it)
  // followed by num_answers answers; answers see the question and themselves (causal).
  double question_fraction = 0.25;
  int num_answers = 4;
  // block_causal_document: full attention inside blocks of block_size tokens,
  // causal between blocks, inside each document.
  Token block_size = 512;
  std::vector<Slice> slices;     // kind slices
};

// Document lengths of a spec for a sequence of `seqlen` tokens (sum == seqlen).
// Histogram packs: documents longer than S/4 are cut into S/4 pieces; pieces
// are shuffled with the seed and packed into packs of exactly S tokens, the
// overflowing piece split and carried into the next pack. The sampling is a
// fixed procedure on std::mt19937_64(seed) (written out in
// core/src/doc_packing.cpp), so a (histogram, S, seed, pack) gives the same
// documents on every platform.
std::vector<Token> document_lengths(const MaskSpec& spec, Token seqlen);

// The range mask of the spec; validated.
RangeMask make_mask(const MaskSpec& spec, Token seqlen);

}  // namespace cpsched
