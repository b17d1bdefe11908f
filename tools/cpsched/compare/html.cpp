// index.html of a compare report: the tables and every chart, with relative
// links only, so the folder opens in a browser from disk (no server, no scripts).
#include "cpsched/io/xml_escape.hpp"
#include <fmt/format.h>
#include <sstream>

#include "compare/report.hpp"
#include "cpsched/io/atomic_file.hpp"
#include "cpsched/base/error.hpp"

namespace cpsched::cli {

namespace {

const char* kStyle = R"(body{font-family:"DejaVu Sans",Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ccc}h3{font-size:15px}
table{border-collapse:collapse;font-size:13px;margin:8px 0 20px}
th,td{border:1px solid #ddd;padding:3px 7px}th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}tr.failed td{color:#a33}
tr.newp td{border-top:2px solid #999}
.charts{display:flex;flex-wrap:wrap;gap:12px}.charts figure{margin:0}
.charts img{width:540px;border:1px solid #eee}code{background:#f5f5f5;padding:1px 4px}
.note{color:#a33})";

}  // namespace

void write_compare_html(const std::filesystem::path& file, const std::vector<TextTable>& tables,
                        const std::vector<ChartFile>& charts, const ReportContext& ctx) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>cpsched compare</title>\n<style>"
    << kStyle << "</style></head><body>\n";
  h << "<h1>cpsched compare</h1>\n";
  h << "<p>Config <code>" << xml_escape(ctx.config) << "</code>. Regenerate with <code>" << xml_escape(ctx.command)
    << "</code>.<br>Files: <a href=\"results.csv\">results.csv</a> (every pack and the means), "
       "<a href=\"results.md\">results.md</a>; every chart below links to its SVG file.</p>\n";
  h << "<p>Volumes: total bytes sent by all ranks per pass and the bottleneck (largest per-rank max(send, recv)), "
       "GiB. <em>vs USP</em>: forward reduction against USP's closed form; <em>vs usp pl.</em>: against the "
       "<code>usp</code> solver's measured placement. <em>latency</em>: median whole path (grid + solve + plan "
       "build).";
  if (!ctx.timing_label.empty())
    h << " <em>step</em> and <em>exposed</em>: simulated forward + backward time and exposed communication "
         "(worst rank), "
      << xml_escape(ctx.timing_label)
      << ". <em>bound</em>: the compute bound on the section's hardware (total attention compute / P: perfect "
         "balance, free communication); <em>step/bound</em>: how far the step is above it (1 is the ideal; a "
         "ratio of means over packs).";
  h << "</p>\n";
  for (const auto& w : ctx.warnings) h << "<p class=\"note\">note: " << xml_escape(w) << "</p>\n";

  h << "<h2>Tables</h2>\n";
  for (const TextTable& t : tables) {
    h << "<h3>" << xml_escape(t.title) << "</h3>\n<table><tr>";
    for (std::size_t c = 0; c < t.headers.size(); ++c)
      h << "<th>" << xml_escape(t.headers[c]) << (t.units[c].empty() ? "" : "<br>" + xml_escape(t.units[c])) << "</th>";
    h << "</tr>\n";
    std::string prev_p;
    for (const auto& r : t.rows) {
      const bool failed = r.back().rfind("FAILED", 0) == 0;
      std::string cls = failed ? "failed" : "";
      if (!prev_p.empty() && r[0] != prev_p) cls += cls.empty() ? "newp" : " newp";
      prev_p = r[0];
      h << "<tr" << (cls.empty() ? "" : " class=\"" + cls + "\"") << ">";
      for (std::size_t c = 0; c < r.size(); ++c) {
        const bool text = t.headers[c] == "solver" || c + 1 == r.size();
        h << (text ? "<td>" : "<td class=\"num\">") << xml_escape(r[c]) << "</td>";
      }
      h << "</tr>\n";
    }
    h << "</table>\n";
  }

  h << "<h2>Charts</h2>\n";
  std::string group;
  for (const auto& c : charts) {
    if (c.group != group) {
      if (!group.empty()) h << "</div>\n";
      group = c.group;
      h << "<h3>" << xml_escape(group) << "</h3>\n<div class=\"charts\">\n";
    }
    h << "<figure><a href=\"" << xml_escape(c.file) << "\"><img src=\"" << xml_escape(c.file) << "\" alt=\"" << xml_escape(c.title)
      << "\"></a></figure>\n";
  }
  if (!group.empty()) h << "</div>\n";
  h << "</body></html>\n";
  write_file_atomic(file, h.str());
}

}  // namespace cpsched::cli
