#include <fmt/format.h>

#include "commands/commands.hpp"
#include "cpsched/io/atomic_file.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/io/plan_json.hpp"
#include "cpsched/problem/resources.hpp"
#include "commands/report.hpp"
#include "commands/session_run.hpp"

namespace po = boost::program_options;

namespace cpsched::cli {

namespace {
std::vector<int> parse_groups(const std::string& text) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      std::size_t used = 0;
      out.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Error(fmt::format("--groups: '{}' is not a head group number (expected e.g. 0,2,5)", item));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}
}  // namespace

int cmd_plan(const Args& args) {
  ConfigOptions co;
  std::string out, svg, groups;
  bool validate = false, quiet = false;
  po::options_description desc("options");
  co.add_to(desc);
  desc.add_options()
      ("output,o", po::value(&out), "write the plan JSON (format cpsched-plan/1, see docs/plan_format.md)")
      ("validate", po::bool_switch(&validate), "check the plan (comm agreement, exactly-once coverage, buffers, metrics)")
      ("svg", po::value(&svg), "draw the Q x KV grid coloured by computing rank to this SVG file")
      ("groups", po::value(&groups), "head groups to draw, e.g. 0,3 (default: the first 4)")
      ("quiet,q", po::bool_switch(&quiet), "print no tables");
  po::variables_map vm;
  if (!co.parse(args, "plan", "Solves the config and exports the plan.", desc, vm)) return 0;
  if (!groups.empty() && svg.empty()) throw po::error("--groups selects the head groups of --svg; give --svg FILE too");
  const std::vector<int> svg_groups = groups.empty() ? std::vector<int>{} : parse_groups(groups);
  const Config cfg = co.load();
  // Outputs never replace an input or each other: refused before solving.
  std::vector<std::pair<std::filesystem::path, std::string>> outputs;
  if (!out.empty()) outputs.emplace_back(out, "--output");
  if (!svg.empty()) outputs.emplace_back(svg, "--svg");
  check_output_paths(outputs, command_inputs(co, cfg));
  const SessionRun run = solve_with_session(cfg, co.plugin_paths);
  if (!quiet) {
    print_summary(stdout, cfg, run.result());
    fmt::print("plan      {} remote stage(s), built in {:.2f} ms\n", run.result().plan->num_stages,
               run.result().plan_ms);
    print_metrics_table(stdout, run.result());
  }
  if (validate) {
    // The validator's memory (bounded: resources.hpp) with the plan's, before it runs.
    check_resources(run.session->problem(), /*sim_numeric=*/false, /*validate=*/true);
    const std::vector<std::string> problems = run.session->validate();
    if (problems.empty()) {
      fmt::print("\nvalidate  ok: send/receive agree, every unmasked entry computed once, ranges inside buffers, "
                 "metrics match\n");
    } else {
      fmt::print(stderr, "\nvalidate  {} problem(s):\n", problems.size());
      for (const auto& p : problems) fmt::print(stderr, "  {}\n", p);
      if (!outputs.empty()) fmt::print(stderr, "cpsched plan: the plan is invalid: no output written\n");
      return 1;
    }
  }
  // All or nothing: every output is written to its temporary first; the
  // targets are replaced only once all of them are complete (a failure
  // leaves every previous file as it was).
  AtomicFileBatch batch;
  if (!out.empty()) {
    // Streamed: memory stays near the plan's own size instead of a whole JSON tree.
    const PlanExport e = run.session->plan_export();
    write_file_atomic(out, [&](std::ostream& os) { write_plan_json(os, e); });
  }
  if (!svg.empty()) {
    SvgOptions o;
    o.groups = svg_groups;
    o.title = fmt::format("{} — {}", co.config, to_string(cfg.mask.kind));
    run.session->write_svg(svg, o);
  }
  batch.commit();
  for (const auto& [path, what] : outputs) fmt::print("wrote {}\n", path.string());
  return 0;
}

}  // namespace cpsched::cli
