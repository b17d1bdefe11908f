// The charts of `cpsched compare`: per (heads, mask), each metric against P
// with one line per solver (and stage count where the metric depends on it).
// Step time and exposed communication are drawn per hardware profile; so is
// everything when the solvers were solved per profile (a cost model that
// takes `hardware`), else the volumes are the same on every profile and are
// drawn once.
#include <cctype>
#include <fmt/format.h>

#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "compare/report.hpp"
#include "compare/svg.hpp"
#include "cpsched/io/atomic_file.hpp"
#include "cpsched/base/error.hpp"
#include "commands/report.hpp"

namespace cpsched::cli {

namespace {

// A dashed black line without markers: a reference drawn beside the solvers.
ChartSeries reference_line(const std::string& name) {
  ChartSeries s;
  s.name = name;
  s.color = "#000000";
  s.dash = "7 4";
  s.markers = false;
  return s;
}


// Okabe-Ito: distinguishable with the common colour-vision deficiencies.
const char* const kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#8C564B", "#7F7F7F"};

struct Metric {
  std::string id;      // file name part
  std::string title;
  std::string y_label;
  enum class Scale { linear, log, auto_log } scale;  // auto_log: log when values span a factor 5 or more
  bool per_stages;     // depends on the plan's stage count (else drawn for the first one)
  bool per_hardware;   // depends on the hardware profile even for the same plan
  std::function<std::optional<double>(const CompareFigures&)> value;
};

std::vector<Metric> metrics(bool timing) {
  std::vector<Metric> m = {
      {"fwd_send", "Forward total send", "GiB (all ranks)", Metric::Scale::log, false, false,
       [](const CompareFigures& f) -> std::optional<double> { return gib(f.fwd_send); }},
      {"bwd_send", "Backward total send", "GiB (all ranks)", Metric::Scale::log, false, false,
       [](const CompareFigures& f) -> std::optional<double> { return gib(f.bwd_send); }},
      {"fwd_bottleneck", "Forward bottleneck: max over ranks of max(send, recv)", "GiB", Metric::Scale::log, false, false,
       [](const CompareFigures& f) -> std::optional<double> { return gib(f.fwd_bottleneck); }},
      {"latency", "Solve latency: grid + solve + plan build (median)", "ms", Metric::Scale::log, true, false,
       [](const CompareFigures& f) -> std::optional<double> { return f.latency_ms; }},
      {"imbalance", "Compute imbalance: max load / mean load (worst pack)", "max / mean", Metric::Scale::auto_log, false, false,
       [](const CompareFigures& f) -> std::optional<double> { return f.imbalance; }},
  };
  if (timing) {
    m.push_back({"step_time", "Simulated step time: forward + backward", "ms", Metric::Scale::log, true, true,
                 [](const CompareFigures& f) -> std::optional<double> {
                   if (!f.fwd_step_ms || !f.bwd_step_ms) return std::nullopt;
                   return *f.fwd_step_ms + *f.bwd_step_ms;
                 }});
    m.push_back({"exposed_comm", "Exposed communication: forward + backward, worst rank", "ms", Metric::Scale::auto_log, true, true,
                 [](const CompareFigures& f) -> std::optional<double> {
                   if (!f.fwd_exposed_ms || !f.bwd_exposed_ms) return std::nullopt;
                   return *f.fwd_exposed_ms + *f.bwd_exposed_ms;
                 }});
  }
  return m;
}

std::string shorten(const std::string& s, std::size_t n) {
  std::string flat;
  for (char c : s) flat += c == '\n' ? ' ' : c;
  return flat.size() <= n ? flat : flat.substr(0, n - 3) + "...";
}

// A file-name part for a profile: a bundled name as is, a path by its stem;
// characters other than [A-Za-z0-9_-] become '_'.
std::string hardware_slug(const std::string& hw) {
  std::string s = std::filesystem::path(hw).stem().string();
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') c = '_';
  return s.empty() ? "hw" : s;
}

}  // namespace

std::vector<ChartFile> write_compare_charts(const std::filesystem::path& dir, const CompareResult& res) {
  // Solver colours follow the sweep's solver order, the same in every chart;
  // stage counts differ by dash pattern.
  std::vector<std::string> solvers;
  std::set<std::tuple<int, int, int>> heads;
  std::vector<int> stages;
  std::set<std::pair<int, std::string>> variants;  // (layout, uses): one chart set each
  for (const auto& r : res.aggregated) {
    variants.insert({static_cast<int>(r.layout), r.uses.str()});
    if (std::find(solvers.begin(), solvers.end(), r.solver) == solvers.end()) solvers.push_back(r.solver);
    if (std::find(stages.begin(), stages.end(), r.stages) == stages.end()) stages.push_back(r.stages);
    heads.insert({r.heads.q, r.heads.kv, r.heads.dim});
  }
  auto color = [&](const std::string& s) {
    const auto i = static_cast<std::size_t>(std::find(solvers.begin(), solvers.end(), s) - solvers.begin());
    return std::string(kPalette[i % (sizeof(kPalette) / sizeof(kPalette[0]))]);
  };
  const char* const kDashes[] = {"", "7 4", "2 3", "10 3 2 3"};

  // Groups (heads, mask, layout, uses) in order of appearance.
  using Key = std::tuple<int, int, int, std::string, int, std::string>;
  std::vector<Key> order;
  std::map<Key, std::vector<const CompareRow*>> groups;
  for (const auto& r : res.aggregated) {
    const Key k{r.heads.q, r.heads.kv, r.heads.dim, r.mask, static_cast<int>(r.layout), r.uses.str()};
    if (!groups.count(k)) order.push_back(k);
    groups[k].push_back(&r);
  }

  // The hardware axis ("" when there is none) and a distinct file-name part per profile.
  std::vector<std::string> hws = res.hardware.empty() ? std::vector<std::string>{""} : res.hardware;
  std::map<std::string, std::string> slug;
  {
    std::set<std::string> used;
    for (std::size_t i = 0; i < hws.size(); ++i) {
      std::string sl = hardware_slug(hws[i]);
      if (!used.insert(sl).second) used.insert(sl += fmt::format("_{}", i));
      slug[hws[i]] = sl;
    }
  }

  std::vector<ChartFile> files;
  for (const Key& k : order) {
    const auto& all_rows = groups[k];
    const CompareRow& first = *all_rows.front();
    std::string stem = first.mask;
    if (heads.size() > 1) stem += fmt::format("_{}x{}d{}", first.heads.q, first.heads.kv, first.heads.dim);
    std::string sub = fmt::format("mask {}, heads {}:{}, D {}", first.mask, first.heads.q, first.heads.kv, first.heads.dim);
    if (first.packs > 1) sub += fmt::format(", mean of {} packs", first.packs);
    if (variants.size() > 1) {
      stem += fmt::format("_{}_uses_{}", to_string(first.layout), first.uses.str());
      sub += fmt::format(", layout {}, uses {}", to_string(first.layout), first.uses.str());
    }
    std::set<double> ps;
    for (const CompareRow* r : all_rows) ps.insert(r->cp_size);

    for (std::size_t hi = 0; hi < hws.size(); ++hi) {
      const std::string& hw = hws[hi];
      std::vector<const CompareRow*> rows;
      for (const CompareRow* r : all_rows)
        if (r->hardware == hw) rows.push_back(r);
      for (const Metric& m : metrics(!res.timing_label.empty())) {
        // Drawn per profile, or once (from the first profile's rows: the same plans).
        const bool per_hw = !hw.empty() && (m.per_hardware || res.solved_per_hardware);
        if (!per_hw && hi > 0) continue;
        LineChart c;
        c.title = m.title;
        c.subtitle = per_hw ? sub + ", hardware " + hw : sub;
        if (!m.per_stages && stages.size() > 1) c.subtitle += fmt::format(" (plan with {} stage(s))", stages.front());
        c.x_label = "CP size P (ranks)";
        c.y_label = m.y_label;
        c.log_x = ps.size() > 1 && *ps.rbegin() / *ps.begin() >= 4;
        c.log_y = m.scale == Metric::Scale::log;
        c.x_ticks.assign(ps.begin(), ps.end());
        const std::size_t nst = m.per_stages ? stages.size() : 1;
        for (const auto& s : solvers)
          for (std::size_t si = 0; si < nst; ++si) {
            ChartSeries line;
            line.name = nst > 1 ? fmt::format("{}, {} st.", s, stages[si]) : s;
            line.color = color(s);
            line.dash = kDashes[si % 4];
            std::string failure;
            for (const CompareRow* r : rows) {
              if (r->solver != s || r->stages != stages[si]) continue;
              if (!r->ok) {
                if (failure.empty() && !r->skipped) failure = fmt::format("P = {}: {}", r->cp_size, r->error);
                continue;
              }
              if (const auto v = m.value(r->f)) line.points.emplace_back(r->cp_size, *v);
            }
            if (!failure.empty() && si == 0) c.notes.push_back(shorten(fmt::format("{} failed at {}", s, failure), 110));
            c.series.push_back(std::move(line));
          }
        if (m.scale == Metric::Scale::auto_log) {
          double lo = 0, hi_v = 0;
          for (const auto& line : c.series)
            for (const auto& pt : line.points) {
              if (pt.second > 0 && (lo == 0 || pt.second < lo)) lo = pt.second;
              hi_v = std::max(hi_v, pt.second);
            }
          c.log_y = lo > 0 && hi_v / lo >= 5;
        }
        if (m.id == "fwd_send") {
          // The reference every reduction is stated against.
          ChartSeries usp = reference_line("USP closed form");
          std::map<int, double> by_p;
          for (const CompareRow* r : rows)
            if (r->ok) by_p[r->cp_size] = gib(r->f.usp_closed_fwd);
          for (const auto& [p, v] : by_p) usp.points.emplace_back(p, v);
          c.series.push_back(std::move(usp));
        }
        if (m.id == "step_time") {
          // What no placement can beat on this profile: the compute bound. It
          // is the same for every solver up to dispatch (cut blocks), so the
          // least over solvers and stage counts stands for the point.
          ChartSeries bound = reference_line("compute bound");
          std::map<int, double> by_p;
          for (const CompareRow* r : rows)
            if (r->ok && r->f.compute_bound_ms) {
              const auto it = by_p.find(r->cp_size);
              if (it == by_p.end() || *r->f.compute_bound_ms < it->second) by_p[r->cp_size] = *r->f.compute_bound_ms;
            }
          for (const auto& [p, v] : by_p) bound.points.emplace_back(p, v);
          if (!bound.points.empty()) {
            c.notes.push_back("dashed: compute bound per P (compute / P, free comm.), least over solvers (equal up to dispatch)");
            c.series.push_back(std::move(bound));
          }
        }
        const std::string file = stem + "_" + m.id + (per_hw && hws.size() > 1 ? "_" + slug[hw] : "") + ".svg";
        write_file_atomic(dir / file, render_line_chart(c));
        files.push_back({file, m.title, per_hw ? sub + ", hardware " + hw : sub});
      }
    }
  }
  return files;
}

}  // namespace cpsched::cli
