#pragma once
// Mask generators shared by every front end (docs/design.md#masks). All deterministic
// given their seed.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cpsched/mask/index/index_mask.hpp"
#include "cpsched/mask/mask.hpp"

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

// Range kinds (make_mask), then index kinds (make_index_mask; docs/masks.md):
// topk, block_topk and bsr read .npy files, dsa and nsa are synthetic.
enum class MaskKind {
  full, causal, full_document, causal_document, sliding_window, prefix_lm,
  share_question, block_causal_document, slices,
  topk, block_topk, bsr, dsa, nsa
};
std::string_view to_string(MaskKind k);
bool parse_mask_kind(std::string_view s, MaskKind& out);  // any kind
std::vector<std::string> mask_kind_names();         // the range kinds (make_mask)
std::vector<std::string> index_mask_kind_names();   // the index kinds (make_index_mask)
bool is_index_kind(MaskKind k);

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

  // Index kinds (docs/masks.md).
  // topk, block_topk, bsr: the .npy files (absolute, or relative to the
  // working directory; the config reader resolves them against the config's
  // folder). full_* are bsr's optional full blocks.
  std::filesystem::path indices_file, indptr_file, full_indptr_file, full_indices_file;
  // block_topk, bsr: block_size [block_q, block_k]; 0 = the kind's default
  // (block_topk [1, 64], NSA's selection; bsr [128, 128], FlexAttention's).
  int block_q = 0;
  int block_k = 0;
  bool causal = true;            // index kinds: only key <= query counts
  // Selection heads: files: 0 = the file's (else it must match); dsa, nsa:
  // 0 = 1 (one selection shared by every head).
  int kv_heads = 0;
  // dsa: per query, `topk` keys inside its document: the document's first
  // `sink` tokens, the `local` most recent (the query included), the rest
  // at random among the earlier ones; -1 padded, sorted ascending.
  Token topk = 2048;
  Token sink = 64;
  Token local = 512;
  // nsa (selection branch): block_topk with block_q 1 and key blocks of
  // nsa_block tokens; per query `nsa_top` blocks: the document's first
  // `nsa_initial`, the `nsa_local` most recent (the query's included), the
  // rest at random among the document's earlier blocks.
  Token nsa_block = 64;
  int nsa_top = 16;
  int nsa_initial = 1;
  int nsa_local = 2;
};

// Document lengths of a spec for a sequence of `seqlen` tokens (sum == seqlen).
// Histogram packs: documents longer than S/4 are cut into S/4 pieces; pieces
// are shuffled with the seed and packed into packs of exactly S tokens, the
// overflowing piece split and carried into the next pack. The sampling is a
// fixed procedure on std::mt19937_64(seed) (written out in
// core/src/doc_packing.cpp), so a (histogram, S, seed, pack) gives the same
// documents on every platform.
std::vector<Token> document_lengths(const MaskSpec& spec, Token seqlen);

// The range mask of the spec; validated. Throws for index kinds.
RangeMask make_mask(const MaskSpec& spec, Token seqlen);

// The index mask of an index kind (is_index_kind), validated: the .npy files
// loaded (topk, block_topk, bsr), or generated (dsa, nsa; deterministic given
// the seed, for any thread count). Throws cpsched::Error for range kinds
// and, naming the file, for bad files.
IndexMask make_index_mask(const MaskSpec& spec, Token seqlen);

}  // namespace cpsched
