#include <doctest/doctest.h>

#include <random>

#include "brute_force.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/mask.hpp"

using namespace cpsched;
using cpsched::test::brute_slice;

TEST_CASE("slice area and needed rows/cols equal brute force for all types and shapes") {
  std::mt19937_64 rng(12345);
  const MaskType types[] = {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal};
  int nonempty = 0, empty = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    // Lq < Lk, Lq == Lk and Lq > Lk all occur; rectangles clip from any side.
    const Token qs = static_cast<Token>(rng() % 20), ks = static_cast<Token>(rng() % 20);
    const Token lq = 1 + static_cast<Token>(rng() % 17);
    const Token lk = (iter % 3 == 0) ? lq : 1 + static_cast<Token>(rng() % 17);
    const Slice s{{qs, qs + lq}, {ks, ks + lk}, types[iter % 4]};
    Range qr{static_cast<Token>(rng() % 40), 0}, kr{static_cast<Token>(rng() % 40), 0};
    qr.end = qr.begin + static_cast<Token>(rng() % 30);
    kr.end = kr.begin + static_cast<Token>(rng() % 30);
    if (iter % 5 == 0) { qr = s.q; kr = s.k; }
    const auto b = brute_slice(s, qr, kr);
    INFO("slice q=[", qs, ",", qs + lq, ") k=[", ks, ",", ks + lk, ") type=", to_string(s.type),
         " rect q=[", qr.begin, ",", qr.end, ") k=[", kr.begin, ",", kr.end, ")");
    REQUIRE(slice_area(s, qr, kr) == b.area);
    REQUIRE(slice_needed_rows(s, qr, kr) == b.rows);
    REQUIRE(slice_needed_cols(s, qr, kr) == b.cols);
    // Needed rows and cols are contiguous: every token in the hull is needed.
    for (Token q = b.rows.begin; q < b.rows.end; ++q) REQUIRE(b.row_needed[static_cast<std::size_t>(q - qr.begin)]);
    for (Token k = b.cols.begin; k < b.cols.end; ++k) REQUIRE(b.col_needed[static_cast<std::size_t>(k - kr.begin)]);
    (b.area > 0 ? nonempty : empty)++;
  }
  CHECK(nonempty > 1000);
  CHECK(empty > 100);
}

TEST_CASE("bottom-right causal semantics") {
  // Lq > Lk: the top Lq - Lk rows are empty.
  const Slice tall{{0, 6}, {0, 2}, MaskType::causal};
  CHECK(slice_area(tall) == 1 + 2);
  CHECK(slice_needed_rows(tall, tall.q, tall.k) == Range{4, 6});
  // Lq < Lk: the first row already sees Lk - Lq + 1 keys.
  const Slice wide{{0, 2}, {0, 6}, MaskType::causal};
  CHECK(slice_area(wide) == 5 + 6);
  CHECK(slice_area({{0, 4}, {0, 4}, MaskType::inv_causal}) == 4 + 3 + 2 + 1);
  CHECK(slice_area({{0, 4}, {0, 6}, MaskType::bi_causal}) == 4 * 3);
  CHECK(slice_area({{0, 6}, {0, 4}, MaskType::bi_causal}) == 0);
}

TEST_CASE("mask validation names the offending slices") {
  auto err = [](const RangeMask& m) {
    try {
      m.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(err(RangeMask(10, {{{0, 5}, {0, 5}, MaskType::causal}, {{5, 10}, {0, 10}, MaskType::causal}})).empty());
  CHECK(err(RangeMask(10, {{{0, 5}, {0, 11}, MaskType::full}})).find("slice 0: k range [0, 11) is outside") !=
        std::string::npos);
  CHECK(err(RangeMask(10, {{{3, 3}, {0, 1}, MaskType::full}})).find("slice 0: q range [3, 3) is empty") !=
        std::string::npos);
  const std::string o = err(RangeMask(10, {{{0, 4}, {0, 4}, MaskType::full},
                                           {{4, 8}, {4, 8}, MaskType::full},
                                           {{2, 6}, {2, 6}, MaskType::causal}}));
  CHECK(o.find("slices 0 and 2 overlap") != std::string::npos);
  // Rectangles overlap but the unmasked entries do not: causal + strict upper triangle.
  CHECK(err(RangeMask(8, {{{0, 8}, {0, 8}, MaskType::causal}, {{0, 7}, {1, 8}, MaskType::inv_causal}})).empty());
  CHECK(err(RangeMask(8, {{{0, 8}, {0, 8}, MaskType::causal}, {{0, 8}, {0, 8}, MaskType::inv_causal}}))
            .find("slices 0 and 1 overlap") != std::string::npos);
}

TEST_CASE("overlap detection equals brute force on random slice pairs") {
  std::mt19937_64 rng(99);
  const MaskType types[] = {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal};
  for (int iter = 0; iter < 3000; ++iter) {
    auto rnd_slice = [&] {
      Token qs = static_cast<Token>(rng() % 12), ks = static_cast<Token>(rng() % 12);
      return Slice{{qs, qs + 1 + static_cast<Token>(rng() % 10)}, {ks, ks + 1 + static_cast<Token>(rng() % 10)},
                   types[rng() % 4]};
    };
    Slice a = rnd_slice(), b = rnd_slice();
    bool brute = false;
    for (Token q = 0; q < 24 && !brute; ++q)
      for (Token k = 0; k < 24 && !brute; ++k) brute = slice_contains(a, q, k) && slice_contains(b, q, k);
    bool reported = false;
    try {
      RangeMask(24, {a, b}).validate();
    } catch (const Error&) {
      reported = true;
    }
    REQUIRE(reported == brute);
  }
}
