#include "cpsched/io/xml_escape.hpp"
#include "compare/svg.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <limits>

namespace cpsched::cli {

namespace {

constexpr double kWidth = 720;
constexpr double kLeft = 78, kRight = 190, kTop = 64, kBottom = 62;
constexpr double kPlotH = 300;
constexpr double kNoteLine = 15;

std::string dash_attr(const std::string& dash) {
  return dash.empty() ? std::string() : " stroke-dasharray=\"" + dash + "\"";
}

// Marker shapes cycle with the series, so that lines drawn on top of each
// other still show every series' markers.
std::string marker(int shape, double x, double y, const std::string& color, const std::string& tip) {
  const std::string t = tip.empty() ? std::string() : "<title>" + tip + "</title>";
  switch (shape % 4) {
    case 1:
      return fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"7\" height=\"7\" fill=\"{}\">{}</rect>", x - 3.5,
                         y - 3.5, color, t);
    case 2:
      return fmt::format("<path d=\"M{:.1f},{:.1f} l4.5,8 h-9 z\" fill=\"{}\">{}</path>", x, y - 5, color, t);
    case 3:
      return fmt::format("<path d=\"M{:.1f},{:.1f} l4.5,4.5 l-4.5,4.5 l-4.5,-4.5 z\" fill=\"{}\">{}</path>", x, y - 4.5,
                         color, t);
    default:
      return fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\">{}</circle>", x, y, color, t);
  }
}

bool same_points(const ChartSeries& a, const ChartSeries& b) {
  if (a.points.size() != b.points.size() || a.points.empty()) return false;
  for (std::size_t i = 0; i < a.points.size(); ++i) {
    const auto& [xa, ya] = a.points[i];
    const auto& [xb, yb] = b.points[i];
    if (xa != xb || std::fabs(ya - yb) > 1e-9 * std::max(std::fabs(ya), std::fabs(yb))) return false;
  }
  return true;
}

std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e6 || a < 1e-3) return fmt::format("{:.0e}", v);
  return fmt::format("{:g}", v);
}

// An axis mapping data values to pixels, linear or log10.
struct Axis {
  bool log = false;
  double lo = 0, hi = 1;       // domain, in data units
  double p0 = 0, p1 = 1;       // pixel positions of lo and hi
  double t(double v) const { return log ? std::log10(v) : v; }
  double px(double v) const {
    const double a = t(lo), b = t(hi);
    return p0 + (t(v) - a) / (b - a) * (p1 - p0);
  }
};

// Largest 1-2-5 step value <= v (floor) or smallest >= v (ceil), for log bounds.
double nice125(double v, bool up) {
  const double e = std::floor(std::log10(v));
  const double base = std::pow(10.0, e);
  const double ms[] = {1, 2, 5, 10};
  if (up) {
    for (double m : ms)
      if (m * base >= v * (1 - 1e-12)) return m * base;
    return 10 * base;
  }
  for (int i = 3; i >= 0; --i)
    if (ms[i] * base <= v * (1 + 1e-12)) return ms[i] * base;
  return base;
}

}  // namespace

std::vector<double> linear_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};  // no axis to tick (the caller drops non-finite data)
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  const double first = std::floor(lo / step + 1e-9) * step;
  // By count (at most a few times `target`): adding up a step could stall where it is below the spacing of doubles.
  for (int i = 0; i <= 4 * std::max(1, target) + 4; ++i) {
    const double v = first + i * step;
    if (v > hi + step * (1 - 1e-9)) break;
    ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    if (v >= hi - step * 1e-9) break;
  }
  return ticks;
}

