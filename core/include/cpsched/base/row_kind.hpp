#pragma once
// The two kinds of rows a plan moves between ranks. QO: a query token's rows
// (Q out; O and lse, or dQ, back). KV: a key token's rows (K and V out; dK
// and dV back). Transfers, collectives, the search's byte model and the GPU
// runtime all use this one type.
#include <cstdint>
#include <string_view>

namespace cpsched {

enum class RowKind : std::uint8_t { qo = 0, kv = 1 };

inline constexpr RowKind kRowKinds[] = {RowKind::qo, RowKind::kv};
inline constexpr int index_of(RowKind k) { return static_cast<int>(k); }
inline std::string_view to_string(RowKind k) { return k == RowKind::qo ? "QO" : "KV"; }

}  // namespace cpsched
