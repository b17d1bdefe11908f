#include "cpsched/io/xml_escape.hpp"
#include "gantt_svg.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpsched/base/error.hpp"

namespace cpsched::sim {

namespace {

constexpr double kWidth = 1200, kLeft = 80, kRight = 20;
constexpr double kRow = 9, kLane = 2 * kRow + 5;

const char* color(const TimedOp& o) {
  static const char* kStages[] = {"#4c78a8", "#54a24b", "#88d27a", "#b279a2", "#9d755d", "#bab0ac"};
  switch (o.kind) {
    case OpKind::compute: return kStages[std::min(o.stage, 5)];
    case OpKind::cast: return "#f58518";
    case OpKind::reduce: return "#e45756";
    case OpKind::pack: return "#ffbf79";
    case OpKind::merge: return "#72b7b2";
  }
  return "#000";
}

std::string op_name(const TimedOp& o) {
  switch (o.kind) {
    case OpKind::compute: return o.stage == 0 ? "compute stage 0 (local)" : fmt::format("compute stage {}", o.stage);
    case OpKind::cast: return fmt::format("group-cast stage {}", o.stage);
    case OpKind::reduce: return fmt::format("group-reduce after stage {}", o.stage);
    case OpKind::pack: return fmt::format("pack the sends of the next collective (stage {})", o.stage);
    case OpKind::merge: return "merge the reduced partial outputs (pass end)";
  }
  return "?";
}

// A tick step of 1, 2 or 5 x 10^k giving about `n` ticks over `span`.
double tick_step(double span, int n) {
  if (span <= 0) return 1;
  const double raw = span / n, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

// Appends one pass panel at height y; returns the height used.
double panel(std::string& svg, const PassTimeline& pt, const std::vector<int>& shown, double y,
             const std::string& heading) {
  // The profile's numbers are finite and bounded (hardware/profile.cpp), so
  // every time is; a timeline built by hand might not be.
  if (!std::isfinite(pt.makespan()))
    throw Error(fmt::format("sim: {}: the pass takes {} s, not a finite time; nothing to draw", heading,
                            pt.makespan()));
  const double span = std::max(pt.makespan(), 1e-12);
  const bool ms = span >= 1e-3;
  const double unit = ms ? 1e3 : 1e6;
  const char* uname = ms ? "ms" : "us";
  const double plot_w = kWidth - kLeft - kRight;
  auto x_of = [&](double t) { return kLeft + t / span * plot_w; };
  svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-weight=\"bold\">{}</text>\n", kLeft, y + 14,
                     xml_escape(heading));
  const double top = y + 24, height = static_cast<double>(shown.size()) * kLane;
  // Time axis with grid lines.
  // Ticks by count, not by adding up a step: at most about 20 lines.
  const double step = tick_step(span * unit, 10);
  const auto ticks = static_cast<int>(std::min(50.0, std::floor((span * unit + 1e-9) / step)));
  for (int i = 0; i <= ticks; ++i) {
    const double v = i * step;
    const double x = x_of(v / unit);
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>\n", x, top,
                       top + height);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"10\">{:g}</text>\n", x,
                       top + height + 12, v);
  }
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"10\">time ({})</text>\n",
                     kWidth - kRight, top + height + 24, uname);
  for (std::size_t lane = 0; lane < shown.size(); ++lane) {
    const int r = shown[lane];
    const RankTimeline& rt = pt.ranks[static_cast<std::size_t>(r)];
    const double ly = top + static_cast<double>(lane) * kLane;
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"10\">rank {}</text>\n", kLeft - 6,
                       ly + kRow + 3, r);
    for (int row = 0; row < 2; ++row)
      for (const TimedOp& o : row == 0 ? rt.compute : rt.comm) {
        const double x0 = x_of(o.start), w = std::max(0.5, x_of(o.end) - x0);
        std::string tip = fmt::format("rank {}: {}, {:.4g} - {:.4g} {}", r, op_name(o), o.start * unit, o.end * unit,
                                      uname);
        if (o.kind != OpKind::compute) tip += fmt::format(", {:.4g} MB", o.bytes / 1e6);
        if (o.messages > 0) tip += fmt::format(", {} messages", o.messages);
        svg += fmt::format(
            "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"#fff\" "
            "stroke-width=\"0.3\"><title>{}</title></rect>\n",
            x0, ly + row * kRow, w, kRow - 1, color(o), xml_escape(tip));
      }
  }
  return 24 + height + 32;
}

}  // namespace

