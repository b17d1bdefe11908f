// cpsched._cpsched: the Python binding of the library facade (cpsched.hpp).
// The Python package (python/cpsched/) normalises inputs (lists,
// numpy, DLPack and __array__ objects) into C-contiguous int64 / int32 arrays
// and wraps the dicts returned here into small record classes; this file does
// the work that must be fast or must hold C++ objects: solving with the GIL
// released, shared ownership of results, and numpy views of plan fields.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpsched/base/stopwatch.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/session/session.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/plugin/executor.hpp"
#include "cpsched/mask/mask.hpp"
#include "cpsched/io/plan_json.hpp"
#include "cpsched/io/plan_svg.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/hardware/kernel_model.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/timing/model.hpp"
#include "cpsched/plugin/registry.hpp"
#include "cpsched/problem/resources.hpp"
#include "cpsched/version.hpp"
#include "arrays.hpp"
#include "plan_arrays.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace cpsched::py {

namespace {

Pass parse_pass(const std::string& s) {
  if (s == "fwd") return Pass::fwd;
  if (s == "bwd") return Pass::bwd;
  throw Error("pass must be 'fwd' or 'bwd', got '" + s + "'");
}

// program_error (plan/program.hpp) on rows (op, stage, kind, phase): None, or (index, "text: reason") parsed
// from its "instruction k (text): reason" (the row count where the program's end or shape is wrong).
nb::object program_check(const std::vector<std::vector<int>>& rows, const std::vector<int>& qo_after,
                         const std::vector<int>& kv_after, const std::string& pass) {
  Program prog;
  for (const auto& r : rows) {
    if (r.size() != 4) throw nb::value_error("program_error: each row is (op, stage, kind, phase)");
    for (int v : {r[0], r[2], r[3]})
      if (v < 0 || v > 255) throw nb::value_error("program_error: op, kind and phase are codes in 0..255");
    prog.push_back({static_cast<Op>(r[0]), r[1], static_cast<RowKind>(r[2]), static_cast<Phase>(r[3])});
  }
  const std::string why = program_error(prog, static_cast<int>(qo_after.size()), qo_after, kv_after, parse_pass(pass));
  if (why.empty()) return nb::none();
  std::size_t at = prog.size();
  std::string reason = why;
  constexpr std::string_view head = "instruction ";
  if (why.starts_with(head)) {
    const std::size_t open = why.find(" (", head.size()), close = why.find("): ", open);
    if (open != std::string::npos && close != std::string::npos) {
      at = std::stoul(why.substr(head.size(), open - head.size()));
      reason = why.substr(open + 2, close - open - 2) + ": " + why.substr(close + 3);
    }
  }
  return nb::make_tuple(at, reason);
}

ParamValue param_from_py(const std::string& where, const std::string& key, nb::handle v) {
  // bool first: Python's bool is an int.
  if (nb::isinstance<nb::bool_>(v)) return nb::cast<bool>(v);
  if (nb::isinstance<nb::int_>(v)) {
    try {
      return nb::cast<std::int64_t>(v);
    } catch (const std::exception&) {
      throw Error(where + "['" + key + "']: integer out of range");
    }
  }
  if (nb::isinstance<nb::float_>(v)) return nb::cast<double>(v);
  if (nb::isinstance<nb::str>(v)) return nb::cast<std::string>(v);
  throw Error(where + "['" + key + "']: expected bool, int, float or str, got " +
              nb::cast<std::string>(nb::str(v.type().attr("__name__"))));
}

Params params_from_py(const std::string& where, nb::handle obj) {
  Params p;
  if (obj.is_none()) return p;
  if (!nb::isinstance<nb::dict>(obj)) throw Error(where + ": expected a dict of parameter values");
  for (auto [k, v] : nb::borrow<nb::dict>(obj)) {
    if (!nb::isinstance<nb::str>(k)) throw Error(where + ": parameter names must be strings");
    const std::string key = nb::cast<std::string>(k);
    p.set(key, param_from_py(where, key, v));
  }
  return p;
}

nb::object param_to_py(const ParamValue& v) {
  return std::visit([](const auto& x) -> nb::object { return nb::cast(x); }, v);
}

nb::dict params_to_py(const Params& p) {
  nb::dict d;
  for (const auto& [k, v] : p.values()) d[k.c_str()] = param_to_py(v);
  return d;
}

std::string py_type_name(nb::handle v) { return nb::cast<std::string>(nb::str(v.type().attr("__name__"))); }
std::string py_repr(nb::handle v) { return nb::cast<std::string>(nb::repr(v)); }
bool is_integer(nb::handle v) { return nb::isinstance<nb::int_>(v) && !nb::isinstance<nb::bool_>(v); }
std::optional<std::string> text(nb::handle v) {
  if (!nb::isinstance<nb::str>(v)) return std::nullopt;
  return nb::cast<std::string>(v);
}

// Named options, read by name with their types checked: a Session's keywords
// (_Session(**options)) or one of its dict-valued options (heads, grid,
// plan). An option not given, or None, keeps SessionOptions' default; one
// given but never read is refused, so a misspelt name is an error naming it,
// not a silent default. Errors name the option as Python spells it.
class NamedOptions {
 public:
  NamedOptions(std::string owner, nb::handle obj) : owner_(std::move(owner)) {
    if (!nb::isinstance<nb::dict>(obj))
      throw Error("session: " + owner_ + ": expected a dict, got " + py_repr(obj) + " (" + py_type_name(obj) + ")");
    values_ = nb::borrow<nb::dict>(obj);
  }

  // The value given for `key` (None: not given), marked as read.
  nb::object get(const char* key) {
    read_.insert(key);
    return values_.contains(key) ? nb::object(values_[key]) : nb::none();
  }

  // `key` as Python spells it: "cp_size", "plan['relay']".
  std::string name(const char* key) const { return owner_.empty() ? key : owner_ + "['" + key + "']"; }

  Error expected(const char* key, const std::string& what, nb::handle v) const {
    return Error("session: " + name(key) + ": expected " + what + ", got " + py_repr(v) + " (" + py_type_name(v) + ")");
  }

  // An integer that fits T, else an error naming `key` (never wrapped around).
  template <class T>
  T integer(const char* key, nb::handle v) const {
    if (!is_integer(v)) throw expected(key, "an integer", v);
    constexpr long long lo = std::is_signed_v<T> ? std::numeric_limits<T>::min() : 0;
    constexpr long long hi = std::cmp_greater(std::numeric_limits<T>::max(), std::numeric_limits<long long>::max())
                                 ? std::numeric_limits<long long>::max()
                                 : static_cast<long long>(std::numeric_limits<T>::max());
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0 || x < lo || x > hi)
      throw Error("session: " + name(key) + ": " + py_repr(v) + " is outside [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
    return static_cast<T>(x);
  }

