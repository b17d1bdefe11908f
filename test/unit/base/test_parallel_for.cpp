// parallel_for: every item once at any thread count, the lowest failing
// item's error, and a thread the system refuses to start taken over by the
// others instead of ending the process.
#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cpsched/base/parallel_for.hpp"

using namespace cpsched;

TEST_CASE("every item runs once, at any thread count") {
  for (int threads : {0, 1, 2, 3, 8, 64}) {
    CAPTURE(threads);
    for (std::size_t n : {0u, 1u, 2u, 7u, 1000u}) {
      CAPTURE(n);
      std::vector<std::atomic<int>> runs(n);
      parallel_for(n, threads, [&](std::size_t i) { runs[i].fetch_add(1); });
      for (std::size_t i = 0; i < n; ++i) CHECK(runs[i].load() == 1);
    }
  }
}

TEST_CASE("the lowest item that throws is the error, at any thread count") {
  for (int threads : {1, 2, 4, 8}) {
    CAPTURE(threads);
    try {
      parallel_for(200, threads, [](std::size_t i) {
        if (i == 37 || i == 120 || i == 199) throw std::runtime_error("item " + std::to_string(i));
      });
      FAIL("no exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "item 37");
    }
  }
}

TEST_CASE("threads the system refuses to start leave their items to the others") {
  for (int started : {0, 1, 3}) {
    CAPTURE(started);
    std::vector<std::atomic<int>> runs(500);
    int spawned = 0;
    detail::parallel_for_spawned(
        runs.size(), 8, [&](std::size_t i) { runs[i].fetch_add(1); },
        [&](auto& work) {
          if (spawned == started) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
          ++spawned;
          return std::thread([&work] { work(); });
        });
    CHECK(spawned == started);
    for (auto& r : runs) CHECK(r.load() == 1);
  }
}

TEST_CASE("a refused thread with a failing item still reports the item's error") {
  int spawned = 0;
  CHECK_THROWS_WITH_AS(detail::parallel_for_spawned(
                           100, 4,
                           [](std::size_t i) {
                             if (i == 50) throw std::invalid_argument("bad item 50");
                           },
                           [&](auto& work) {
                             if (spawned == 1) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
                             ++spawned;
                             return std::thread([&work] { work(); });
                           }),
                       "bad item 50", std::invalid_argument);
}