std::string gantt_svg(const Timeline& t, const GanttOptions& opt) {
  const int P = static_cast<int>(t.fwd.ranks.size());
  std::vector<int> shown(static_cast<std::size_t>(P));
  std::iota(shown.begin(), shown.end(), 0);
  std::string shown_note;
  if (opt.max_ranks > 0 && P > opt.max_ranks) {
    auto total = [&](int r) {
      return t.fwd.ranks[static_cast<std::size_t>(r)].end + t.bwd.ranks[static_cast<std::size_t>(r)].end;
    };
    std::stable_sort(shown.begin(), shown.end(), [&](int a, int b) { return total(a) > total(b); });
    shown.resize(static_cast<std::size_t>(opt.max_ranks));
    std::sort(shown.begin(), shown.end());
    shown_note = fmt::format("showing the {} slowest of {} ranks", opt.max_ranks, P);
  }
  std::vector<std::string> head;
  if (!opt.title.empty()) head.push_back(opt.title);
  for (const std::string& n : opt.notes) head.push_back(n);
  if (!shown_note.empty()) head.push_back(shown_note);

  std::string body;
  double y = 10 + 16.0 * static_cast<double>(head.size()) + 22;  // heading lines, then the legend
  y += panel(body, t.fwd, shown, y, fmt::format("forward: {:.4g} ms", t.fwd.makespan() * 1e3));
  y += panel(body, t.bwd, shown, y, fmt::format("backward: {:.4g} ms", t.bwd.makespan() * 1e3));

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kWidth, y);
  double hy = 10;
  for (std::size_t i = 0; i < head.size(); ++i, hy += 16)
    svg += fmt::format("<text x=\"10\" y=\"{:.1f}\"{}>{}</text>\n", hy + 12, i == 0 ? " font-weight=\"bold\"" : "",
                       xml_escape(head[i]));
  // Legend: upper row of a lane is compute, lower row communication.
  // Legend: one entry per compute stage drawn (colours of stages >= 5 repeat the last).
  int last_stage = 0;
  for (const PassTimeline* pt : {&t.fwd, &t.bwd})
    for (const RankTimeline& rt : pt->ranks)
      for (const TimedOp& o : rt.compute)
        if (o.kind == OpKind::compute) last_stage = std::max(last_stage, std::min(o.stage, 5));
  std::vector<std::pair<std::string, std::string>> legend;
  for (int s = 0; s <= last_stage; ++s)
    legend.emplace_back(color(TimedOp{OpKind::compute, s, 0, 0, 0}),
                        s == 0 ? "compute stage 0 (local)" : s == 5 ? "compute stage 5+" : fmt::format("compute stage {}", s));
  legend.emplace_back("#f58518", "group-cast");
  legend.emplace_back("#e45756", "group-reduce");
  legend.emplace_back("#ffbf79", "pack");
  legend.emplace_back("#72b7b2", "merge");
  double lx = 10;
  for (const auto& [c, label] : legend) {
    svg += fmt::format("<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"12\" height=\"10\" fill=\"{}\"/>", lx, hy + 2, c);
    svg += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" font-size=\"11\">{}</text>\n", lx + 16, hy + 11, label);
    lx += 30 + 6.5 * static_cast<double>(label.size());
  }
  svg += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#555\">(each lane: compute above, "
                     "communication below)</text>\n",
                     lx, hy + 11);
  svg += body;
  svg += "</svg>\n";
  return svg;
}

}  // namespace cpsched::sim