  // Reads `key` into `out` when given: True or False, a string, or an integer
  // that fits `out`.
  template <class T>
  void read(const char* key, T& out) {
    const nb::object v = get(key);
    if (v.is_none()) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (!nb::isinstance<nb::bool_>(v)) throw expected(key, "True or False", v);
      out = nb::cast<bool>(v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!nb::isinstance<nb::str>(v)) throw expected(key, "a string", v);
      out = nb::cast<std::string>(v);
    } else {
      out = integer<T>(key, v);
    }
  }

  // Every option given was read (the names read are the ones known).
  void check_all_read() const {
    for (auto [k, v] : values_) {
      const std::optional<std::string> key = text(k);
      if (key && read_.count(*key)) continue;
      std::string known;
      for (const std::string& r : read_) known += (known.empty() ? "" : ", ") + r;
      throw Error("session: " + (owner_.empty() ? "" : owner_ + ": ") + "unknown option " + py_repr(k) + " (expected " +
                  known + ")");
    }
  }

 private:
  std::string owner_;
  nb::dict values_;
  std::set<std::string> read_;
};

// A count (>= 1), or `word` as `code` (PlanShape::kAutoStages,
// PlanUses::kAhead): only the word says it, the integer code is refused.
// Upper bounds are the Session's to check.
int count_or_word(const NamedOptions& o, const char* key, nb::handle v, const char* word, int code) {
  if (text(v) == word) return code;
  const int n = is_integer(v) ? o.integer<int>(key, v) : 0;
  if (n < 1) throw o.expected(key, "a count of at least 1 or '" + std::string(word) + "'", v);
  return n;
}

// heads: {"q", "kv", "dim", "dtype_bytes", "dim_v", "kv_shared"} (Heads).
Heads heads_from(nb::handle obj) {
  NamedOptions o("heads", obj);
  Heads h;
  o.read("q", h.q);
  o.read("kv", h.kv);
  o.read("dim", h.dim);
  o.read("dtype_bytes", h.dtype_bytes);
  o.read("dim_v", h.dim_v);
  o.read("kv_shared", h.kv_shared);
  o.check_all_read();
  return h;
}

// grid: {"flatten_head_groups", "blocks_per_rank"} (GridOptions).
GridOptions grid_from(nb::handle obj) {
  NamedOptions o("grid", obj);
  GridOptions g;
  o.read("flatten_head_groups", g.flatten_head_groups);
  o.read("blocks_per_rank", g.blocks_per_rank);
  o.check_all_read();
  return g;
}

// plan: {"stages": n or "auto", "relay": "off", "on" or "auto", "node_size":
// n (0: the hardware profile's)} (PlanShape); Session checks the ranges.
PlanShape plan_shape_from(nb::handle obj) {
  NamedOptions o("plan", obj);
  PlanShape s;
  if (const nb::object v = o.get("stages"); !v.is_none())
    s.stages = count_or_word(o, "stages", v, "auto", PlanShape::kAutoStages);
  if (const nb::object v = o.get("relay"); !v.is_none()) {
    const std::optional<std::string> r = text(v);
    if (r == "off") s.relay = PlanShape::Relay::off;
    else if (r == "on") s.relay = PlanShape::Relay::on;
    else if (r == "auto") s.relay = PlanShape::Relay::automatic;
    else throw o.expected("relay", "'off', 'on' or 'auto'", v);
  }
  o.read("node_size", s.node_size);
  o.check_all_read();
  return s;
}

Layout layout_from(const NamedOptions& o, nb::handle v) {
  if (text(v) == "fixed") return Layout::fixed;
  if (text(v) == "planned") return Layout::planned;
  throw o.expected("layout", "'fixed' or 'planned'", v);
}

// uses: attention calls that run each plan (>= 1) or "ahead" (PlanUses).
PlanUses uses_from(const NamedOptions& o, nb::handle v) {
  return PlanUses{count_or_word(o, "uses", v, "ahead", PlanUses::kAhead)};
}

std::vector<std::filesystem::path> folders_from(const NamedOptions& o, nb::handle v) {
  if (!nb::isinstance<nb::list>(v) && !nb::isinstance<nb::tuple>(v))
    throw o.expected("plugin_paths", "a list of folders", v);
  std::vector<std::filesystem::path> out;
  std::size_t i = 0;
  for (nb::handle p : v) {
    const std::optional<std::string> s = text(p);
    if (!s) throw o.expected(("plugin_paths[" + std::to_string(i) + "]").c_str(), "a path string", p);
    out.emplace_back(*s);
    ++i;
  }
  return out;
}

// A Session's options from _Session's keywords, named as SessionOptions'
// fields (cpsched/session/session.hpp); the Python package checks the
// public Session's arguments first and passes them so.
SessionOptions session_options_from(nb::handle kwargs) {
  NamedOptions o("", kwargs);
  SessionOptions s;
  o.read("cp_size", s.cp_size);
  o.read("seqlen", s.seqlen);
  if (const nb::object v = o.get("heads"); !v.is_none()) s.heads = heads_from(v);
  if (const nb::object v = o.get("grid"); !v.is_none()) s.grid = grid_from(v);
  if (const nb::object v = o.get("layout"); !v.is_none()) s.layout = layout_from(o, v);
  o.read("solver", s.solver);
  s.solver_params = params_from_py("solver_params", o.get("solver_params"));
  o.read("cost_model", s.cost_model);
  s.cost_params = params_from_py("cost_params", o.get("cost_params"));
  if (const nb::object v = o.get("plan"); !v.is_none()) s.plan = plan_shape_from(v);
  if (const nb::object v = o.get("uses"); !v.is_none()) s.uses = uses_from(o, v);
  o.read("rank", s.rank);
  o.read("cache_size", s.cache_size);
  o.read("ahead_queue", s.ahead_queue);
  if (const nb::object v = o.get("plugin_paths"); !v.is_none()) s.plugin_paths = folders_from(o, v);
  o.read("validate", s.validate);
  o.check_all_read();
  return s;
}

using Int64Rows = nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Int32Vec = nb::ndarray<const std::int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int64Vec = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int32Rows3 = nb::ndarray<const std::int32_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

std::vector<Range> ranges_from(const Int64Rows& a) {
  const std::size_t n = a.shape(0);
  const std::int64_t* p = a.data();
  std::vector<Range> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = Range{p[2 * i], p[2 * i + 1]};
  return out;
}

std::vector<MaskType> types_from(const Int32Vec& a) {
  const std::size_t n = a.shape(0);
  const std::int32_t* p = a.data();
  std::vector<MaskType> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] < 0 || p[i] > 3)
      throw Error("mask type " + std::to_string(p[i]) + " of slice " + std::to_string(i) +
                  " is not one of 0 full, 1 causal, 2 inv_causal, 3 bi_causal");
    out[i] = static_cast<MaskType>(p[i]);
  }
  return out;
}

