#pragma once
// Pictures of an assignment (the C++ counterpart of the seed's
// output_solve_result(visualize=True)): the Q x KV plane, one panel per head
// group, every unmasked region filled with the colour of the rank computing
// it; host cells (q and kv block on the same rank) outlined, and tasks that
// run on their host (stage 0, no communication) marked with a white dot; a
// legend of rank colours and the plan's figures (forward / backward total
// send and bottleneck, imbalance, stage-0 share). Hand-written SVG 1.1.
#include <filesystem>
#include <string>
#include <vector>

#include "cpsched/problem/assignment.hpp"
#include "cpsched/problem/metrics.hpp"

namespace cpsched {

struct SvgOptions {
  std::vector<int> groups;   // head groups to draw; empty: the first `max_groups`
  int max_groups = 4;
  int panel_px = 420;        // side of one panel
  std::string title;         // first line; empty: "cpsched plan"
  std::string solver;        // shown with the figures when not empty
  int stages = 0;            // shown with the figures when > 0
  bool feasible = true;      // false: "(balance target not met)" after the figures
};

// Throws cpsched::Error for a group outside the grid's groups.
std::string plan_svg(const Assignment& a, const Metrics& m, const SvgOptions& opt = {});
// Writes plan_svg to `file`; throws cpsched::Error naming the file when it cannot.
void write_plan_svg(const std::filesystem::path& file, const Assignment& a, const Metrics& m,
                    const SvgOptions& opt = {});

// The colour of rank r of P ("#rrggbb"), also used by other pictures.
std::string rank_colour(Rank r, int cp_size);

}  // namespace cpsched
