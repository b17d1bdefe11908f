// The CSV of `cpsched compare`: one row per (combination, pack) and one
// aggregated row (mean over packs) per combination, full precision.
#include <fmt/format.h>
#include <sstream>

#include "compare/ilp.hpp"
#include "compare/report.hpp"
#include "cpsched/io/atomic_file.hpp"
#include "cpsched/base/error.hpp"
#include "commands/report.hpp"

namespace cpsched::cli {

const std::vector<std::string>& compare_csv_columns() {
  static const std::vector<std::string> cols = {
      "row", "mask", "cp_size", "heads_q", "heads_kv", "head_dim", "stages", "hardware", "layout", "uses", "solver", "pack", "packs", "status",
      "fwd_send_gib", "fwd_bottleneck_gib", "bwd_send_gib", "bwd_bottleneck_gib",
      "usp_closed_form_fwd_gib", "usp_placement_fwd_gib", "usp_placement_bwd_gib",
      "fwd_reduction_vs_usp_closed_pct", "fwd_reduction_vs_usp_placement_pct", "bwd_reduction_vs_usp_placement_pct",
      "imbalance", "stage0_share", "feasible_packs",
      "latency_ms", "grid_ms", "solve_ms", "plan_ms",
      "fwd_step_ms", "bwd_step_ms", "step_ms", "fwd_exposed_comm_ms", "bwd_exposed_comm_ms", "exposed_comm_ms",
      "compute_bound_ms", "step_over_bound", "rank_path_ms", "cost_per_use",
      "gap_to_ilp_pct", "ilp_fwd_gib", "ilp_bound_gib", "ilp_proven",
      "error", "note", "solver_note"};
  return cols;
}

namespace {

// RFC 4180 quoting; newlines become "; " so that every record is one line.
std::string csv_text(const std::string& s) {
  std::string flat;
  for (char c : s) {
    if (c == '\n') flat += "; ";
    else if (c != '\r') flat += c;
  }
  if (flat.find_first_of(",\"") == std::string::npos) return flat;
  std::string q = "\"";
  for (char c : flat) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string num(double v) { return fmt::format("{:.10g}", v); }
std::string num(std::optional<double> v) { return v ? num(*v) : std::string(); }
std::string gib_of(std::optional<double> v) { return v ? num(gib(*v)) : std::string(); }

std::optional<double> sum(std::optional<double> a, std::optional<double> b) {
  if (!a || !b) return std::nullopt;
  return *a + *b;
}

std::vector<std::string> record(const CompareRow& r) {
  const CompareFigures& f = r.f;
  std::vector<std::string> v = {
      r.aggregate ? "mean" : "pack",       r.mask,
      std::to_string(r.cp_size),           std::to_string(r.heads.q),
      std::to_string(r.heads.kv),          std::to_string(r.heads.dim),
      std::to_string(r.stages),            r.hardware,
      to_string(r.layout),                 r.uses.str(),
      r.solver,
      r.pack >= 0 ? std::to_string(r.pack) : std::string(),
      std::to_string(r.packs),             r.ok ? "ok" : (r.skipped ? "skipped" : "error")};
  if (r.ok) {
    const std::vector<std::string> figs = {
        num(gib(f.fwd_send)), num(gib(f.fwd_bottleneck)), num(gib(f.bwd_send)), num(gib(f.bwd_bottleneck)),
        num(gib(f.usp_closed_fwd)), gib_of(f.ref_fwd), gib_of(f.ref_bwd),
        num(reduction_pct(f.fwd_send, f.usp_closed_fwd)), num(reduction_pct(f.fwd_send, f.ref_fwd)),
        num(reduction_pct(f.bwd_send, f.ref_bwd)),
        num(f.imbalance), num(f.stage0_share), std::to_string(f.feasible_packs),
        num(f.latency_ms), num(f.grid_ms), num(f.solve_ms), num(f.plan_ms),
        num(f.fwd_step_ms), num(f.bwd_step_ms), num(sum(f.fwd_step_ms, f.bwd_step_ms)),
        num(f.fwd_exposed_ms), num(f.bwd_exposed_ms), num(sum(f.fwd_exposed_ms, f.bwd_exposed_ms)),
        // Mean rows: ratio of means (mean step over mean bound), as the gap to ilp.
        num(f.compute_bound_ms), num(step_over_bound(f)), num(f.rank_path_ms), num(cost_per_use(r)),
        // Mean rows: ratio of means (mean fwd send over mean ilp fwd send).
        num(gap_to_ilp_pct(f.fwd_send, f.ilp_fwd)), gib_of(f.ilp_fwd), gib_of(f.ilp_bound),
        // Mean rows: 1 only when every pack was proven optimal.
        f.ilp_proven_packs ? std::string(*f.ilp_proven_packs == r.packs ? "1" : "0") : std::string()};
    v.insert(v.end(), figs.begin(), figs.end());
  } else {
    v.resize(compare_csv_columns().size() - 3);  // every figure empty; error and the notes follow
  }
  v.push_back(csv_text(r.error));
  v.push_back(csv_text(r.note));
  v.push_back(csv_text(r.solver_note));
  return v;
}

}  // namespace

void write_compare_csv(const std::filesystem::path& file, const CompareResult& res) {
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (std::size_t i = 0; i < cells.size(); ++i) out << (i ? "," : "") << cells[i];
    out << "\n";
  };
  line(compare_csv_columns());
  for (const auto& r : res.per_pack) line(record(r));
  for (const auto& r : res.aggregated) line(record(r));
  write_file_atomic(file, out.str());
}

}  // namespace cpsched::cli
