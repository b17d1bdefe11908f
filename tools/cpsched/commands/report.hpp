#pragma once
// Terminal tables of a solved problem.
#include <cstdio>

#include "cpsched/config/config.hpp"
#include "cpsched/plan/solve_result.hpp"

namespace cpsched::cli {

double gib(double bytes);
// One line each: the problem, the grid, the solver and its timings.
void print_summary(std::FILE* out, const Config& cfg, const SolveResult& s);
// Per-rank load and traffic, totals, bottleneck, imbalance, and the
// reductions against USP's closed form.
void print_metrics_table(std::FILE* out, const SolveResult& s);

}  // namespace cpsched::cli
