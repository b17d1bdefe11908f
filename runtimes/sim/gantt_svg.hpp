#pragma once
// SVG Gantt chart of a timeline: one panel per pass (forward, backward), one
// lane per rank with its compute stream above its communication stream.
#include <string>
#include <vector>

#include "cpsched/timing/model.hpp"

namespace cpsched::sim {

struct GanttOptions {
  std::string title;               // first line of the heading
  std::vector<std::string> notes;  // further heading lines (figures)
  int max_ranks = 64;              // more ranks: the slowest ones are drawn
};

std::string gantt_svg(const Timeline& t, const GanttOptions& opt);

}  // namespace cpsched::sim