std::vector<double> log_ticks(double lo, double hi) {
  if (!(lo > 0) || !std::isfinite(lo) || !std::isfinite(hi) || !(hi >= lo)) return {};
  const int e0 = static_cast<int>(std::floor(std::log10(lo) + 1e-9));
  const int e1 = static_cast<int>(std::ceil(std::log10(hi) - 1e-9));
  const double decades = std::log10(hi / lo);
  // Wide ranges: powers of ten only; narrow ones: 1-2-5, or denser still.
  std::vector<double> mant = decades > 3.5 ? std::vector<double>{1} : std::vector<double>{1, 2, 5};
  if (decades <= 1.2) mant = {1, 1.5, 2, 3, 4, 5, 6, 8};
  std::vector<double> out;
  for (int e = e0; e <= e1; ++e)
    for (double m : mant) {
      const double v = m * std::pow(10.0, e);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push_back(v);
    }
  return out;
}

namespace {

// A point a log axis cannot show (value <= 0) or that is not finite: not drawn.
bool undrawable(const LineChart& c, double x, double y) {
  return (c.log_y && !(y > 0)) || (c.log_x && !(x > 0)) || !std::isfinite(y) || !std::isfinite(x);
}

// The range of the drawable points (and of the explicit x ticks).
struct DataRange {
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin;
  double ymin = xmin, ymax = -xmin;
  int dropped = 0;  // points not drawable
};

DataRange data_range(const LineChart& c) {
  DataRange d;
  for (const auto& s : c.series)
    for (const auto& [x, y] : s.points) {
      if (undrawable(c, x, y)) {
        ++d.dropped;
        continue;
      }
      d.xmin = std::min(d.xmin, x);
      d.xmax = std::max(d.xmax, x);
      d.ymin = std::min(d.ymin, y);
      d.ymax = std::max(d.ymax, y);
    }
  for (double x : c.x_ticks) {
    d.xmin = std::min(d.xmin, x);
    d.xmax = std::max(d.xmax, x);
  }
  return d;
}

// Series with identical values hide each other: a note says which.
void note_identical_series(const LineChart& c, std::vector<std::string>& notes) {
  std::vector<bool> grouped(c.series.size(), false);
  for (std::size_t i = 0; i < c.series.size(); ++i) {
    if (grouped[i]) continue;
    std::string names = c.series[i].name;
    int n = 1;
    for (std::size_t j = i + 1; j < c.series.size(); ++j)
      if (!grouped[j] && same_points(c.series[i], c.series[j])) {
        grouped[j] = true;
        names += " = " + c.series[j].name;
        ++n;
      }
    if (n > 1) notes.push_back("same values, drawn on top of each other: " + names);
  }
}

// x: a margin so that the end points do not sit on the frame.
Axis x_axis(bool log, double xmin, double xmax) {
  Axis ax;
  ax.log = log;
  ax.p0 = kLeft;
  ax.p1 = kWidth - kRight;
  if (ax.log) {
    const double f = xmax > xmin ? std::pow(xmax / xmin, 0.05) : 2.0;
    ax.lo = xmin / f;
    ax.hi = xmax * f;
  } else {
    const double pad = xmax > xmin ? 0.05 * (xmax - xmin) : 1.0;
    ax.lo = xmin - pad;
    ax.hi = xmax + pad;
  }
  return ax;
}

// The y axis with its ticks, unlabelled minor grid lines (log scale) and the
// decimals of its tick labels (linear scale).
struct YAxis {
  Axis axis;
  std::vector<double> ticks, minor;
  int decimals = 0;
};

// Unlabelled grid lines at 2..9 x 10^k help reading values between ticks.
std::vector<double> minor_log_lines(double lo, double hi) {
  std::vector<double> out;
  const int e0 = static_cast<int>(std::floor(std::log10(lo)));
  const int e1 = static_cast<int>(std::ceil(std::log10(hi)));
  if (e1 - e0 <= 4)
    for (int e = e0; e <= e1; ++e)
      for (int m = 1; m <= 9; ++m) {
        const double v = m * std::pow(10.0, e);
        if (v > lo && v < hi) out.push_back(v);
      }
  return out;
}

// Linear ticks share the decimals of their step ("1.0, 1.2", not "1, 1.2").
int linear_decimals(const std::vector<double>& yt) {
  int y_decimals = 0;
  if (yt.size() > 1) y_decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(yt[1] - yt[0]) - 1e-9)), 0, 6);
  if (yt.size() > 1 && std::fabs(std::round((yt[1] - yt[0]) * std::pow(10.0, y_decimals)) -
                                 (yt[1] - yt[0]) * std::pow(10.0, y_decimals)) > 1e-6)
    ++y_decimals;  // steps of 2.5 x 10^k need one more
  return y_decimals;
}