std::shared_ptr<Registry> scanned_registry(const std::vector<std::string>& extra) {
  auto reg = std::make_shared<Registry>();
  reg->scan_default_folders(std::vector<std::filesystem::path>(extra.begin(), extra.end()));
  return reg;
}

}  // namespace

// What a result needs besides the plan to export itself like the CLI: shared
// by every result of one Session, so a cache hit copies no strings.
struct SolverInfo {
  std::string solver;
  Params solver_params;  // resolved
};

// One solve's result. Holds the plan, assignment (and through its grid the
// plugin libraries) by shared ownership: valid after its Session is gone.
class Result {
 public:
  Result(std::shared_ptr<const SolveResult> plan, std::shared_ptr<const SolverInfo> info, bool cached, double call_ms)
      : plan_(std::move(plan)), info_(std::move(info)), cached_(cached), call_ms_(call_ms) {}

  const PassPlan& pass(Rank r, const std::string& p) const {
    const Plan& plan = *plan_->plan;
    if (r < 0 || static_cast<std::size_t>(r) >= plan.ranks.size())
      throw Error("session: rank " + std::to_string(r) + " is outside [0, " + std::to_string(plan.ranks.size()) + ")");
    if (plan.only_rank >= 0 && r != plan.only_rank)
      throw Error("session: this session builds rank " + std::to_string(plan.only_rank) +
                  "'s plan only (Session(rank=...)), not rank " + std::to_string(r) + "'s");
    return parse_pass(p) == Pass::fwd ? plan.ranks[static_cast<std::size_t>(r)].fwd
                                      : plan.ranks[static_cast<std::size_t>(r)].bwd;
  }

  nb::dict calc_meta(Rank r, const std::string& p, bool flat) const {
    const CalcMeta& c = pass(r, p).calc;
    if (flat) return flat_args(c);
    nb::dict d;
    d["local_attn_args"] = attn_args(c.local_attn_args);
    nb::list remote;
    for (const auto& s : c.remote_attn_args) remote.append(attn_args(s));
    d["remote_attn_args"] = remote;
    d["deferred_index_entries"] = c.deferred_index_entries;
    return d;
  }

  // A rank's index pool of one pass (int32; empty for range masks), without a trip through JSON.
  nb::object index_rows(Rank r, const std::string& p) const {
    const auto& pool = pass(r, p).calc.indices;
    return numpy_from(std::vector<std::int32_t>(pool.begin(), pool.end()), pool.size(), 0);
  }

  // The order `r` runs pass `p` in (plan/program.hpp), one row per instruction: op, stage, kind, phase (int32,
  // the enums' values; the docstring lists them). A plan made without one (none the builder makes) gets the
  // core's default program: an executor never emits its own.
  nb::object program(Rank r, const std::string& p) const {
    const PassPlan& pp = pass(r, p);
    const Program prog = pp.program.empty() ? pass_program(pp.comm.stages, parse_pass(p)) : pp.program;
    std::vector<std::int32_t> flat;
    flat.reserve(4 * prog.size());
    for (const Instr& i : prog)
      for (auto v : {static_cast<int>(i.op), i.stage, static_cast<int>(i.kind), static_cast<int>(i.phase)})
        flat.push_back(static_cast<std::int32_t>(v));
    return numpy_from(std::move(flat), prog.size(), 4);
  }

  nb::dict comm_meta(Rank r, const std::string& p, bool flat) const {
    const CommMeta& c = pass(r, p).comm;
    if (flat) return flat_comm(c);
    nb::list stages;
    for (const StageComm& s : c.stages) stages.append(to_py(s));
    nb::dict d;
    d["stages"] = stages;
    d["remote_qo_rows"] = remote_runs(c.remote_qo_rows);
    d["remote_kv_rows"] = remote_runs(c.remote_kv_rows);
    return d;
  }

  nb::dict problem() const { return problem_dict(plan_->assignment->grid->problem(), plan_->assignment->grid->sharding()); }

  nb::dict metrics() const { return metrics_dict(plan_->metrics); }

  // The timing model's compute seconds of `r`'s args per pass (the kernel
  // model's where the profile has one): what a runtime's benchmark prints
  // beside the attention time it measures. On `hardware` (a bundled name or a
  // YAML path), else on the profile the plan was built on.
  nb::dict predicted_compute(Rank r, const std::optional<std::string>& hardware) const {
    const PassPlan& fwd = pass(r, "fwd");
    const PassPlan& bwd = pass(r, "bwd");
    std::shared_ptr<const HardwareProfile> hw = plan_->hardware;
    if (hardware) hw = std::make_shared<const HardwareProfile>(resolve_hardware_profile(*hardware));
    if (!hw)
      throw Error("hardware: this plan was made without a hardware profile (its cost model has none); name one, "
                  "e.g. hardware='h100_8x_nvlink'");
    const Problem& problem = plan_->assignment->grid->problem();
    nb::dict d;
    d["fwd"] = compute_seconds(problem, fwd, *hw, Pass::fwd);
    d["bwd"] = compute_seconds(problem, bwd, *hw, Pass::bwd);
    return d;
  }
  // The solver that made this plan: the session's, or owner's for per-rank top-k summaries.
  std::string solver() const { return plan_->solver.empty() ? info_->solver : plan_->solver; }

  std::string to_json(int indent, std::optional<double> solve_ms, bool tasks, bool index_rows) const {
    PlanExport e;
    e.include_tasks = tasks;
    e.include_index_rows = index_rows;
    e.assignment = plan_->assignment.get();
    e.metrics = &plan_->metrics;
    e.plan = plan_->plan.get();
    e.solver = solver();
    if (e.solver == info_->solver) e.solver_params = info_->solver_params;  // else owner's (top-k summaries)
    e.solve_ms = solve_ms ? *solve_ms : plan_->solve_ms;
    e.feasible = plan_->feasible;
    e.note = plan_->note;
    return plan_json(e, indent);
  }

  void write_svg(const std::string& path, std::vector<int> groups, const std::string& title, int max_groups) const {
    SvgOptions o;
    o.groups = std::move(groups);
    o.title = title;
    if (max_groups > 0) o.max_groups = max_groups;
    o.solver = solver();
    o.stages = plan_->plan->num_stages;
    o.feasible = plan_->feasible;
    write_plan_svg(path, *plan_->assignment, plan_->metrics, o);
  }

  std::vector<std::string> validate() const {
    nb::gil_scoped_release release;  // (a rank's plan rebuilds its peers' comm first)
    return validate_result(*plan_);
  }

  nb::object task_ranks() const { return numpy_of(plan_->assignment->rank); }

  const SolveResult& plan() const { return *plan_; }
  const SolverInfo& info() const { return *info_; }
  bool cached() const { return cached_; }
  double call_ms() const { return call_ms_; }

