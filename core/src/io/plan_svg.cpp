// Pictures of an assignment: the Q x KV plane per head group, coloured by the
// computing rank (hand-written SVG).
#include "cpsched/io/xml_escape.hpp"
#include "cpsched/io/plan_svg.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "cpsched/io/atomic_file.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/slice_clip.hpp"

namespace cpsched {

namespace {

double gib(Bytes b) { return static_cast<double>(b) / static_cast<double>(Bytes{1} << 30); }

// Outline of a tight slice in (k, q) plane coordinates, as a closed polygon
// (rows are drawn as continuous strips, so the staircase becomes a diagonal).
std::vector<std::pair<double, double>> outline(const Slice& s) {
  const auto x0 = static_cast<double>(s.q.begin), x1 = static_cast<double>(s.q.end);
  const auto y0 = static_cast<double>(s.k.begin), y1 = static_cast<double>(s.k.end);
  const double lq = x1 - x0;
  switch (s.type) {
    case MaskType::full: return {{y0, x0}, {y1, x0}, {y1, x1}, {y0, x1}};
    case MaskType::causal: return {{y0, x0}, {y1 - lq, x0}, {y1, x1}, {y0, x1}};
    case MaskType::inv_causal: return {{y0, x0}, {y1, x0}, {y1, x1}, {y0 + lq, x1}};
    case MaskType::bi_causal: return {{y0, x0}, {y1 - lq, x0}, {y1, x1}, {y0 + lq, x1}};
  }
  return {};
}

std::vector<int> groups_to_draw(const TaskGrid& g, const SvgOptions& opt) {
  const int G = g.num_groups();
  std::vector<int> out;
  if (opt.groups.empty()) {
    for (int i = 0; i < std::min({G, std::max(1, opt.max_groups), kSvgMaxPanels}); ++i) out.push_back(i);
    return out;
  }
  if (opt.groups.size() > static_cast<std::size_t>(kSvgMaxPanels))
    throw Error(fmt::format("svg: {} head groups asked; one picture draws at most {} (write several)",
                            opt.groups.size(), kSvgMaxPanels));
  for (int x : opt.groups) {
    if (x < 0 || x >= G)
      throw Error(fmt::format("svg: head group {} does not exist (the grid has {} group{})", x, G, G == 1 ? "" : "s"));
    out.push_back(x);
  }
  return out;
}

// Tasks and slice pieces a panel would draw one by one.
std::pair<std::int64_t, std::int64_t> panel_load(const TaskGrid& g, int grp) {
  const auto& cells = g.cells();
  const auto G = static_cast<std::size_t>(g.num_groups());
  std::int64_t tasks = 0, pieces = 0;
  for (std::size_t c = 0; c < cells.size(); ++c) {
    const Cell& cell = g.cell_of(static_cast<TaskId>(c * G + static_cast<std::size_t>(grp)));
    if (cell.area == 0) continue;
    ++tasks;
    pieces += std::max<std::int64_t>(1, static_cast<std::int64_t>(cell.pieces.size()));
  }
  return {tasks, pieces};
}

// The aggregated panel: (q host rank, kv host rank) squares, ranks grouped
// `tile` to a side, each coloured by the rank computing most of its area
// (ties: the lowest rank).
void aggregated_panel(std::string& o, const Assignment& a, int grp, double x0, double y0, double panel) {
  const TaskGrid& g = *a.grid;
  const int P = g.cp_size();
  const auto side_max = static_cast<int>(std::sqrt(static_cast<double>(kSvgMaxTiles)));
  const int tile = (P + side_max - 1) / side_max, n = (P + tile - 1) / tile;
  const auto G = static_cast<std::size_t>(g.num_groups());
  // (square, computing rank) -> area.
  std::unordered_map<std::uint64_t, Token> area;
  for (std::size_t c = 0; c < g.cells().size(); ++c) {
    const auto t = static_cast<TaskId>(c * G + static_cast<std::size_t>(grp));
    const Token ar = g.area(t);
    if (ar == 0) continue;
    const std::uint64_t sq = static_cast<std::uint64_t>(g.q_host(t) / tile) * static_cast<std::uint64_t>(n) +
                             static_cast<std::uint64_t>(g.k_host(t) / tile);
    area[sq * static_cast<std::uint64_t>(P) + static_cast<std::uint64_t>(a.rank[static_cast<std::size_t>(t)])] += ar;
  }
  std::vector<std::pair<Token, Rank>> best(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), {0, -1});
  for (const auto& [key, ar] : area) {
    const std::size_t sq = key / static_cast<std::uint64_t>(P);
    const auto r = static_cast<Rank>(key % static_cast<std::uint64_t>(P));
    auto& b = best[sq];
    if (ar > b.first || (ar == b.first && (b.second < 0 || r < b.second))) b = {ar, r};
  }
  const double px = panel / n;
  std::map<Rank, std::string> paths;
  for (std::size_t sq = 0; sq < best.size(); ++sq) {
    if (best[sq].second < 0) continue;
    const double x = x0 + static_cast<double>(sq % static_cast<std::size_t>(n)) * px;
    const double y = y0 + static_cast<double>(sq / static_cast<std::size_t>(n)) * px;
    paths[best[sq].second] += fmt::format("M{:.1f} {:.1f}h{:.2f}v{:.2f}h{:.2f}Z", x, y, px, px, -px);
  }
  for (const auto& [r, d] : paths) o += fmt::format("<path fill=\"{}\" d=\"{}\"/>\n", rank_colour(r, P), d);
  // The diagonal: squares whose q and kv ranks are the same (local work).
  std::string diag;
  for (int i = 0; i < n; ++i)
    diag += fmt::format("M{:.1f} {:.1f}h{:.2f}v{:.2f}h{:.2f}Z", x0 + i * px, y0 + i * px, px, px, -px);
  o += fmt::format("<path stroke=\"#202020\" stroke-width=\"0.5\" fill=\"none\" d=\"{}\"/>\n", diag);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\">aggregated: q x kv host ranks{}</text>\n", x0,
                   y0 + panel + 14, tile > 1 ? fmt::format(", {} per square", tile) : std::string());
}

