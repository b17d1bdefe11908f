#pragma once
// A plan's parts, its problem and its metrics as Python objects: dicts of numpy arrays, per stage as the plan
// JSON names them, or (flat_*) a pass as int64 columns (cpsched.torch reads those: python/cpsched/torch/
// _plandata.py).
#include <nanobind/nanobind.h>

#include <vector>

#include "cpsched/plan/plan.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched::py {

namespace nb = nanobind;

// One stage's collectives: a dict of its fields (plan.hpp's names).
nb::object to_py(const StageComm& s);
// A list of attention args as parallel arrays (q_ranges, k_ranges, mask_types, q_buffers, k_buffers, groups,
// index_offsets (-1: a range arg), index_widths).
nb::object attn_args(const std::vector<AttnArg>& args);
// A rank's remote rows of one kind (CommMeta::remote_*_rows): int64 rows (begin, end, row, group).
nb::object remote_runs(const std::vector<RemoteRun>& runs);
// A pass's args (stage 0's, then each remote stage's) and its comm as int64 columns (Result.calc_meta /
// comm_meta with flat=True document the columns).
nb::dict flat_args(const CalcMeta& c);
nb::dict flat_comm(const CommMeta& c);
// The problem's fields, named as the plan JSON's "problem" (docs/plan_format.md).
nb::dict problem_dict(const Problem& p, const Sharding& sh);
nb::dict metrics_dict(const Metrics& m);

}  // namespace cpsched::py
