#pragma once
// Random causal index masks for tests: token top-k and block top-k, the
// arrays owned by the mask (IndexArray::owner).
#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "cpsched/mask/generators.hpp"
#include "cpsched/mask/index/index_mask.hpp"

namespace cpsched::test {

// Causal token top-k, -1 padded at random places: row (q, h) selects up to
// k distinct keys <= q.
inline std::shared_ptr<const IndexMask> random_topk(Token S, int heads, int k, std::mt19937_64& rng) {
  auto data = std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(S * heads * k), -1);
  std::vector<std::int32_t> keys;
  for (Token q = 0; q < S; ++q)
    for (int h = 0; h < heads; ++h) {
      keys.resize(static_cast<std::size_t>(q + 1));
      for (Token j = 0; j <= q; ++j) keys[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
      std::shuffle(keys.begin(), keys.end(), rng);
      const auto n = std::min<std::size_t>(keys.size(), std::uniform_int_distribution<std::size_t>(0, k)(rng));
      std::vector<int> slot(static_cast<std::size_t>(k));
      for (int j = 0; j < k; ++j) slot[static_cast<std::size_t>(j)] = j;
      std::shuffle(slot.begin(), slot.end(), rng);
      for (std::size_t j = 0; j < n; ++j)
        (*data)[static_cast<std::size_t>((q * heads + h) * k + slot[j])] = keys[j];
    }
  auto m = std::make_shared<IndexMask>();
  m->kind = IndexMaskKind::topk;
  m->seqlen = S;
  m->kv_heads = heads;
  m->indices = IndexArray::own(std::move(data), {S, heads, k}, "<random>");
  return m;
}

// Causal block top-k [heads, ceil(S / bq), n]: each query block picks up to
// n distinct key blocks that start at or before its last row.
inline std::shared_ptr<const IndexMask> random_block_topk(Token S, int heads, int bq, int bk, int n, std::mt19937_64& rng) {
  const Token nq = (S + bq - 1) / bq;
  auto data = std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(heads * nq * n), -1);
  for (int h = 0; h < heads; ++h)
    for (Token qb = 0; qb < nq; ++qb) {
      const Token last = std::min(S, (qb + 1) * bq) - 1;
      std::vector<std::int32_t> blocks;
      for (Token kb = 0; kb * bk <= last; ++kb) blocks.push_back(static_cast<std::int32_t>(kb));
      std::shuffle(blocks.begin(), blocks.end(), rng);
      const auto take = std::min<std::size_t>(blocks.size(), std::uniform_int_distribution<std::size_t>(1, n)(rng));
      for (std::size_t j = 0; j < take; ++j) (*data)[static_cast<std::size_t>((h * nq + qb) * n) + j] = blocks[j];
    }
  auto m = std::make_shared<IndexMask>();
  m->kind = IndexMaskKind::block_topk;
  m->seqlen = S;
  m->kv_heads = heads;
  m->block_q = bq;
  m->block_k = bk;
  m->indices = IndexArray::own(std::move(data), {heads, nq, n}, "<random>");
  return m;
}

// A small dsa mask (make_index_mask) over three documents whose boundaries
// fall inside the ranks' shards: sinks, a local window and random keys.
inline IndexMask small_dsa(Token S, int kv_heads, int pack, Token topk, Token sink, Token local) {
  MaskSpec spec;
  spec.kind = MaskKind::dsa;
  spec.topk = topk;
  spec.sink = sink;
  spec.local = local;
  spec.kv_heads = kv_heads;
  spec.pack = pack;
  spec.lengths = {S / 2 + 11, S / 4 - 11, S - S / 2 - S / 4};
  return make_index_mask(spec, S);
}

}  // namespace cpsched::test