// Where a panel is drawn: its top-left corner and side in pixels, and the
// pixels per token of the Q x KV plane.
struct Frame {
  double x0, y0, panel, scale;
  double X(double k) const { return x0 + k * scale; }
  double Y(double q) const { return y0 + q * scale; }
};

// The title and the figures of the plan, above the panels.
void figures(std::string& o, const TaskGrid& g, const Metrics& m, const SvgOptions& opt, double left) {
  const Problem& p = g.problem();
  const int P = g.cp_size(), G = g.num_groups();
  std::string title = opt.title.empty() ? std::string("cpsched plan") : opt.title;
  std::string what = fmt::format("P = {}, S = {}, heads {}:{}, {} head group{}{}", P, p.seqlen(), p.heads.q,
                                 p.heads.kv, G, G == 1 ? "" : "s", g.flattened() ? " (flattened)" : "");
  if (!opt.solver.empty()) what = "solver " + opt.solver + ", " + what;
  if (opt.stages > 0) what += fmt::format(", {} remote stage{}", opt.stages, opt.stages == 1 ? "" : "s");
  o += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", left,
                   xml_escape(title));
  o += fmt::format("<text x=\"{}\" y=\"38\">{}</text>\n", left, xml_escape(what));
  o += fmt::format(
      "<text x=\"{}\" y=\"56\">forward: total send {:.3f} GiB, bottleneck {:.3f} GiB; backward: total send {:.3f} "
      "GiB, bottleneck {:.3f} GiB</text>\n",
      left, gib(m.fwd.total_send), gib(m.fwd.bottleneck), gib(m.bwd.total_send), gib(m.bwd.bottleneck));
  o += fmt::format(
      "<text x=\"{}\" y=\"74\">imbalance {:.3f}, stage-0 share {:.1f} %{}; outlined: host cells, dot: task run on "
      "its host</text>\n",
      left, m.imbalance, 100.0 * m.stage0_share, opt.feasible ? "" : " (balance target not met)");
}

