// Fuzz target: plan JSON writing. A fuzzed small problem (P <= 8, S <= 512,
// GQA or MHA, flattened or not, 1-3 blocks per rank, a fuzzed mask) is solved
// with the `owner` solver plugin, its plan built with 1-3 stages and written
// as JSON (with and without tasks, compact and indented); the text must parse
// back with nlohmann-json and carry the problem's numbers. Inputs whose mask
// does not validate are skipped (fuzz_mask covers validation).
#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/io/plan_json.hpp"
#include "cpsched/plugin/registry.hpp"
#include "fuzz_input.hpp"

using namespace cpsched;

namespace {

Solver& owner() {
  static Registry* reg = [] {
    auto* r = new Registry;  // lives to the end: the solver keeps its library loaded
    r->scan(CPSCHED_PLUGIN_BUILD_DIR);
    return r;
  }();
  static std::unique_ptr<Solver> s =
      reg->make_solver("owner", reg->resolve_params(reg->find(PluginKind::solver, "owner"), Params{}));
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Bytes in(data, size);
  const int P = static_cast<int>(in.range(1, 8));
  const Token per_rank = in.range(1, 64);
  const Token S = per_rank * P;
  static const Heads kHeads[] = {{8, 2, 16, 2}, {4, 4, 8, 4}, {6, 3, 32, 1}, {2, 1, 8, 2}};
  const Heads heads = kHeads[in.range(0, 3)];
  GridOptions grid;
  grid.flatten_head_groups = in.u8() % 2 == 0;
  grid.blocks_per_rank = static_cast<int>(in.range(1, 3));
  const int stages = static_cast<int>(in.range(1, 3));
  const auto n = in.range(1, 10);
  std::vector<Slice> slices;
  for (std::int64_t i = 0; i < n; ++i) {
    Slice s;
    s.q = {in.range(0, S), in.range(0, S)};
    s.k = {in.range(0, S), in.range(0, S)};
    s.type = static_cast<MaskType>(in.range(0, 3));
    slices.push_back(s);
  }
  std::shared_ptr<const TaskGrid> g;
  try {
    RangeMask mask(S, std::move(slices));
    mask.validate();
    g = std::make_shared<const TaskGrid>(std::make_shared<const Problem>(Problem::make(mask, P, heads, grid)));
  } catch (const Error&) {
    return 0;
  }
  const AreaCostModel cost;
  const Assignment a = owner().solve(SolveInput(g, cost)).assignment;
  const Metrics m = compute_metrics(a);
  const Plan plan = build_plan(a, stages);
  PlanExport e;
  e.assignment = &a;
  e.metrics = &m;
  e.plan = &plan;
  e.solver = "owner";
  e.include_tasks = in.u8() % 2 == 0;
  const std::string text = plan_json(e, in.u8() % 2 == 0 ? -1 : 2);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    fuzz::broken();  // the writer produced text that is not JSON
  }
  if (doc.value("format", "") != "cpsched-plan/1") fuzz::broken();
  if (doc["problem"]["cp_size"] != P || doc["problem"]["seqlen"] != S) fuzz::broken();
  if (doc["ranks"].size() != static_cast<std::size_t>(P)) fuzz::broken();
  if (e.include_tasks && doc["tasks"].size() != static_cast<std::size_t>(g->num_tasks())) fuzz::broken();
  return 0;
}