// y: ticks on nice values, and the frame a little beyond them so that no
// point sits on the frame.
YAxis y_axis(bool log, double ymin, double ymax) {
  YAxis y;
  Axis& ay = y.axis;
  ay.log = log;
  ay.p0 = kTop + kPlotH;
  ay.p1 = kTop;
  if (ay.log) {
    double lo = nice125(ymin, false), hi = nice125(ymax, true);
    if (hi <= lo) hi = lo * 2;
    y.ticks = log_ticks(lo, hi);
    const double pad = std::pow(hi / lo, 0.03);
    ay.lo = lo / pad;
    ay.hi = hi * pad;
    y.minor = minor_log_lines(ay.lo, ay.hi);
  } else {
    y.ticks = linear_ticks(ymin, ymax);
    const double lo = y.ticks.front(), hi = y.ticks.back() > y.ticks.front() ? y.ticks.back() : y.ticks.front() + 1;
    ay.lo = lo - 0.03 * (hi - lo);
    ay.hi = hi + 0.03 * (hi - lo);
    y.decimals = linear_decimals(y.ticks);
  }
  return y;
}

void chart_header(std::string& o, const LineChart& c, double height) {
  o += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
      kWidth, height);
  o += fmt::format("<title>{}</title>\n", xml_escape(c.title));
  o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", kWidth, height);
  o += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", kLeft,
                   xml_escape(c.title));
  if (!c.subtitle.empty())
    o += fmt::format("<text x=\"{}\" y=\"43\" font-size=\"11\" fill=\"#555\">{}</text>\n", kLeft,
                     xml_escape(c.subtitle));
}

// Grid lines, the frame, tick marks with their labels, the axis labels.
void grid_and_ticks(std::string& o, const LineChart& c, const Axis& ax, const YAxis& y, const std::vector<double>& xt) {
  static constexpr char kLine[] = "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n";
  const Axis& ay = y.axis;
  const std::vector<double>& yt = y.ticks;
  const double x0 = ax.p0, x1 = ax.p1, y0 = ay.p0, y1 = ay.p1;
  o += "<g stroke=\"#f1f1f1\" stroke-width=\"1\">\n";
  for (double v : y.minor) o += fmt::format(kLine, x0, ay.px(v), x1, ay.px(v));
  o += "</g>\n";
  o += "<g stroke=\"#dcdcdc\" stroke-width=\"1\">\n";
  for (double v : yt) o += fmt::format(kLine, x0, ay.px(v), x1, ay.px(v));
  for (double v : xt) o += fmt::format(kLine, ax.px(v), y0, ax.px(v), y1);
  o += "</g>\n";
  o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#333\"/>\n",
                   x0, y1, x1 - x0, y0 - y1);
  o += "<g fill=\"#222\">\n";
  for (double v : yt) {
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#333\"/>", x0 - 5, ay.px(v),
                     x0, ay.px(v));
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", x0 - 8, ay.px(v) + 4,
                     ay.log ? tick_label(v) : fmt::format("{:.{}f}", v, y.decimals));
  }
  for (double v : xt) {
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#333\"/>", ax.px(v), y0,
                     ax.px(v), y0 + 5);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", ax.px(v), y0 + 19,
                     tick_label(v));
  }
  o += "</g>\n";
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}{}</text>\n", (x0 + x1) / 2, y0 + 40,
                   xml_escape(c.x_label), c.log_x ? " (log scale)" : "");
  o += fmt::format("<text transform=\"translate({:.1f},{:.1f}) rotate(-90)\" text-anchor=\"middle\">{}{}</text>\n", 18.0,
                   (y0 + y1) / 2, xml_escape(c.y_label), c.log_y ? " (log scale)" : "");
}

