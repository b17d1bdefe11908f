#pragma once
// Which ranks share a node, and so which link class joins two ranks: ranks
// [n k, n (k + 1)) form node k of n GPUs. The one place that says so.
#include <cstdint>

namespace cpsched {

enum class LinkClass : std::uint8_t { intra_node = 0, inter_node = 1 };

struct NodeMap {
  int gpus_per_node = 8;

  constexpr int node_of(std::int32_t rank) const { return rank / gpus_per_node; }
  constexpr bool same_node(std::int32_t a, std::int32_t b) const { return node_of(a) == node_of(b); }
  constexpr LinkClass link_class(std::int32_t a, std::int32_t b) const {
    return same_node(a, b) ? LinkClass::intra_node : LinkClass::inter_node;
  }
  // 0 inside a node, 1 between nodes: the index of per-class arrays.
  constexpr int link_index(std::int32_t a, std::int32_t b) const { return same_node(a, b) ? 0 : 1; }
};

}  // namespace cpsched
