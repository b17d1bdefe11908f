// `cpsched compare CONFIG --out DIR`: every solver on the same masks, CP sizes,
// packs, head configs and hardware profiles; a terminal table and a report
// folder (CSV, Markdown, SVG charts, index.html).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands/commands.hpp"
#include "compare/files.hpp"
#include "compare/ilp.hpp"
#include "compare/progress.hpp"
#include "compare/report.hpp"
#include "compare/spec.hpp"
#include "compare/sweep.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/io/atomic_file.hpp"
#include "commands/plugin_folders.hpp"

namespace po = boost::program_options;

namespace cpsched::cli {

namespace {

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string join_names(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Per-solver repeat counts that differ from compare.repeats.
std::string repeats_note(const CompareSpec& spec) {
  std::string s;
  for (const auto& [name, n] : spec.repeats_per_solver)
    if (n != spec.repeats) s += fmt::format("{}{} {}", s.empty() ? " (" : ", ", name, n);
  return s.empty() ? s : s + ")";
}

}  // namespace

int cmd_compare(const Args& args) {
  ConfigOptions co;
  std::string out_dir;
  bool quiet = false;
  std::string plans_dir;
  po::options_description desc("options");
  desc.add_options()("out,o", po::value(&out_dir), "report folder to write (created; files in it are replaced)")(
      "quiet,q", po::bool_switch(&quiet), "no terminal table (the report folder is still written)")(
      "plans", po::value(&plans_dir),
      "also write every solved plan's JSON to this folder, one file per cell, without timings (to compare two "
      "builds' plans byte for byte)");
  co.add_to(desc);
  po::variables_map vm;
  if (!co.parse(args, "compare",
                "Sweeps solvers x masks x CP sizes x packs x head configs x hardware profiles (the config's\n"
                "`compare:` section) and writes a terminal table and a report folder: results.csv, results.md,\n"
                "SVG charts, index.html. Each file is replaced atomically; a second compare into the same folder\n"
                "is refused while one runs (lock: DIR/.cpsched-compare.lock).",
                desc, vm))
    return 0;
  if (out_dir.empty()) throw po::error("'cpsched compare' needs --out DIR (the report folder)");

  const auto t_start = std::chrono::steady_clock::now();
  const Config cfg = co.load();
  Registry reg;
  scan_plugins(reg, &cfg, co.plugin_paths);
  CompareSpec spec = read_compare_spec(cfg, reg, co.sets);
  if (!plans_dir.empty()) {
    std::error_code pec;
    std::filesystem::create_directories(plans_dir, pec);
    if (pec || !std::filesystem::is_directory(plans_dir))
      throw Error(fmt::format("--plans {}: cannot create the folder{}", plans_dir, pec ? ": " + pec.message() : ""));
    spec.plans_dir = plans_dir;
  }

  const std::filesystem::path dir = out_dir;
  // The report's files never replace an input (the config, its histogram, profile or .npy files).
  const auto inputs = command_inputs(co, cfg);
  check_output_paths({{dir / "results.csv", "the report's results.csv"},
                      {dir / "results.md", "the report's results.md"},
                      {dir / "index.html", "the report's index.html"}},
                     inputs);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw Error(fmt::format("{}: cannot create the report folder{}", out_dir, ec ? ": " + ec.message() : ""));
  // Held until the last file is written: a second compare into the same
  // folder refuses at once instead of interleaving its files with ours.
  const ReportFolderLock lock(dir);

  std::vector<std::string> mask_names, ps;
  for (auto k : spec.masks) mask_names.emplace_back(to_string(k));
  for (int p : spec.cp_sizes) ps.push_back(std::to_string(p));
  const long units = compare_work_units(cfg, spec);
  if (!quiet)
    fmt::print("compare   solvers {}; masks {}; P {}; {} pack(s) of document masks; {} head config(s); "
               "stages {}{}; {} repeat(s){}{}\n          {} solver runs\n",
               join_names(spec.solvers), join_names(mask_names), join_names(ps), spec.packs.size(), spec.heads.size(),
               spec.stages == std::vector<int>{0} ? std::string("auto") : fmt::format("{}", fmt::join(spec.stages, ", ")),
               spec.relay == PlanShape::Relay::automatic ? "; relays auto" : spec.relay == PlanShape::Relay::on ? "; relays on" : "",
               spec.repeats, repeats_note(spec),
               spec.hardware.empty() ? std::string() : "; hardware " + join_names(spec.hardware), units);
  // A log or pipe shows what runs before the (possibly long) sweep ends.
  if (!quiet) std::fflush(stdout);

  const ConfigLoader loader = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> sets = co.sets;
    sets.insert(sets.end(), extra.begin(), extra.end());
    return load_config(co.config, sets);
  };
  Progress progress(units, Progress::stderr_is_tty());
  const CompareResult res = run_compare(cfg, spec, reg, loader, progress);
  progress.finish();

  ReportContext ctx;
  ctx.config = co.config;
  ctx.command = "cpsched compare";
  for (const auto& a : args) ctx.command += " " + shell_quote(a);
  ctx.timing_label = res.timing_label;
  ctx.with_ilp = std::find(spec.solvers.begin(), spec.solvers.end(), kIlpSolver) != spec.solvers.end();
  ctx.warnings = res.warnings;
  for (const auto& w : res.warnings) fmt::print(stderr, "cpsched compare: note: {}\n", w);

  const auto tables = summary_tables(res, spec);
  if (!quiet) print_compare_tables(stdout, tables);

  // All or nothing: the report's files replace the previous ones only once all are written.
  AtomicFileBatch batch;
  batch.protect(inputs);
  write_compare_csv(dir / "results.csv", res);
  const auto charts = write_compare_charts(dir, res);
  std::vector<std::string> chart_files;
  for (const auto& c : charts) chart_files.push_back(c.file);
  write_compare_markdown(dir / "results.md", tables, ctx, chart_files);
  write_compare_html(dir / "index.html", tables, charts, ctx);
  batch.commit();

  int failed = 0, skipped = 0;
  for (const auto& r : res.per_pack) {
    skipped += r.skipped ? 1 : 0;
    failed += !r.ok && !r.skipped ? 1 : 0;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (!quiet) {
    fmt::print("\n{} rows ({} failed, {} skipped), {} charts in {:.1f} s\n", res.per_pack.size(), failed, skipped,
               charts.size(), secs);
    fmt::print("wrote {}/index.html, results.csv, results.md\n", dir.string());
  }
  // A sweep in which no row ran measured nothing: most often a config or
  // parameter error that every row hit. The report says so row by row; the
  // exit status says so to a script (a row that failed beside others that
  // ran is a result, not an error).
  if (failed > 0 && failed + skipped == static_cast<int>(res.per_pack.size())) {
    std::string first;
    for (const auto& r : res.per_pack)
      if (!r.ok && !r.skipped) {
        first = r.error;
        break;
      }
    fmt::print(stderr, "cpsched compare: error: every row failed ({} failed{}); the first: {}\n", failed,
               skipped > 0 ? fmt::format(", {} skipped", skipped) : std::string(), first);
    return 1;
  }
  return 0;
}

}  // namespace cpsched::cli
