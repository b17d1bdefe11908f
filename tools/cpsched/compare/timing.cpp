#include "compare/timing.hpp"

#include <fmt/format.h>

#include "cpsched/base/error.hpp"

namespace cpsched::cli {

namespace {

std::optional<double> figure(const ExecutionReport& rep, const std::string& name) {
  for (const auto& [n, v] : rep.figures)
    if (n == name) return v;
  return std::nullopt;
}

}  // namespace

bool TimingRunner::measure(const std::shared_ptr<const Problem>& problem, const Assignment& a, const Plan& plan,
                           CompareFigures& f, std::string& why) {
  ExecutionReport rep;
  try {
    ExecuteInput in;
    in.problem = problem;
    in.grid = a.grid;
    in.assignment = &a;
    in.plan = &plan;
    rep = exec_->execute(in);
  } catch (const Error& e) {
    why = e.what();
    return false;
  }
  // The sim's names (runtimes/sim/report_text.cpp): pass times and the
  // exposed communication of the worst rank, in milliseconds.
  const auto fwd = figure(rep, "fwd_time_ms"), bwd = figure(rep, "bwd_time_ms");
  const auto fwd_exp = figure(rep, "fwd_exposed_comm_max_ms"), bwd_exp = figure(rep, "bwd_exposed_comm_max_ms");
  if (!fwd || !bwd || !fwd_exp || !bwd_exp) {
    why = "the executor reported no fwd_time_ms / bwd_time_ms / *_exposed_comm_max_ms figures";
    return false;
  }
  f.fwd_step_ms = fwd;
  f.bwd_step_ms = bwd;
  f.fwd_exposed_ms = fwd_exp;
  f.bwd_exposed_ms = bwd_exp;
  return true;
}

std::unique_ptr<TimingRunner> make_timing_runner(const CompareSpec& spec, const std::string& hardware,
                                                 const std::string& label, const Registry& reg, const ConfigLoader& load, std::string& why) {
  const PluginInfo* info = nullptr;
  for (const auto& p : reg.plugins())
    if (p.kind == PluginKind::executor && p.name == spec.timing_executor) info = &p;
  if (info == nullptr) {
    why = fmt::format("no executor plugin '{}' was found (compare.timing.executor)", spec.timing_executor);
    return nullptr;
  }
  // The executor's own block from the config (as `run` reads it), then what
  // the comparison needs: metadata-only timing on the chosen hardware.
  const Config c = load({"executor.name=" + spec.timing_executor});
  Params given = c.executor.given_params();
  given.set("mode", std::string("timing"));
  given.set("hardware", hardware);
  // The timeline picture is not used here; drawing one rank keeps it cheap.
  for (const auto& ps : info->params)
    if (ps.name == "svg_max_ranks") given.set("svg_max_ranks", std::int64_t{1});
  Params params;
  try {
    params = reg.resolve_params(*info, given);
  } catch (const Error& e) {
    throw Error(fmt::format("compare.timing: executor '{}': {}", spec.timing_executor, e.what()));
  }
  std::unique_ptr<Executor> exec;
  try {
    exec = reg.make_executor(spec.timing_executor, params);
  } catch (const Error& e) {
    throw Error(fmt::format("compare.timing: executor '{}' with hardware '{}': {}", spec.timing_executor,
                            label, e.what()));
  }
  return std::make_unique<TimingRunner>(std::move(exec),
                                        fmt::format("{} executor, hardware {}", spec.timing_executor, label));
}

}  // namespace cpsched::cli
