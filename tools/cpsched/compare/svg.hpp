#pragma once
// A small hand-written SVG line chart: axes with ticks and grid lines, linear
// or logarithmic scales, one polyline with markers per series, a legend. No
// scripts, no external fonts: it renders the same in a browser or rsvg.
#include <string>
#include <utility>
#include <vector>

namespace cpsched::cli {

struct ChartSeries {
  std::string name;
  std::string color;   // CSS colour
  std::string dash;    // SVG stroke-dasharray; empty: solid
  bool markers = true;
  std::vector<std::pair<double, double>> points;  // (x, y), sorted by x
};

struct LineChart {
  std::string title;
  std::string subtitle;
  std::string x_label;
  std::string y_label;
  bool log_x = false;
  bool log_y = false;
  std::vector<double> x_ticks;   // explicit ticks (e.g. the CP sizes); empty: automatic
  std::vector<ChartSeries> series;
  std::vector<std::string> notes;  // printed under the plot (failed series, points left out)
};

// Points with y <= 0 cannot be drawn on a log scale: they are left out and a
// note says how many.
std::string render_line_chart(const LineChart& chart);

// Nice axis ticks (exposed for tests and reuse).
std::vector<double> linear_ticks(double lo, double hi, int target = 5);
std::vector<double> log_ticks(double lo, double hi);

}  // namespace cpsched::cli
