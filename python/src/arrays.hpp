#pragma once
// numpy arrays that own their C++ vector (no copy where a vector is moved in): what the module hands Python for
// every array it returns.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "cpsched/base/range.hpp"

namespace cpsched::py {

namespace nb = nanobind;

// rows x cols (cols 0: a 1-D array of rows).
template <class T>
nb::object numpy_from(std::vector<T>&& v, std::size_t rows, std::size_t cols) {
  auto* heap = new std::vector<T>(std::move(v));
  if (heap->capacity() == 0) heap->reserve(1);  // a valid pointer even for an empty array
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const std::size_t shape[2] = {rows, cols};
  return nb::cast(nb::ndarray<nb::numpy, T>(heap->data(), cols == 0 ? 1 : 2, shape, owner));
}

template <class T>
nb::object numpy_of(const std::vector<T>& v) {
  return numpy_from(std::vector<T>(v), v.size(), 0);
}

// N x 2 (begin, end).
inline nb::object ranges_array(const std::vector<Range>& rs) {
  std::vector<Token> flat;
  flat.reserve(2 * rs.size());
  for (const Range& r : rs) {
    flat.push_back(r.begin);
    flat.push_back(r.end);
  }
  return numpy_from(std::move(flat), rs.size(), 2);
}

}  // namespace cpsched::py
