#pragma once
// Two lists of index cells (count_index_cells' output and what must equal it)
// compared field by field, each difference listed in the failure.
#include <doctest/doctest.h>

#include <vector>

#include "cpsched/mask/index/cells.hpp"

namespace cpsched::test {

inline void check_same_cells(const std::vector<IndexCell>& got, const std::vector<IndexCell>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].head == want[i].head);
    CHECK(got[i].qblock == want[i].qblock);
    CHECK(got[i].kblock == want[i].kblock);
    CHECK(got[i].area == want[i].area);
    CHECK(got[i].rows == want[i].rows);
    CHECK(got[i].cols == want[i].cols);
  }
}

}  // namespace cpsched::test