 private:
  std::shared_ptr<const SolveResult> plan_;
  std::shared_ptr<const SolverInfo> info_;
  bool cached_;
  double call_ms_;
};

// A mask being planned ahead (Session::solve_async): the future of its
// result; get() waits with the GIL released.
class AsyncSolve {
 public:
  AsyncSolve(std::shared_future<std::shared_ptr<const SolveResult>> f, std::shared_ptr<const SolverInfo> info)
      : future_(std::move(f)), info_(std::move(info)) {}
  bool done() const { return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  Result get() const {
    std::shared_ptr<const SolveResult> r;
    if (done()) {
      // Ready: no GIL round trip (cpsched's waiter thread calls get() only then, so it never takes the GIL
      // back inside C++, which the interpreter's exit turns into std::terminate for a daemon thread).
      r = future_.get();  // the solver's error, if any, is rethrown here
    } else {
      nb::gil_scoped_release release;
      r = future_.get();
    }
    return Result(std::move(r), info_, false, 0.0);
  }

 private:
  std::shared_future<std::shared_ptr<const SolveResult>> future_;
  std::shared_ptr<const SolverInfo> info_;
};

// A Session behind a mutex: the C++ Session is not thread safe, and with the
// GIL released two Python threads could otherwise enter the same one.
namespace {

// A summary crosses to Python as five int64 arrays: cells [n, 4] (head,
// qblock, kblock, area), row_offsets [n + 1] into rows [m, 2] (global token
// ranges), and col_offsets [n + 1] into cols [m', 2]; the Python side wraps
// them (cpsched.TopkSummary, picklable for an all-gather).
nb::tuple cells_to_numpy(const std::vector<IndexCell>& cells) {
  std::vector<Token> head(cells.size() * 4), roff{0}, coff{0}, rr, cr;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const IndexCell& c = cells[i];
    head[4 * i] = c.head;
    head[4 * i + 1] = c.qblock;
    head[4 * i + 2] = c.kblock;
    head[4 * i + 3] = c.area;
    for (Range r : c.rows.ranges()) rr.insert(rr.end(), {r.begin, r.end});
    for (Range r : c.cols.ranges()) cr.insert(cr.end(), {r.begin, r.end});
    roff.push_back(static_cast<Token>(rr.size() / 2));
    coff.push_back(static_cast<Token>(cr.size() / 2));
  }
  const std::size_t n = cells.size(), nr = rr.size() / 2, nc = cr.size() / 2;
  return nb::make_tuple(numpy_from(std::move(head), n, 4), numpy_from(std::move(roff), n + 1, 0),
                        numpy_from(std::move(rr), nr, 2), numpy_from(std::move(coff), n + 1, 0),
                        numpy_from(std::move(cr), nc, 2));
}

// The cells of one summary's five arrays; errors start with `where`. The
// arrays are checked as summarize_topk writes them (offsets from 0 to the
// ranges' count, each cell's ranges non-empty, ascending and apart), since a
// RangeSet would silently merge or drop what they say; what the cells mean
// is checked by the core (check_rank_summary).
std::vector<IndexCell> cells_from(const nb::tuple& t, const std::string& where) {
  auto fail = [&](const std::string& what) { return Error(where + what); };
  if (t.size() != 5) throw fail("expected the 5 arrays of Session.summarize_topk");
  // (cpsched.TopkSummary has made each an int64 array of its shape; a raw
  // tuple from elsewhere gets the same message instead of std::bad_cast.)
  const char* names[5] = {"cells", "row_offsets", "rows", "col_offsets", "cols"};
  for (std::size_t i = 0; i < 5; ++i) {
    const bool ok = i % 2 == 0 ? nb::isinstance<Int64Rows>(t[i]) : nb::isinstance<Int64Vec>(t[i]);
    if (!ok)
      throw fail(std::string(names[i]) + ": expected a C-contiguous int64 array of shape " +
                 (i == 0 ? "[n, 4]" : i % 2 == 1 ? "[n + 1]" : "[m, 2]"));
  }
  const auto cells = nb::cast<Int64Rows>(t[0]), rr = nb::cast<Int64Rows>(t[2]), cr = nb::cast<Int64Rows>(t[4]);
  const auto roff = nb::cast<Int64Vec>(t[1]), coff = nb::cast<Int64Vec>(t[3]);
  const std::size_t n = cells.shape(0);
  if (cells.shape(1) != 4 || roff.shape(0) != n + 1 || coff.shape(0) != n + 1 || rr.shape(1) != 2 || cr.shape(1) != 2)
    throw fail("the arrays' shapes do not fit together (cells [n, 4], offsets [n + 1], ranges [m, 2])");
  auto check_offsets = [&](const Int64Vec& off, const Int64Rows& r, const char* name) {
    const std::int64_t m = static_cast<std::int64_t>(r.shape(0));
    if (off.data()[0] != 0 || off.data()[n] != m)
      throw fail(std::string(name) + " offsets run from " + std::to_string(off.data()[0]) + " to " +
                 std::to_string(off.data()[n]) + ", not from 0 to its " + std::to_string(m) + " ranges");
    for (std::size_t i = 0; i < n; ++i)
      if (off.data()[i + 1] <= off.data()[i])
        throw fail(std::string(name) + " offsets [" + std::to_string(off.data()[i]) + ", " +
                   std::to_string(off.data()[i + 1]) + ") of cell " + std::to_string(i) +
                   " hold no range (offsets ascend strictly: a cell has rows and keys)");
  };
  check_offsets(roff, rr, "row");
  check_offsets(coff, cr, "col");
  auto ranges = [&](const Int64Vec& off, const Int64Rows& r, std::size_t i, const char* name) {
    const std::int64_t a = off.data()[i], b = off.data()[i + 1];
    std::vector<Range> v;
    v.reserve(static_cast<std::size_t>(b - a));
    for (std::int64_t x = a; x < b; ++x) {
      const Range y{r.data()[2 * x], r.data()[2 * x + 1]};
      if (y.empty() || (!v.empty() && y.begin <= v.back().end))
        throw fail(std::string(name) + "[" + std::to_string(x) + "] = [" + std::to_string(y.begin) + ", " +
                   std::to_string(y.end) + ") of cell " + std::to_string(i) +
                   (y.empty() ? " is empty" : " does not start after the cell's range before it, [" +
                                                  std::to_string(v.back().begin) + ", " + std::to_string(v.back().end) +
                                                  ")") +
                   " (a cell's ranges are non-empty, ascending and apart)");
      v.push_back(y);
    }
    return RangeSet(std::move(v));
  };
  std::vector<IndexCell> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    IndexCell& c = out[i];
    const std::int64_t* x = cells.data() + 4 * i;
    for (int f = 0; f < 3; ++f)
      if (x[f] < std::numeric_limits<std::int32_t>::min() || x[f] > std::numeric_limits<std::int32_t>::max())
        throw fail("cells[" + std::to_string(i) + ", " + std::to_string(f) + "] = " + std::to_string(x[f]) +
                   " is outside int32 (" + (f == 0 ? "head" : f == 1 ? "qblock" : "kblock") + ")");
    c.head = static_cast<int>(x[0]);
    c.qblock = static_cast<std::int32_t>(x[1]);
    c.kblock = static_cast<std::int32_t>(x[2]);
    c.area = x[3];
    c.rows = ranges(roff, rr, i, "rows");
    c.cols = ranges(coff, cr, i, "cols");
  }
  return out;
}

