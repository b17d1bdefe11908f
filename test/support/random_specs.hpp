#pragma once
// Random mask specs for the end-to-end tests: every generator kind over random
// document lengths, with small windows and blocks so tiny sequences exercise
// every slice shape.
#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/task_grid.hpp"

namespace cpsched::test {

// Document lengths adding up to S, each at most S/3 (S >= 3).
inline std::vector<Token> random_doc_lengths(Token S, std::mt19937_64& rng) {
  std::vector<Token> v;
  for (Token left = S; left > 0;) {
    const Token n = std::min<Token>(left, 1 + static_cast<Token>(rng() % static_cast<std::uint64_t>(S / 3)));
    v.push_back(n);
    left -= n;
  }
  return v;
}

inline MaskSpec random_spec(MaskKind kind, Token S, std::mt19937_64& rng) {
  MaskSpec spec;
  spec.kind = kind;
  spec.lengths = random_doc_lengths(S, rng);
  spec.window_left = 5;
  spec.window_right = 2;
  spec.block_size = 4;
  spec.num_answers = 2;
  if (kind == MaskKind::slices)
    spec.slices = {{{0, S / 2}, {0, S / 2}, MaskType::causal},
                   {{S / 2, S}, {0, S / 3}, MaskType::full},
                   {{S / 2, S}, {S / 2, S}, MaskType::bi_causal},
                   {{0, S / 3}, {S / 2, S}, MaskType::inv_causal}};
  return spec;
}

// A small random problem of `kind` over P ranks with uneven shards
// (S = 9P + 1 + r, r < P - 1), flattened head groups, and its task grid.
// Layout planned by default, so that static may dispatch.
inline std::shared_ptr<const TaskGrid> random_grid(MaskKind kind, int P, Heads heads, std::mt19937_64& rng,
                                                   Layout layout = Layout::planned) {
  const Token S = 9 * P + 1 + static_cast<Token>(rng() % static_cast<std::uint64_t>(P - 1));
  const RangeMask mask = make_mask(random_spec(kind, S, rng), S);
  Problem p = Problem::make(mask, P, heads, {true, 1});
  p.layout = layout;
  return std::make_shared<const TaskGrid>(std::make_shared<const Problem>(std::move(p)));
}

}  // namespace cpsched::test
