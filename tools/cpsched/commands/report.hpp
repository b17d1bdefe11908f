#pragma once
// Terminal tables of a solved problem.
#include <cstdio>

#include "commands/plugin_folders.hpp"

namespace cpsched::cli {

double gib(double bytes);
// One line each: the problem, the grid, the solver and its timings.
void print_summary(std::FILE* out, const Config& cfg, const Solved& s);
// Per-rank load and traffic, totals, bottleneck, imbalance, and the
// reductions against USP's closed form.
void print_metrics_table(std::FILE* out, const Solved& s);

}  // namespace cpsched::cli