// Appends the outline of a cell's unmasked region (q block qb, kv block kb)
// to the path `d`. tight: scratch.
void cell_outline(std::string& d, const Cell& cell, Range qb, Range kb, const Frame& f, std::vector<Slice>& tight) {
  if (cell.pieces.empty())  // index masks: the block pair as a whole
    d += fmt::format("M{:.1f} {:.1f}H{:.1f}V{:.1f}H{:.1f}Z", f.X(static_cast<double>(kb.begin)),
                     f.Y(static_cast<double>(qb.begin)), f.X(static_cast<double>(kb.end)),
                     f.Y(static_cast<double>(qb.end)), f.X(static_cast<double>(kb.begin)));
  for (const Slice& s : cell.pieces) {
    tight.clear();
    band_to_slices(clip(band_of(s), qb, kb), tight);
    for (const Slice& x : tight) {
      const auto pts = outline(x);
      for (std::size_t i = 0; i < pts.size(); ++i)
        d += fmt::format("{}{:.1f} {:.1f}", i == 0 ? "M" : "L", f.X(pts[i].first), f.Y(pts[i].second));
      d += "Z";
    }
  }
}

// Unmasked regions of head group grp, one path per computing rank; returns
// the centres of the tasks run on their host (q and kv block on that rank).
std::vector<std::pair<double, double>> rank_regions(std::string& o, const Assignment& a, int grp, const Frame& f) {
  const TaskGrid& g = *a.grid;
  const Sharding& sh = g.sharding();
  const int G = g.num_groups();
  const auto& cells = g.cells();
  std::vector<Slice> tight;
  std::map<Rank, std::string> paths;
  std::vector<std::pair<double, double>> dots;
  for (std::size_t c = 0; c < cells.size(); ++c) {
    const auto t = static_cast<TaskId>(c * static_cast<std::size_t>(G) + static_cast<std::size_t>(grp));
    const Cell& cell = g.cell_of(t);  // the task's own (groups may see different masks)
    if (cell.area == 0) continue;
    const Rank r = a.rank[static_cast<std::size_t>(t)];
    const Range qb = sh.blocks[static_cast<std::size_t>(cell.qblock)];
    const Range kb = sh.blocks[static_cast<std::size_t>(cell.kblock)];
    cell_outline(paths[r], cell, qb, kb, f, tight);
    if (g.q_host(t) == r && g.k_host(t) == r)
      dots.push_back(
          {f.X(0.5 * static_cast<double>(kb.begin + kb.end)), f.Y(0.5 * static_cast<double>(qb.begin + qb.end))});
  }
  for (const auto& [r, d] : paths)
    if (!d.empty()) o += fmt::format("<path fill=\"{}\" d=\"{}\"/>\n", rank_colour(r, g.cp_size()), d);
  return dots;
}