std::vector<std::vector<IndexCell>> summaries_from(const std::vector<nb::tuple>& summaries) {
  std::vector<std::vector<IndexCell>> parts(summaries.size());
  for (std::size_t s = 0; s < summaries.size(); ++s)
    parts[s] = cells_from(summaries[s], "summaries[" + std::to_string(s) + "] (rank " + std::to_string(s) +
                                            "'s top-k summary): ");
  return parts;
}

}  // namespace

class PySession {
 public:
  explicit PySession(SessionOptions o) : session_(std::make_unique<Session>(std::move(o))) { init_info(); }
  PySession(Config cfg, int rank) : cfg_(std::move(cfg)) {
    session_ = std::make_unique<Session>(*cfg_, rank);
    init_info();
  }

  Result solve(const Int64Rows& q, const Int64Rows& k, const Int32Vec& t) {
    // Copied while the GIL is held (the arrays belong to Python objects).
    std::vector<Range> qr = ranges_from(q), kr = ranges_from(k);
    std::vector<MaskType> types = types_from(t);
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    session_->solve(qr, kr, types);
    return last();
  }

  AsyncSolve solve_async(const Int64Rows& q, const Int64Rows& k, const Int32Vec& t) {
    std::vector<Range> qr = ranges_from(q), kr = ranges_from(k);
    std::vector<MaskType> types = types_from(t);
    nb::gil_scoped_release release;  // a full queue waits for a slot
    std::lock_guard<std::mutex> lock(mu_);
    return AsyncSolve(session_->solve_async(qr, kr, types), info_);
  }

  // The config's own mask, built as the CLI builds it (errors located in the file).
  Result solve_config() {
    if (!cfg_) throw Error("session: solve_config needs a Session made by Session.from_config");
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    session_->solve_config_mask();  // index masks too
    return last();
  }

  // Token top-k indices [S, kv_heads, k] (int32 or int64, -1 padded; DSA's
  // indexer output, FlashMLA's layout), copied while the GIL is held: the
  // result keeps its own copy, whatever happens to the array.
  // (nb::ro: read-only arrays, e.g. memory-mapped, are read as they are.)
  Result solve_topk(const nb::ndarray<nb::ro, nb::ndim<3>, nb::c_contig, nb::device::cpu>& indices, bool causal) {
    const std::vector<std::int64_t> shape{static_cast<std::int64_t>(indices.shape(0)),
                                          static_cast<std::int64_t>(indices.shape(1)),
                                          static_cast<std::int64_t>(indices.shape(2))};
    const std::size_t n = indices.size();
    IndexMask m;
    m.kind = IndexMaskKind::topk;
    m.seqlen = shape[0];
    m.kv_heads = static_cast<int>(shape[1]);
    m.causal = causal;
    if (indices.dtype() == nb::dtype<std::int32_t>())
      m.indices = IndexArray::copy({static_cast<const std::int32_t*>(indices.data()), n}, shape, "<indices>");
    else if (indices.dtype() == nb::dtype<std::int64_t>())
      m.indices = IndexArray::copy({static_cast<const std::int64_t*>(indices.data()), n}, shape, "<indices>");
    else
      throw Error("solve_topk: indices must be int32 or int64 (got another dtype)");
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    session_->solve(m);
    return last();
  }