// Series, clipped to the plot area.
void series_lines(std::string& o, const LineChart& c, const Axis& ax, const Axis& ay) {
  const double x0 = ax.p0, x1 = ax.p1, y0 = ay.p0, y1 = ay.p1;
  o += fmt::format("<clipPath id=\"plot\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\"/></clipPath>\n",
                   x0 - 4, y1 - 4, x1 - x0 + 8, y0 - y1 + 8);
  o += "<g clip-path=\"url(#plot)\">\n";
  int shape = 0;
  for (const auto& s : c.series) {
    const int my_shape = s.markers ? shape++ : 0;
    std::vector<std::pair<double, double>> pts;
    for (const auto& [x, y] : s.points)
      if (!undrawable(c, x, y)) pts.emplace_back(x, y);
    if (pts.empty()) continue;
    std::string path;
    for (const auto& [x, y] : pts) path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "" : " ", ax.px(x), ay.px(y));
    o += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", path, s.color,
                     dash_attr(s.dash));
    if (s.markers)
      for (const auto& [x, y] : pts)
        o += marker(my_shape, ax.px(x), ay.px(y), s.color,
                    fmt::format("{} at {}: {:.4g}", xml_escape(s.name), tick_label(x), y)) +
             "\n";
  }
  o += "</g>\n";
}

// Legend, from (lx, ly) right of the plot.
void series_legend(std::string& o, const LineChart& c, double lx, double ly) {
  int shape = 0;
  for (const auto& s : c.series) {
    const int my_shape = s.markers ? shape++ : 0;
    const bool drawn = std::any_of(s.points.begin(), s.points.end(), [&](const auto& p) {
      return !(c.log_y && !(p.second > 0)) && std::isfinite(p.second);
    });
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2\"{}/>",
                     lx, ly, lx + 24, ly, s.color, dash_attr(s.dash));
    if (s.markers) o += marker(my_shape, lx + 12, ly, s.color, "");
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}{}</text>\n", lx + 30, ly + 4, xml_escape(s.name),
                     drawn ? "" : " (no data)");
    ly += 20;
  }
}

}  // namespace

std::string render_line_chart(const LineChart& c) {
  std::vector<std::string> notes = c.notes;
  // Data range (log axes: positive values only).
  DataRange d = data_range(c);
  note_identical_series(c, notes);
  if (d.dropped > 0)
    notes.push_back(fmt::format("{} point(s) with value 0 are not drawn on the logarithmic scale", d.dropped));
  const bool empty = !(d.ymax >= d.ymin);
  if (empty) {
    d.ymin = c.log_y ? 1 : 0;
    d.ymax = c.log_y ? 10 : 1;
    if (!(d.xmax >= d.xmin)) d.xmin = 1, d.xmax = 2;
    notes.push_back("no data to draw");
  }

  const double height = kTop + kPlotH + kBottom + kNoteLine * static_cast<double>(notes.size());
  const Axis ax = x_axis(c.log_x, d.xmin, d.xmax);
  const YAxis y = y_axis(c.log_y, d.ymin, d.ymax);
  std::vector<double> xt = c.x_ticks;
  if (xt.empty()) xt = ax.log ? log_ticks(d.xmin, d.xmax) : linear_ticks(d.xmin, d.xmax);

  std::string o;
  chart_header(o, c, height);
  grid_and_ticks(o, c, ax, y, xt);
  series_lines(o, c, ax, y.axis);
  series_legend(o, c, ax.p1 + 16, y.axis.p1 + 8);
  double ny = y.axis.p0 + 58;
  for (const auto& n : notes) {
    o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#a33\">{}</text>\n", kLeft, ny, xml_escape(n));
    ny += kNoteLine;
  }
  o += "</svg>\n";
  return o;
}

}  // namespace cpsched::cli
