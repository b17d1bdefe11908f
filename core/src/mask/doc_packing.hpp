#pragma once
// Internal: seeded sampling of documents from a length histogram and packing
// of the sampled stream into packs of exactly S tokens (docs/design.md#masks).
#include <cstdint>
#include <random>
#include <vector>

#include "cpsched/mask/generators.hpp"

namespace cpsched::detail {

// Uniform integer in [0, n), n >= 1, from the raw engine output by rejection.
// std::uniform_int_distribution is not used on purpose: its algorithm is
// implementation defined, so results would differ between standard libraries;
// std::mt19937_64's output sequence is fixed by the standard.
std::uint64_t uniform_below(std::mt19937_64& engine, std::uint64_t n);

// Document lengths of pack `pack` (sum == seqlen). The histogram must be valid.
std::vector<Token> histogram_pack(const DocHistogram& hist, Token seqlen, std::uint64_t seed, int pack);

}  // namespace cpsched::detail
