// The summary tables of `cpsched compare` (aggregated rows), drawn for the
// terminal and as Markdown.
#include <algorithm>
#include <fmt/format.h>
#include <sstream>
#include <map>
#include <tuple>

#include "compare/ilp.hpp"
#include "compare/report.hpp"
#include "cpsched/io/atomic_file.hpp"
#include "cpsched/base/error.hpp"
#include "commands/report.hpp"

namespace cpsched::cli {

namespace {

std::string opt_fmt(std::optional<double> v, const char* spec) {
  return v ? fmt::format(fmt::runtime(spec), *v) : std::string("-");
}

std::string section_title(const CompareRow& r, int packs) {
  std::string t = fmt::format("{}, heads {}:{}, D {}", r.mask, r.heads.q, r.heads.kv, r.heads.dim);
  if (!r.hardware.empty()) t += ", hardware " + r.hardware;
  if (packs > 1) t += fmt::format(", mean of {} packs (imbalance: worst pack)", packs);
  return t;
}

}  // namespace

std::vector<TextTable> summary_tables(const CompareResult& res, const CompareSpec& spec) {
  const bool many_stages = spec.stages.size() > 1;
  const bool many_layouts = spec.layouts.size() > 1;
  const bool with_uses = spec.uses.size() > 1 || spec.uses.front().has_value();
  const bool timing = !res.timing_label.empty();
  const bool with_ilp = std::find(spec.solvers.begin(), spec.solvers.end(), kIlpSolver) != spec.solvers.end();
  std::vector<TextTable> tables;
  // One section per (heads, mask, hardware).
  std::map<std::tuple<int, int, int, std::string, std::string>, std::size_t> index;
  for (const CompareRow& r : res.aggregated) {
    const auto key = std::make_tuple(r.heads.q, r.heads.kv, r.heads.dim, r.mask, r.hardware);
    auto [it, fresh] = index.emplace(key, tables.size());
    if (fresh) {
      TextTable t;
      t.title = section_title(r, r.packs);
      t.headers = {"P"};
      t.units = {""};
      if (many_stages) {
        t.headers.push_back("stages");
        t.units.push_back("");
      }
      if (many_layouts) {
        t.headers.push_back("layout");
        t.units.push_back("");
      }
      if (with_uses) {
        t.headers.push_back("uses");
        t.units.push_back("");
      }
      for (const char* h : {"solver", "fwd send", "fwd bneck", "bwd send", "bwd bneck", "vs USP", "vs usp pl.",
                            "imbalance", "stage-0", "latency"}) {
        t.headers.emplace_back(h);
      }
      for (const char* u : {"", "GiB", "GiB", "GiB", "GiB", "% fwd", "% fwd", "max/mean", "%", "ms"}) t.units.emplace_back(u);
      if (with_ilp) {
        // After "vs usp pl.": the reductions, then the distance to the optimum.
        const auto at = std::find(t.headers.begin(), t.headers.end(), "imbalance") - t.headers.begin();
        t.headers.insert(t.headers.begin() + at, "gap to ilp");
        t.units.insert(t.units.begin() + at, "% fwd");
      }
      if (timing) {
        t.headers.insert(t.headers.end(), {"step", "bound", "step/bound", "exposed"});
        t.units.insert(t.units.end(), {"ms", "ms", "", "ms"});
      }
      if (spec.rank_path) {
        t.headers.emplace_back("rank path");
        t.units.emplace_back("ms");
      }
      if (timing && with_uses) {
        t.headers.emplace_back("per use");
        t.units.emplace_back("/bound");
      }
      t.headers.emplace_back("note");
      t.units.emplace_back("");
      tables.push_back(std::move(t));
    }
    TextTable& t = tables[it->second];
    std::vector<std::string> row = {std::to_string(r.cp_size)};
    if (many_stages) row.push_back(std::to_string(r.stages));
    if (many_layouts) row.emplace_back(to_string(r.layout));
    if (with_uses) row.push_back(r.uses.str());
    row.push_back(r.solver);
    const CompareFigures& f = r.f;
    if (r.ok) {
      row.push_back(fmt::format("{:.3f}", gib(f.fwd_send)));
      row.push_back(fmt::format("{:.3f}", gib(f.fwd_bottleneck)));
      row.push_back(fmt::format("{:.3f}", gib(f.bwd_send)));
      row.push_back(fmt::format("{:.3f}", gib(f.bwd_bottleneck)));
      row.push_back(opt_fmt(reduction_pct(f.fwd_send, f.usp_closed_fwd), "{:.1f}"));
      row.push_back(opt_fmt(reduction_pct(f.fwd_send, f.ref_fwd), "{:.1f}"));
      if (with_ilp) {
        // `*`: ilp's own row where it did not prove optimality on every pack.
        const bool unproven = f.ilp_proven_packs && *f.ilp_proven_packs < r.packs;
        row.push_back(opt_fmt(gap_to_ilp_pct(f.fwd_send, f.ilp_fwd), "{:.2f}") + (unproven ? "*" : ""));
      }
      row.push_back(fmt::format("{:.3f}", f.imbalance));
      row.push_back(fmt::format("{:.1f}", 100.0 * f.stage0_share));
      row.push_back(fmt::format("{:.2f}", f.latency_ms));
      if (timing) {
        const bool have = f.fwd_step_ms && f.bwd_step_ms;
        row.push_back(have ? fmt::format("{:.3f}", *f.fwd_step_ms + *f.bwd_step_ms) : "-");
        row.push_back(opt_fmt(f.compute_bound_ms, "{:.3f}"));
        row.push_back(opt_fmt(step_over_bound(f), "{:.3f}"));
        row.push_back(have && f.fwd_exposed_ms && f.bwd_exposed_ms
                          ? fmt::format("{:.3f}", *f.fwd_exposed_ms + *f.bwd_exposed_ms)
                          : "-");
      }
      if (spec.rank_path) row.push_back(opt_fmt(f.rank_path_ms, "{:.2f}"));
      if (timing && with_uses) row.push_back(opt_fmt(cost_per_use(r), "{:.3f}"));
      row.push_back(r.note);
    } else {
      const std::size_t values =
          9 + (timing ? 4 : 0) + (with_ilp ? 1 : 0) + (spec.rank_path ? 1 : 0) + (timing && with_uses ? 1 : 0);
      row.insert(row.end(), values, "-");
      row.push_back(r.skipped ? r.error : "FAILED: " + r.error);
    }
    t.rows.push_back(std::move(row));
  }
  return tables;
}

void print_compare_tables(std::FILE* out, const std::vector<TextTable>& tables) {
  for (const TextTable& t : tables) {
    const std::size_t n = t.headers.size();
    std::vector<std::size_t> width(n, 0);
    auto fit = [&](const std::vector<std::string>& cells) {
      for (std::size_t c = 0; c + 1 < n; ++c) width[c] = std::max(width[c], cells[c].size());
    };
    fit(t.headers);
    fit(t.units);
    for (const auto& r : t.rows) fit(r);
    // Text columns (solver, note) left-aligned, numbers right-aligned.
    auto is_text = [&](std::size_t c) { return t.headers[c] == "solver" || c + 1 == n; };
    auto line = [&](const std::vector<std::string>& cells) {
      std::string s;
      for (std::size_t c = 0; c < n; ++c) {
        if (c) s += "  ";
        if (c + 1 == n)
          s += cells[c];
        else if (is_text(c))
          s += fmt::format("{:<{}}", cells[c], width[c]);
        else
          s += fmt::format("{:>{}}", cells[c], width[c]);
      }
      while (!s.empty() && s.back() == ' ') s.pop_back();
      fmt::print(out, "{}\n", s);
    };
    fmt::print(out, "\n{}\n", t.title);
    line(t.headers);
    line(t.units);
    std::string prev_p;
    for (const auto& r : t.rows) {
      // A blank line between CP sizes keeps the solvers of one P together.
      if (!prev_p.empty() && r[0] != prev_p) fmt::print(out, "\n");
      prev_p = r[0];
      line(r);
    }
  }
}

namespace {

std::string md_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

}  // namespace

void write_compare_markdown(const std::filesystem::path& file, const std::vector<TextTable>& tables,
                            const ReportContext& ctx, const std::vector<std::string>& chart_files) {
  std::ostringstream md;
  md << "# cpsched compare\n\n";
  md << "Regenerate: `" << ctx.command << "`\n\n";
  md << "Volumes are the mean total bytes sent by all ranks per pass (GiB); *bneck* is the largest per-rank "
        "max(send, recv); *vs USP* is the forward reduction against USP's closed form (docs/design.md#metrics), *vs usp pl.* "
        "against the `usp` solver's measured placement; *imbalance* is max load / mean load (worst pack); "
        "*stage-0* the share of the load that runs locally; *latency* the median whole-path time "
        "(grid + solve + plan build)";
  if (ctx.with_ilp)
    md << "; *gap to ilp* is how many percent more forward bytes than the exact `ilp` solver moved on the same "
          "point (fwd send / ilp fwd send - 1), empty where ilp did not run or missed its balance target; on these "
          "mean rows it is a ratio of means (the solver's mean forward send over the packs against ilp's), not a "
          "mean of per-pack gaps (results.csv has those); it is negative for a solver that misses the balance "
          "target ilp meets (see *imbalance*), and can be where ilp was not proven optimal; `*` marks ilp rows "
          "whose optimality was not proven on every pack (the note gives ilp's proven bound)";
  if (!ctx.timing_label.empty())
    md << "; *step* the simulated forward + backward time and *exposed* the communication nothing hides "
          "(worst rank, fwd + bwd), from the "
       << ctx.timing_label
       << "; *bound* the compute bound on the section's hardware (the plan's total attention compute / P: "
          "perfect balance, free communication) and *step/bound* how far the step is above it (1 is the "
          "ideal; on these mean rows a ratio of means)";
  bool rank_path = false, per_use = false;
  for (const TextTable& t : tables)
    for (const auto& h : t.headers) {
      rank_path = rank_path || h == "rank path";
      per_use = per_use || h == "per use";
    }
  if (rank_path)
    md << "; *rank path* the slowest rank's whole path when each rank builds only its own plan (grid + solve + "
          "its transfers, CalcMeta and CommMeta)";
  if (per_use)
    md << "; *per use* what one attention call pays against the bound: (path / uses + step) / bound, with the "
          "rank path where measured, else the whole path (a plan made ahead: step / bound)";
  md << ".\n\n";
  for (const auto& w : ctx.warnings) md << "> note: " << md_escape(w) << "\n\n";
  for (const TextTable& t : tables) {
    md << "### " << t.title << "\n\n|";
    for (std::size_t c = 0; c < t.headers.size(); ++c)
      md << " " << t.headers[c] << (t.units[c].empty() ? "" : " (" + t.units[c] + ")") << " |";
    md << "\n|";
    for (std::size_t c = 0; c < t.headers.size(); ++c)
      md << (t.headers[c] == "solver" || t.headers[c] == "note" ? " --- |" : " ---: |");
    md << "\n";
    for (const auto& r : t.rows) {
      md << "|";
      for (const auto& cell : r) md << " " << md_escape(cell) << " |";
      md << "\n";
    }
    md << "\n";
  }
  if (!chart_files.empty()) {
    md << "## Charts\n\n";
    for (const auto& c : chart_files) md << "![" << c << "](" << c << ")\n";
  }
  write_file_atomic(file, md.str());
}

}  // namespace cpsched::cli
