#pragma once
// Strided views of row-major [rows x heads x dim] float tensors (and of
// [rows x heads] lse tensors with dim 1). A view starts at the first head it
// covers, so a head group of a wider buffer is a view with an offset pointer
// and the buffer's row stride.
#include <cstdint>

#include "cpsched/base/range.hpp"

namespace cpsched::sim {

template <class T>
struct RowView {
  T* data = nullptr;
  std::int64_t stride = 0;  // elements between consecutive rows

  T* row(Token r) const { return data + r * stride; }
  // The same buffer from row r on.
  RowView from(Token r) const { return {row(r), stride}; }
  // The same rows from element `offset` of each row on (a head offset).
  RowView at(std::int64_t offset) const { return {data + offset, stride}; }
};

using CView = RowView<const float>;
using MView = RowView<float>;

inline CView as_const(MView v) { return {v.data, v.stride}; }

}  // namespace cpsched::sim
