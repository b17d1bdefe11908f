// binary_greedy against recorded assignments (test/fixtures/binary_greedy/*.json):
// each instance is solved with 1 and 4 threads and compared task for task with
// the recorded rank of every task, feasibility included. The fixtures pin our
// implementation as it stands (see test/fixtures/binary_greedy/README.md for
// what they were checked against and how they are regenerated).
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "../fixtures/binary_greedy/fixture.hpp"
#include "test_helpers.hpp"

using namespace cpsched;

namespace {

Registry& registry() { return test::build_registry(); }

const std::filesystem::path kDir = std::filesystem::path(CPSCHED_SOURCE_DIR) / "test/fixtures/binary_greedy";

}  // namespace

TEST_CASE("binary_greedy reproduces every recorded assignment task for task, with 1 and 4 threads") {
  const auto files = test::bg_fixture::list(kDir);
  int infeasible = 0, unflattened = 0, min_p = 1 << 30, max_p = 0;
  std::set<int> groups, blocks;
  for (const auto& file : files) {
    CAPTURE(file.filename().string());
    const test::bg_fixture::Fixture f = test::bg_fixture::load(file);
    REQUIRE(f.doc.contains("expected"));
    const nlohmann::json& want = f.doc["expected"];
    const auto expected = want["rank"].get<std::vector<Rank>>();
    REQUIRE(static_cast<std::size_t>(f.grid->num_tasks()) == want["num_tasks"].get<std::size_t>());
    REQUIRE(expected.size() == want["num_tasks"].get<std::size_t>());
    for (const std::int64_t threads : {1, 4}) {
      CAPTURE(threads);
      const Solution a_sol = test::bg_fixture::solve(registry(), f, threads);
      const Assignment& a = a_sol.assignment;
      CHECK(a_sol.feasible == want["feasible"].get<bool>());
      REQUIRE(a.rank.size() == expected.size());
      std::size_t differ = 0, first = 0;
      for (std::size_t t = 0; t < expected.size(); ++t)
        if (a.rank[t] != expected[t] && differ++ == 0) first = t;
      CAPTURE(first);
      CHECK_MESSAGE(differ == 0, differ, " of ", expected.size(), " tasks on another rank than recorded");
    }
    const Problem& p = f.grid->problem();
    infeasible += want["feasible"].get<bool>() ? 0 : 1;
    unflattened += p.grid.flatten_head_groups ? 0 : 1;
    min_p = std::min(min_p, p.cp_size());
    max_p = std::max(max_p, p.cp_size());
    groups.insert(p.num_groups());
    blocks.insert(p.grid.blocks_per_rank);
  }
  // The set still covers what README.md says it does.
  CHECK(files.size() >= 15);
  CHECK(infeasible >= 1);
  CHECK(unflattened >= 1);
  CHECK(min_p <= 4);
  CHECK(max_p >= 130);
  CHECK(groups.size() >= 4);
  CHECK(blocks.size() >= 3);
}

TEST_CASE("binary_greedy on an infeasible instance returns its last try, as published") {
  // Every try is placed here, so the result is the last try's refined
  // assignment; its imbalance is the one the note reports.
  const test::bg_fixture::Fixture f = test::bg_fixture::load(kDir / "p4_causal_infeasible_mu1.json");
  const Solution a_sol = test::bg_fixture::solve(registry(), f, 1);
  CHECK_FALSE(a_sol.feasible);
  CHECK(a_sol.note.find("returned the last try") != std::string::npos);
  CHECK(a_sol.note == f.doc["expected"]["note"].get<std::string>());
}