// Block edges, then host cells (q and kv block hosted by the same rank),
// where there are few enough to draw.
void block_grid(std::string& o, const Sharding& sh, int P, const Frame& f) {
  const int nb = sh.num_blocks();
  std::int64_t host_cells = 0;
  {
    std::vector<std::int64_t> per_rank(static_cast<std::size_t>(P), 0);
    for (int b = 0; b < nb; ++b) ++per_rank[static_cast<std::size_t>(sh.host[static_cast<std::size_t>(b)])];
    for (std::int64_t x : per_rank) host_cells += x * x;
  }
  if (nb > 512 || host_cells > kSvgMaxTasks) return;
  std::string lines;
  for (int b = 1; b < nb; ++b) {
    const double v = static_cast<double>(sh.blocks[static_cast<std::size_t>(b)].begin);
    lines += fmt::format("M{:.1f} {:.1f}V{:.1f}M{:.1f} {:.1f}H{:.1f}", f.X(v), f.y0, f.y0 + f.panel, f.x0, f.Y(v),
                         f.x0 + f.panel);
  }
  o += fmt::format("<path stroke=\"#bbbbbb\" stroke-width=\"0.5\" fill=\"none\" d=\"{}\"/>\n", lines);
  std::string host;
  for (int qb = 0; qb < nb; ++qb)
    for (int kb = 0; kb < nb; ++kb)
      if (sh.host[static_cast<std::size_t>(qb)] == sh.host[static_cast<std::size_t>(kb)]) {
        const Range q = sh.blocks[static_cast<std::size_t>(qb)], k = sh.blocks[static_cast<std::size_t>(kb)];
        host += fmt::format("M{:.1f} {:.1f}H{:.1f}V{:.1f}H{:.1f}Z", f.X(static_cast<double>(k.begin)),
                            f.Y(static_cast<double>(q.begin)), f.X(static_cast<double>(k.end)),
                            f.Y(static_cast<double>(q.end)), f.X(static_cast<double>(k.begin)));
      }
  o += fmt::format("<path stroke=\"#202020\" stroke-width=\"1\" fill=\"none\" d=\"{}\"/>\n", host);
}

// Dots on the tasks run on their host, where cells are large enough to hold one.
void host_dots(std::string& o, const std::vector<std::pair<double, double>>& dots, int nb, const Frame& f) {
  const double cell_px = f.panel / std::max(1, nb);
  if (cell_px < 4) return;
  const double rad = std::min(3.5, cell_px / 5);
  std::string d;
  for (auto [x, y] : dots)
    d += fmt::format("M{:.1f} {:.1f}a{:.1f} {:.1f} 0 1 0 {:.1f} 0a{:.1f} {:.1f} 0 1 0 {:.1f} 0", x - rad, y, rad, rad,
                     2 * rad, rad, rad, -2 * rad);
  if (!d.empty()) o += fmt::format("<path fill=\"white\" stroke=\"#202020\" stroke-width=\"0.6\" d=\"{}\"/>\n", d);
}

// The panel of head group grp.
void group_panel(std::string& o, const Assignment& a, int grp, const Frame& f) {
  const TaskGrid& g = *a.grid;
  const double x0 = f.x0, y0 = f.y0, panel = f.panel;
  o += fmt::format("<g>\n<text x=\"{:.1f}\" y=\"{:.1f}\" font-weight=\"bold\">{}</text>\n", x0, y0 - 5,
                   g.flattened() ? fmt::format("head group {}", grp) : std::string("all heads"));
  o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#f4f4f4\"/>\n", x0, y0,
                   panel, panel);
  // Too many shapes to draw one by one: the rank-pair view (plan_svg.hpp's bound).
  if (const auto [tasks, pieces] = panel_load(g, grp); tasks > kSvgMaxTasks || pieces > kSvgMaxPieces) {
    aggregated_panel(o, a, grp, x0, y0, panel);
    o += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#202020\"/>\n</g>\n",
        x0, y0, panel, panel);
    return;
  }
  const std::vector<std::pair<double, double>> dots = rank_regions(o, a, grp, f);
  block_grid(o, g.sharding(), g.cp_size(), f);
  host_dots(o, dots, g.sharding().num_blocks(), f);
  o += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#202020\"/>\n", x0,
      y0, panel, panel);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">KV</text>\n", x0 + panel, y0 + panel + 14);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">Q</text>\n</g>\n", x0 - 4, y0 + 12);
}

