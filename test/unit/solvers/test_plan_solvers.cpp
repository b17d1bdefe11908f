// Every solver plugin x every mask generator x P in {2, 3, 4, 8} with uneven
// shards gives valid plans for both passes and stages 1, 2 and 4. Solvers
// not built yet are skipped (by name, in the output).
#include <doctest/doctest.h>

#include <filesystem>
#include <random>

#include "cpsched/mask/generators.hpp"
#include "host_solve.hpp"
#include "plan_checks.hpp"
#include "random_specs.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/plugin/registry.hpp"

using namespace cpsched;

TEST_CASE("every solver x mask generator x P gives valid plans for stages 1, 2 and 4") {
  Registry reg;
  reg.scan(CPSCHED_PLUGIN_BUILD_DIR);
  AreaCostModel cost;
  std::mt19937_64 rng(2024);
  int solvers_run = 0;
  for (const std::string name : {"owner", "binary_greedy", "usp", "static"}) {
    const PluginInfo* info = nullptr;
    for (const PluginInfo& p : reg.plugins())
      if (p.kind == PluginKind::solver && p.name == name) info = &p;
    if (info == nullptr) {
      MESSAGE("solver '", name, "' is not built in ", CPSCHED_PLUGIN_BUILD_DIR, ": skipped");
      continue;
    }
    ++solvers_run;
    std::unique_ptr<Solver> solver = reg.make_solver(name, reg.resolve_params(*info, {}));
    for (const std::string& kind_name : mask_kind_names()) {
      MaskKind kind{};
      REQUIRE(parse_mask_kind(kind_name, kind));
      for (int P : {2, 3, 4, 8}) {
        auto grid = test::random_grid(kind, P, Heads{8, 4, 8, 2}, rng);  // uneven shards
        const Solution a_sol = test::host_solve(*solver, grid, cost);
        const Assignment& a = a_sol.assignment;
        for (int stages : {1, 2, 4}) {
          CAPTURE(name);
          CAPTURE(kind_name);
          CAPTURE(P);
          CAPTURE(stages);
          test::check_valid_plan(a, build_plan(a, stages), P <= 4 && stages == 2);
        }
      }
    }
  }
  CHECK(solvers_run >= 1);  // at least the foundation's `owner`
}