  // Per-rank top-k summaries (mask/index/summary.hpp). A summary crosses
  // to Python as five int64 arrays: cells [n, 4] (head, qblock, kblock,
  // area), row_offsets [n + 1] into rows [m, 2] (global token ranges), and
  // col_offsets [n + 1] into cols [m', 2]; the Python side wraps them
  // (cpsched.TopkSummary, picklable for an all-gather).
  nb::tuple summarize_topk(const Int32Rows3& rows, bool causal) {
    const Token S = session_->options().seqlen;
    std::vector<IndexCell> cells;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      cells = session_->summarize_topk({rows.data(), rows.size()}, S, static_cast<int>(rows.shape(1)), causal);
    }
    return cells_to_numpy(cells);
  }

  // A rank's row runs: its summary's five arrays, then width [m] and area
  // [m] per range of the summary's rows (cpsched.TopkRowRuns).
  nb::tuple summarize_topk_runs(const Int32Rows3& rows, bool causal) {
    const Token S = session_->options().seqlen;
    TopkRowRuns runs;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      runs = session_->summarize_topk_runs({rows.data(), rows.size()}, S, static_cast<int>(rows.shape(1)), causal);
    }
    std::vector<Token> width(runs.width.begin(), runs.width.end());
    const std::size_t m = width.size();
    return nb::make_tuple(cells_to_numpy(runs.cells), numpy_from(std::move(width), m, 0),
                          numpy_from(std::move(runs.area), m, 0));
  }

  Result solve_topk_summaries(const std::vector<nb::tuple>& summaries, const Int32Rows3& rows, bool causal) {
    std::vector<std::vector<IndexCell>> parts = summaries_from(summaries);
    const Token S = session_->options().seqlen;
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    session_->solve_topk_summaries(parts, {rows.data(), rows.size()}, S, static_cast<int>(rows.shape(1)), causal);
    return last();
  }

  Result solve_topk_runs(const std::vector<nb::tuple>& summaries, const nb::tuple& own, const Int64Vec& width,
                         const Int64Vec& area, int kv_heads, bool causal) {
    std::vector<std::vector<IndexCell>> parts = summaries_from(summaries);
    const SessionOptions& o = session_->options();
    if (o.rank < 0)
      throw Error("session: per-rank top-k summaries need the session's rank (SessionOptions::rank, Python rank=)");
    TopkRowRuns runs;
    runs.seqlen = o.seqlen;
    runs.kv_heads = kv_heads;
    runs.causal = causal;
    runs.rows = Sharding::sequential(o.seqlen, o.cp_size, 1).blocks.at(static_cast<std::size_t>(o.rank));
    runs.cells = cells_from(own, "runs: ");
    if (width.shape(0) != area.shape(0))
      throw Error("runs: width has " + std::to_string(width.shape(0)) + " entries, area " +
                  std::to_string(area.shape(0)));
    for (std::size_t i = 0; i < width.shape(0); ++i) {
      const std::int64_t w = width.data()[i];
      if (w < 0 || w > std::numeric_limits<std::int32_t>::max())
        throw Error("runs: width[" + std::to_string(i) + "] = " + std::to_string(w) + " is outside [0, 2^31)");
      runs.width.push_back(static_cast<std::int32_t>(w));
      runs.area.push_back(area.data()[i]);
    }
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    session_->solve_topk_runs(parts, std::move(runs));
    return last();
  }

  nb::dict options() const {
    const SessionOptions& o = session_->options();
    nb::dict d;
    d["cp_size"] = o.cp_size;
    d["seqlen"] = o.seqlen;
    d["heads"] = nb::make_tuple(o.heads.q, o.heads.kv, o.heads.dim, o.heads.dtype_bytes);
    d["dim_v"] = o.heads.dv();  // MLA (docs/heads.md); = dim under GQA
    d["kv_shared"] = o.heads.kv_shared;
    d["flatten_head_groups"] = o.grid.flatten_head_groups;
    d["blocks_per_rank"] = o.grid.blocks_per_rank;
    d["solver"] = o.solver;
    d["solver_params"] = params_to_py(session_->solver_params());
    d["cost_model"] = o.cost_model;
    d["stages"] = o.plan.auto_stages() ? nb::object(nb::str("auto")) : nb::object(nb::int_(o.plan.stages));
    d["relay_node_size"] = o.plan.auto_relay() ? -1 : o.plan.relay_node_size();
    d["cache_size"] = o.cache_size;
    d["layout"] = std::string(to_string(o.layout));
    if (o.uses) d["uses"] = o.uses->is_ahead() ? nb::object(nb::str("ahead")) : nb::object(nb::int_(o.uses->uses));
    else d["uses"] = nb::none();
    d["rank"] = o.rank >= 0 ? nb::object(nb::int_(o.rank)) : nb::none();
    d["ahead_queue"] = o.ahead_queue;
    return d;
  }

  nb::dict cache_stats() const {
    const PlanCache& c = session_->cache();
    nb::dict d;
    d["hits"] = c.hits();
    d["misses"] = c.misses();
    d["size"] = c.size();
    d["capacity"] = c.capacity();
    return d;
  }

 private:
  void init_info() {
    auto info = std::make_shared<SolverInfo>();
    info->solver = session_->options().solver;
    info->solver_params = session_->solver_params();
    info_ = std::move(info);
  }
  Result last() const {
    // SolveResult is a few shared pointers and P-sized vectors: copying it
    // gives the result its own shared ownership without a core change.
    return Result(std::make_shared<const SolveResult>(session_->result()), info_, session_->last_was_cached(),
                  session_->last_call_ms());
  }

  std::optional<Config> cfg_;
  std::unique_ptr<Session> session_;
  std::shared_ptr<const SolverInfo> info_;
  std::mutex mu_;
};

namespace {

nb::list plugins_list(const std::vector<std::string>& extra) {
  auto reg = scanned_registry(extra);
  nb::list out;
  for (const PluginInfo& p : reg->plugins()) {
    nb::dict d;
    d["name"] = p.name;
    d["kind"] = std::string(to_string(p.kind));
    d["doc"] = p.doc;
    d["file"] = p.built_in ? std::string("<built-in>") : p.file.string();
    nb::list params;
    for (const ParamSpec& s : p.params) {
      nb::dict ps;
      ps["name"] = s.name;
      ps["type"] = std::string(to_string(s.type));
      ps["default"] = param_to_py(s.default_value);
      ps["doc"] = s.doc;
      params.append(ps);
    }
    d["params"] = params;
    out.append(d);
  }
  return out;
}

std::vector<std::string> plugin_problems(const std::vector<std::string>& extra) {
  auto reg = scanned_registry(extra);
  std::vector<std::string> out;
  for (const PluginProblem& p : reg->problems()) out.push_back(p.message);
  return out;
}

nb::tuple mask_from_config(const std::string& path, const std::vector<std::string>& overrides) {
  const Config cfg = load_config(path, overrides);
  const Problem p = make_problem(cfg);
  std::vector<Range> q, k;
  std::vector<int> t;
  for (const Slice& s : p.mask.slices()) {
    q.push_back(s.q);
    k.push_back(s.k);
    t.push_back(static_cast<int>(s.type));
  }
  return nb::make_tuple(ranges_array(q), ranges_array(k), numpy_of(t), p.seqlen());
}

nb::object sharding_ranges(Token seqlen, int cp_size) {
  if (cp_size < 1) throw Error("cp_size must be at least 1, got " + std::to_string(cp_size));
  if (seqlen < 1) throw Error("seqlen must be positive, got " + std::to_string(seqlen));
  const Sharding sh = Sharding::sequential(seqlen, cp_size);
  std::vector<Range> per_rank(static_cast<std::size_t>(cp_size));
  for (std::size_t b = 0; b < sh.blocks.size(); ++b) per_rank[static_cast<std::size_t>(sh.host[b])] = sh.blocks[b];
  return ranges_array(per_rank);
}

// The kernel model's view of one range arg (hardware/kernel_model.hpp): the
// tiles of tile_q x tile_k it touches and its exact area. The calibration
// (python -m cpsched.torch.calibrate) fits its measured times on these.
nb::dict kernel_arg_tiles(int form, Token q_len, Token k_len, int tile_q, int tile_k) {
  if (form < 0 || form > 3)
    throw Error("form: expected 0-3 (full, causal, inv_causal, bi_causal), got " + std::to_string(form));
  if (q_len < 1 || k_len < 1)
    throw Error("q_len, k_len: expected >= 1, got " + std::to_string(q_len) + " x " + std::to_string(k_len));
  if (tile_q < 1 || tile_k < 1)
    throw Error("tile_q, tile_k: expected >= 1, got " + std::to_string(tile_q) + " x " + std::to_string(tile_k));
  const auto type = static_cast<MaskType>(form);
  nb::dict d;
  d["tiles"] = tiles_touched(type, q_len, k_len, tile_q, tile_k);
  d["area"] = slice_area(Slice{{0, q_len}, {0, k_len}, type});
  return d;
}

// A hardware profile as a dict of its YAML keys (configs/hardware/*.yaml):
// what python -m cpsched.torch.calibrate copies into the profile it writes.
nb::dict hardware_profile_dict(const std::string& spec) {
  const HardwareProfile hw = resolve_hardware_profile(spec);
  const auto link = [](const Link& l) {
    nb::dict d;
    d["bandwidth_gb_s"] = l.bandwidth_gb_s;
    d["latency_us"] = l.latency_us;
    return d;
  };
  const auto rates = [](const KernelRates& r) {
    nb::dict d, tflops;
    d["tile"] = nb::make_tuple(r.tile_q, r.tile_k);
    d["call_us"] = r.call_us;
    d["entry_us"] = r.entry_us;
    d["lengths"] = r.lengths;
    for (int f = 0; f < kKernelForms; ++f) {
      const auto uf = static_cast<std::size_t>(f);
      const std::string name(to_string(static_cast<KernelForm>(f)));
      if (r.alias[uf] >= 0) tflops[name.c_str()] = std::string(to_string(static_cast<KernelForm>(r.alias[uf])));
      else if (!r.tflops[uf].empty()) tflops[name.c_str()] = r.tflops[uf];
    }
    d["tflops"] = tflops;
    return d;
  };
  nb::dict d, peak;
  d["name"] = hw.name;
  d["description"] = hw.description;
  d["source"] = hw.source;
  peak["fwd"] = hw.fwd_tflops;
  peak["bwd"] = hw.bwd_tflops;
  d["attention_tflops"] = peak;
  if (hw.kernel) {
    nb::dict k;
    k["fwd"] = rates(hw.kernel->fwd);
    k["bwd"] = rates(hw.kernel->bwd);
    d["kernel"] = k;
  } else {
    d["kernel"] = nb::none();
  }
  d["hbm_gb_s"] = hw.hbm_gb_s;
  d["gpus_per_node"] = hw.gpus_per_node;
  d["intra_node"] = link(hw.intra_node);
  d["inter_node"] = link(hw.inter_node);
  d["overlap"] = hw.overlap;
  return d;
}

// `cpsched run`: solve the config, execute the plan with its executor, report.
nb::dict run_config(const std::string& path, const std::vector<std::string>& overrides) {
  const Config cfg = load_config(path, overrides);
  if (cfg.executor.name.empty()) throw Error(path + ": no executor selected (executor.name)");
  ExecutionReport rep;
  std::shared_ptr<const SolveResult> plan;
  std::shared_ptr<SolverInfo> info = std::make_shared<SolverInfo>();
  double call_ms = 0;
  {
    nb::gil_scoped_release release;
    if (const auto mode = cfg.executor.given.find("mode");
        cfg.executor.name == "sim" && mode != cfg.executor.given.end() &&
        std::holds_alternative<std::string>(mode->second.first) &&
        std::get<std::string>(mode->second.first) == "numeric")
      check_resources(make_problem(cfg), /*sim_numeric=*/true);
    auto reg = std::make_shared<Registry>();
    reg->scan_default_folders(cfg.plugin_paths);
    Session session(cfg, reg);
    const auto t0 = std::chrono::steady_clock::now();
    session.solve_config_mask();  // the config's mask, index kinds too, as `cpsched run` solves it
    call_ms = ms_since(t0);
    plan = std::make_shared<const SolveResult>(session.result());
    info->solver = session.options().solver;
    info->solver_params = session.solver_params();
    const Params exec_params = resolve_selection(*reg, static_cast<int>(PluginKind::executor), cfg.executor);
    auto executor = reg->make_executor(cfg.executor.name, exec_params);
    ExecuteInput in;
    in.grid = plan->assignment->grid;
    in.problem = in.grid->problem_ptr();
    in.assignment = plan->assignment.get();
    in.plan = plan->plan.get();
    rep = executor->execute(in);
  }
  nb::dict d;
  d["passed"] = rep.passed;
  nb::dict figures;  // insertion-ordered, as the executor listed them
  for (const auto& [name, value] : rep.figures) figures[name.c_str()] = value;
  d["figures"] = figures;
  d["text"] = rep.text;
  d["svg"] = rep.svg;
  d["executor"] = cfg.executor.name;
  d["result"] = Result(std::move(plan), std::move(info), false, call_ms);
  return d;
}

}  // namespace

}  // namespace cpsched::py

