#pragma once
// Pictures of an assignment (the C++ counterpart of the seed's
// output_solve_result(visualize=True)): the Q x KV plane, one panel per head
// group, every unmasked region filled with the colour of the rank computing
// it; host cells (q and kv block on the same rank) outlined, and tasks that
// run on their host (stage 0, no communication) marked with a white dot; a
// legend of rank colours and the plan's figures (forward / backward total
// send and bottleneck, imbalance, stage-0 share). Hand-written SVG 1.1.
//
// Size bound. A panel draws each task (each slice piece of it) only while
// its head group has at most kSvgMaxTasks tasks and kSvgMaxPieces pieces;
// above either it aggregates instead: the panel becomes the plane of (q
// host rank, kv host rank) pairs, at most kSvgMaxTiles squares (ranks
// grouped ceil(P / 128) to a side when P > 128), each square coloured by
// the rank computing most of its area. Host-cell outlines are drawn only
// for at most kSvgMaxTasks host cells, the legend lists at most
// kSvgMaxLegend ranks, and a picture has at most kSvgMaxPanels panels. So a picture holds O(kSvgMaxPieces) shapes per panel
// drawn, whatever P, the mask or the blocks: about 5 MiB per panel at most
// (measured: docs/bounds.md).
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cpsched/problem/assignment.hpp"
#include "cpsched/problem/metrics.hpp"

namespace cpsched {

inline constexpr std::int64_t kSvgMaxTasks = 16384;   // tasks of one head group drawn one by one
inline constexpr std::int64_t kSvgMaxPieces = 65536;  // slice pieces of one head group drawn one by one
inline constexpr std::int64_t kSvgMaxTiles = 16384;   // squares of an aggregated panel (128 x 128)
inline constexpr int kSvgMaxLegend = 256;             // ranks in the legend
inline constexpr int kSvgMaxPanels = 16;              // head groups in one picture

struct SvgOptions {
  std::vector<int> groups;   // head groups to draw; empty: the first `max_groups`
  int max_groups = 4;
  int panel_px = 420;        // side of one panel
  std::string title;         // first line; empty: "cpsched plan"
  std::string solver;        // shown with the figures when not empty
  int stages = 0;            // shown with the figures when > 0
  bool feasible = true;      // false: "(balance target not met)" after the figures
};

// Throws cpsched::Error for a group outside the grid's groups, or more than
// kSvgMaxPanels groups.
std::string plan_svg(const Assignment& a, const Metrics& m, const SvgOptions& opt = {});
// Writes plan_svg to `file`; throws cpsched::Error naming the file when it cannot.
void write_plan_svg(const std::filesystem::path& file, const Assignment& a, const Metrics& m,
                    const SvgOptions& opt = {});

// The colour of rank r of P ("#rrggbb"), also used by other pictures.
std::string rank_colour(Rank r, int cp_size);

}  // namespace cpsched
