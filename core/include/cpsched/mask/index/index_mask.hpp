#pragma once
// Index masks: the selections a runtime sparse-attention indexer produces
// (DSA token top-k, NSA block selection, block-sparse BSR), taken as arrays
// instead of range slices (a DSA layer at S = 128k, k = 2048 would be 268M
// one-token slices). One mask per attention call, over one sequence of S
// tokens, queries and keys in the same token coordinates.
//
// Semantics, for query token i and KV head h (h = 0 when kv_heads == 1: one
// selection shared by every head):
//   topk        keys { indices[i, h, j] : indices[i, h, j] != -1 }
//               indices: int32 [S, kv_heads, k], -1 padded anywhere.
//   block_topk  query block qb = i / block_q selects key blocks
//               { indices[h, qb, j] != -1 }; key block kb is the tokens
//               [kb * block_k, min(S, (kb + 1) * block_k)).
//               indices: int32 [kv_heads, ceil(S / block_q), n], -1 padded.
//               (NSA's selection branch: block_q = 1, block_k = 64, n = 16.)
//   bsr         query block qb selects key blocks
//               indices[indptr[h, qb] .. indptr[h, qb + 1]) (FlashInfer's BSR,
//               FlexAttention's kv_indices), plus, when given, the blocks of
//               the second pair (full_indptr, full_indices) (FlexAttention's
//               full_kv_indices). indptr: int32 [kv_heads, ceil(S / block_q) + 1]
//               (or 1-D when kv_heads == 1), indices: int32 [nnz]; each
//               head's indptr row starts at 0 into its own slice of
//               `indices`: row h of indices is indices[base_h + ...] with
//               base_h = the sum of the earlier heads' nnz (indptr[h, last]).
// With `causal`, only pairs with key <= query count (token level, so a block
// that straddles the diagonal is cut), and a selection with no such pair is
// an error (a non-causal selection), as is an index outside the sequence, a
// key (block) selected twice for the same query (block), or, for bsr, a
// block in both the partial and the full lists. Every selected pair is then
// computed exactly once.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpsched/mask/mask.hpp"
#include "cpsched/base/range.hpp"

namespace cpsched {

enum class IndexMaskKind : int { topk = 0, block_topk = 1, bsr = 2 };
std::string_view to_string(IndexMaskKind k);

// A read-only int32 array and what keeps its memory alive: a loaded .npy
// file, or the caller's memory (Session API spans; the caller keeps it alive
// until the solve returns). `source` names it in errors: a file path, or
// "<name>" for memory.
struct IndexArray {
  std::shared_ptr<const void> owner;
  const std::int32_t* data = nullptr;
  std::vector<std::int64_t> shape;  // row-major (C order)
  std::string source;

  std::int64_t size() const;  // product of shape (0 when shape is empty)
  std::span<const std::int32_t> span() const { return {data, static_cast<std::size_t>(size())}; }
  bool empty() const { return data == nullptr; }
  // Borrows `data` (no copy); the caller keeps it alive.
  static IndexArray view(std::span<const std::int32_t> data, std::vector<std::int64_t> shape, std::string source);
  // Takes shared ownership of `data` (no copy).
  static IndexArray own(std::shared_ptr<const std::vector<std::int32_t>> data, std::vector<std::int64_t> shape,
                        std::string source);
  // Copies (int64 input is narrowed; a value outside int32 is an error naming `source` and the flat position).
  static IndexArray copy(std::span<const std::int64_t> data, std::vector<std::int64_t> shape, std::string source);
  static IndexArray copy(std::span<const std::int32_t> data, std::vector<std::int64_t> shape, std::string source);
};

struct IndexMask {
  IndexMaskKind kind = IndexMaskKind::topk;
  Token seqlen = 0;   // S, at most 2^31 - 1
  int kv_heads = 1;   // H_kv of the selection: 1 (shared by every head) or the problem's hkv
  bool causal = true;
  int block_q = 1;    // block_topk, bsr
  int block_k = 1;
  IndexArray indices;
  IndexArray indptr;        // bsr only
  IndexArray full_indptr;   // bsr, optional
  IndexArray full_indices;  // bsr, optional

  Token num_query_blocks() const { return (seqlen + block_q - 1) / block_q; }
  // Checks the shapes against S and kv_heads and every entry (range,
  // causality, duplicates), in one multi-threaded pass (threads <= 0: the
  // hardware's). Throws cpsched::Error naming the array's source and the
  // first offending entry by its index, e.g.
  //   "dsa.npy: indices[1027, 0, 15] = 131072 is outside [0, 131072)".
  void validate(int threads = 0) const;
  // Selected (query, key) pairs of head h (of all heads when h < 0), 128-bit.
  __int128 area(int h = -1) const;
};

// Block selections (block_topk, bsr) are range masks: one per selection head
// (kv_heads of them), each selected block a full slice (causal where it
// straddles the diagonal, cut to the causal part), with blocks adjacent in a
// query block's row merged into one slice and identical rows of consecutive
// query blocks into one taller slice. Exact: the pairs are the selection's.
// Validates first (throws as validate()).
std::vector<RangeMask> block_selection_masks(const IndexMask& mask, int threads = 0);

}  // namespace cpsched