// Legend: rank colours, per_row to a row, from (left, ly).
void legend(std::string& o, int P, double left, double ly, int per_row, int legend_rows) {
  o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-weight=\"bold\">computing rank</text>\n", left, ly);
  for (Rank r = 0; r < std::min(P, kSvgMaxLegend); ++r) {
    const double x = left + 58.0 * (r % per_row), y = ly + 8 + 20.0 * (r / per_row);
    o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"14\" height=\"14\" fill=\"{}\"/>", x, y,
                     rank_colour(r, P));
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">r{}</text>\n", x + 18, y + 11, r);
  }
  if (P > kSvgMaxLegend)
    o += fmt::format("<text x=\"{}\" y=\"{:.1f}\">... and {} more ranks (rank r's colour: golden-angle hue r x 137.5 "
                     "degrees)</text>\n",
                     left, ly + 8 + 20.0 * legend_rows + 12, P - kSvgMaxLegend);
}

}  // namespace

std::string rank_colour(Rank r, int cp_size) {
  // Golden-angle hues keep neighbouring ranks apart; three lightness levels
  // separate ranks whose hues come close when P is large.
  (void)cp_size;
  const double h = std::fmod(static_cast<double>(r) * 137.50776, 360.0);
  const double s = 0.62, l = r % 3 == 0 ? 0.52 : (r % 3 == 1 ? 0.40 : 0.64);
  const double c = (1 - std::fabs(2 * l - 1)) * s, hp = h / 60.0;
  const double x = c * (1 - std::fabs(std::fmod(hp, 2.0) - 1));
  double rgb[3] = {0, 0, 0};
  const int sector = static_cast<int>(hp) % 6;
  const double tab[6][3] = {{c, x, 0}, {x, c, 0}, {0, c, x}, {0, x, c}, {x, 0, c}, {c, 0, x}};
  for (int i = 0; i < 3; ++i) rgb[i] = tab[sector][i] + (l - c / 2);
  auto byte = [](double v) { return static_cast<int>(std::lround(std::clamp(v, 0.0, 1.0) * 255)); };
  return fmt::format("#{:02x}{:02x}{:02x}", byte(rgb[0]), byte(rgb[1]), byte(rgb[2]));
}

std::string plan_svg(const Assignment& a, const Metrics& m, const SvgOptions& opt) {
  if (!a.grid) throw Error("svg: the assignment has no grid");
  const TaskGrid& g = *a.grid;
  const Problem& p = g.problem();
  const int P = g.cp_size();
  const std::vector<int> groups = groups_to_draw(g, opt);
  const double panel = std::max(120, opt.panel_px), gap = 36, left = 28, top = 92;
  const double S = static_cast<double>(std::max<Token>(1, p.seqlen())), scale = panel / S;
  const auto n = static_cast<double>(groups.size());
  const int per_row = std::max(1, static_cast<int>((n * (panel + gap) - gap) / 58));
  const int legend_rows = (std::min(P, kSvgMaxLegend) + per_row - 1) / per_row;
  const double width = std::max(700.0, left + n * (panel + gap) + 8);
  const double height = top + panel + 34 + 20.0 * legend_rows + 36 + (P > kSvgMaxLegend ? 20 : 0);

  std::string o;
  o += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
      width, height, width, height);
  o += fmt::format("<rect width=\"{:.0f}\" height=\"{:.0f}\" fill=\"white\"/>\n", width, height);
  figures(o, g, m, opt, left);
  for (std::size_t pi = 0; pi < groups.size(); ++pi)
    group_panel(o, a, groups[pi], Frame{left + static_cast<double>(pi) * (panel + gap), top, panel, scale});
  legend(o, P, left, top + panel + 30, per_row, legend_rows);
  o += "</svg>\n";
  return o;
}

void write_plan_svg(const std::filesystem::path& file, const Assignment& a, const Metrics& m, const SvgOptions& opt) {
  write_file_atomic(file, plan_svg(a, m, opt));
}

}  // namespace cpsched
