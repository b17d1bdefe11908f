// cpsched_check_plugin <round_robin plugin file> <installed plugin folder>
// Loads an out-of-tree `round_robin` solver and the installed plugins through
// the Registry and checks that they solve a small grid. Exit 0 when all hold.
#include <cstdio>
#include <exception>
#include <memory>

#include "cpsched/base/error.hpp"
#include "cpsched/plugin/registry.hpp"

using namespace cpsched;

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
  if (!ok) ++failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <plugin file> <installed plugin folder>\n", argv[0]);
    return 2;
  }
  try {
    Registry reg;
    const PluginInfo& info = reg.load(argv[1]);
    expect(info.name == "round_robin" && info.kind == PluginKind::solver, "round_robin is a solver");
    reg.scan(argv[2]);
    for (const PluginProblem& p : reg.problems()) std::printf("problem: %s\n", p.message.c_str());
    expect(reg.problems().empty(), "every installed plugin loads");

    // Causal mask, 256 tokens, 4 ranks, two head groups: 20 tasks.
    RangeMask mask(256, {Slice{{0, 256}, {0, 256}, MaskType::causal}});
    auto problem = std::make_shared<const Problem>(Problem::make(mask, 4, Heads{4, 2, 16, 2}));
    auto grid = std::make_shared<const TaskGrid>(problem);
    auto cost = reg.make_cost_model("area", {});

    Params given;
    given.set("offset", std::int64_t{1});
    const Solution a_sol = reg.make_solver("round_robin", given)->solve(SolveInput(grid, *cost));
    const Assignment& a = a_sol.assignment;
    a.validate();
    bool round_robin = a.rank.size() == static_cast<std::size_t>(grid->num_tasks());
    for (TaskId t = 0; round_robin && t < grid->num_tasks(); ++t) round_robin = a.rank[t] == (t + 1) % 4;
    expect(round_robin, "round_robin puts task t on rank (t + 1) mod 4");

    const Solution o_sol = reg.make_solver("owner", {})->solve(SolveInput(grid, *cost));

    const Assignment& o = o_sol.assignment;
    bool owner = o.rank.size() == static_cast<std::size_t>(grid->num_tasks());
    for (TaskId t = 0; owner && t < grid->num_tasks(); ++t) owner = o.rank[t] == grid->q_host(t);
    expect(owner, "the installed owner solver puts tasks on their q host");
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