NB_MODULE(_cpsched, m) {
  using namespace cpsched;
  using namespace cpsched::py;
  m.attr("__version__") = CPSCHED_VERSION_STRING;
  // nanobind lists every binding object still alive when the interpreter
  // ends as a leak: a Result held by a cycle that the collector cannot see
  // (torch's autograd graph saving a plan, kept by an uncaught exception's
  // traceback) or by a daemon thread (a plan made ahead, still solving) is
  // reported in some 30 lines that no user can act on. Off unless asked for
  // (CPSCHED_LEAK_WARNINGS=1), for work on the binding itself.
  {
    const char* v = std::getenv("CPSCHED_LEAK_WARNINGS");
    const std::string s = v ? v : "";
    nb::set_leak_warnings(s == "1" || s == "true" || s == "yes" || s == "on");
  }

  // Bad input -> ValueError, a plugin's own failure -> RuntimeError; the
  // message is the one the CLI prints after "cpsched <command>: error: ".
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const PluginError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::class_<Result>(m, "Result")
      // flat: the whole pass as a few int64 columns (flat_args, flat_comm) rather than a dict per stage and
      // collective: what cpsched.torch reads for every rank of a plan.
      .def("calc_meta", &Result::calc_meta, "rank"_a, "pass_"_a = "fwd", "flat"_a = false,
           "The rank's args of the pass: per stage a dict of arrays (q_ranges, k_ranges, mask_types, q_buffers, "
           "k_buffers, groups, index_offsets, index_widths). flat=True: every stage's args as int64 columns "
           "q, k (N x 2), type, q_remote, k_remote, group, index_offset (-1: a range arg), index_width, with "
           "stage s's args rows [stage_ptr[s], stage_ptr[s + 1]), and deferred_index_entries")
      .def("comm_meta", &Result::comm_meta, "rank"_a, "pass_"_a = "fwd", "flat"_a = false,
           "The rank's collectives of the pass: {stages, remote_qo_rows, remote_kv_rows}. flat=True: int64 "
           "columns: stage (N x 6: remote QO / KV tokens, QO / KV receive offsets, QO / KV reduce_after); "
           "collective c = 4 s + (0 qo, 1 kv, 2 qo_fwd, 3 kv_fwd) has input splits [in_ptr[c], in_ptr[c + 1]) "
           "of sizes, ranges (N x 2) and groups, split i sent to dst[dst_ptr[i]:dst_ptr[i + 1]], and output "
           "splits [out_ptr[c], out_ptr[c + 1]) of out_sizes, src and out_groups; remote_*_rows as above")
      .def("program", &Result::program, "rank"_a, "pass_"_a = "fwd",
           "The order rank runs the pass in: int32 rows (op, stage, kind, phase). op: 0 cast, 1 wait_cast, "
           "2 compute, 3 reduce, 4 wait_reduces, 5 merge; kind (reduce): 0 qo, 1 kv; phase (cast, reduce): "
           "0 first, 1 forwarding (cpsched/plan/program.hpp)")
      .def("metrics", &Result::metrics)
      .def("problem", &Result::problem,
           "The plan's problem as the plan JSON's \"problem\" names its fields (masks as arrays; head_dim_v, "
           "kv_shared always; head_masks, index_mask, index_summary None when absent)")
      .def("predicted_compute", &Result::predicted_compute, "rank"_a, "hardware"_a = nb::none())
      .def("to_json", &Result::to_json, "indent"_a = -1, "solve_ms"_a = nb::none(), "tasks"_a = true,
           "index_rows"_a = true)
      .def("index_rows", &Result::index_rows, "rank"_a, "pass_"_a = "fwd")
      .def("write_svg", &Result::write_svg, "path"_a, "groups"_a = std::vector<int>{}, "title"_a = "",
           "max_groups"_a = 0)
      .def("validate", &Result::validate)
      .def("task_ranks", &Result::task_ranks)
      .def_prop_ro("cached", &Result::cached)
      .def_prop_ro("call_ms", &Result::call_ms)
      .def_prop_ro("solve_ms", [](const Result& r) { return r.plan().solve_ms; })
      .def_prop_ro("plan_ms", [](const Result& r) { return r.plan().plan_ms; })
      .def_prop_ro("num_stages", [](const Result& r) { return r.plan().plan->num_stages; })
      .def_prop_ro("local_tail", [](const Result& r) { return r.plan().plan->local_tail; })
      .def_prop_ro("cp_size", [](const Result& r) { return r.plan().plan->ranks.size(); })
      .def_prop_ro("seqlen", [](const Result& r) { return r.plan().assignment->grid->problem().seqlen(); })
      .def_prop_ro("num_tasks", [](const Result& r) { return r.plan().assignment->grid->num_tasks(); })
      .def_prop_ro("feasible", [](const Result& r) { return r.plan().feasible; })
      .def_prop_ro("note", [](const Result& r) { return r.plan().note; })
      .def_prop_ro("figures", [](const Result& r) {
        nb::dict d;  // insertion-ordered, as the solver listed them
        for (const auto& [name, value] : r.plan().figures) d[name.c_str()] = value;
        return d;
      })
      .def_prop_ro("solver", [](const Result& r) { return r.solver(); })
      .def_prop_ro("layout", [](const Result& r) { return std::string(to_string(r.plan().plan->layout)); })
      .def_prop_ro("rank", [](const Result& r) {
        return r.plan().plan->only_rank >= 0 ? nb::object(nb::int_(r.plan().plan->only_rank)) : nb::none();
      })
      .def_prop_ro("host_ranges", [](const Result& r) {
        nb::list ranks;
        const Sharding& sh = r.plan().assignment->grid->sharding();
        for (Rank k = 0; k < sh.cp_size; ++k) {
          nb::list rs;
          const RangeSet held = sh.rank_tokens(k);
          for (const Range& x : held.ranges()) rs.append(nb::make_tuple(x.begin, x.end));
          ranks.append(rs);
        }
        return ranks;
      });

  nb::class_<AsyncSolve>(m, "_AsyncSolve")
      .def("done", &AsyncSolve::done)
      .def("get", &AsyncSolve::get);

  nb::class_<PySession>(m, "_Session")
      .def(
          "__init__",
          [](PySession* self, nb::kwargs options) {
            SessionOptions o = session_options_from(options);
            nb::gil_scoped_release release;  // loading plugins reads files
            new (self) PySession(std::move(o));
          },
          "options"_a,
          "Keyword options named as SessionOptions' fields: cp_size, seqlen, heads {q, kv, dim, dtype_bytes, dim_v, "
          "kv_shared}, grid {flatten_head_groups, blocks_per_rank}, layout ('fixed', 'planned'), solver, "
          "solver_params, cost_model, cost_params, plan {stages (n or 'auto'), relay ('off', 'on', 'auto'), "
          "node_size}, uses (n or 'ahead'), rank, cache_size, ahead_queue, plugin_paths, validate. Not given or "
          "None: SessionOptions' default.")
      .def_static(
          "from_config",
          [](const std::string& path, const std::vector<std::string>& overrides, std::optional<Rank> rank) {
            Config cfg = load_config(path, overrides);
            nb::gil_scoped_release release;
            return new PySession(std::move(cfg), rank.value_or(-1));  // None: every rank's plan
          },
          "path"_a, "overrides"_a, "rank"_a = nb::none())
      .def("solve", &PySession::solve, "q_ranges"_a, "k_ranges"_a, "types"_a)
      .def("solve_async", &PySession::solve_async, "q_ranges"_a, "k_ranges"_a, "types"_a)
      .def("solve_config", &PySession::solve_config)
      .def("solve_topk", &PySession::solve_topk, "indices"_a, "causal"_a = true)
      .def("summarize_topk", &PySession::summarize_topk, "rows"_a, "causal"_a = true)
      .def("solve_topk_summaries", &PySession::solve_topk_summaries, "summaries"_a, "rows"_a, "causal"_a = true)
      .def("summarize_topk_runs", &PySession::summarize_topk_runs, "rows"_a, "causal"_a = true)
      .def("solve_topk_runs", &PySession::solve_topk_runs, "summaries"_a, "own"_a, "width"_a, "area"_a,
           "kv_heads"_a, "causal"_a = true)
      .def("options", &PySession::options)
      .def("cache_stats", &PySession::cache_stats);

  m.def("plugins", &plugins_list, "plugin_paths"_a = std::vector<std::string>{});
  m.def("plugin_problems", &plugin_problems, "plugin_paths"_a = std::vector<std::string>{});
  m.def("mask_from_config", &mask_from_config, "path"_a, "overrides"_a = std::vector<std::string>{});
  m.def("sharding_ranges", &sharding_ranges, "seqlen"_a, "cp_size"_a);
  m.def("kernel_arg", &kernel_arg_tiles, "form"_a, "q_len"_a, "k_len"_a, "tile_q"_a, "tile_k"_a,
        "The kernel model's tiles touched and exact area of one range arg of a mask form (0 full, 1 causal, "
        "2 inv_causal, 3 bi_causal): {tiles, area}.");
  m.def("hardware_profile", &hardware_profile_dict, "spec"_a,
        "A hardware profile (a bundled name or a YAML path), parsed, as a dict of its YAML keys; kernel None "
        "without a kernel model.");
  m.def("program_error", &program_check, "rows"_a, "qo_after"_a, "kv_after"_a, "pass_"_a,
        "The core's program_error for a plan text's program (rows (op, stage, kind, phase) as Result.program "
        "gives them): (index of the first wrong instruction, or the row count when the end is wrong, reason), "
        "or None when the program is runnable.");
  m.def("run", &run_config, "path"_a, "overrides"_a = std::vector<std::string>{});
  m.def("default_plugin_dir", [] { return Registry::default_plugin_dir().string(); });
}
