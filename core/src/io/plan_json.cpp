// Plan export as JSON (docs/plan_format.md), streamed: a plan of P = 1024
// ranks is gigabytes of JSON, so it is written piece by piece instead of as a
// whole document tree (which took many times the file size in memory:
// docs/bounds.md#measurements-behind-code-constants). The output is
// byte-for-byte what nlohmann::json's dump() printed before: object keys in
// sorted order, the same indentation, and nlohmann's own formatting of reals
// and strings (test_plan_export checks parse(out).dump(indent) == out).
#include "cpsched/io/plan_json.hpp"

#include <charconv>
#include <concepts>
#include <sstream>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpsched/base/error.hpp"

namespace cpsched {

namespace {

// A streaming writer with nlohmann's layout: compact (indent < 0) or one
// element per line, `"key": value`, and `{}` / `[]` when empty. Keys must be
// given in sorted order by the caller, as nlohmann's std::map kept them.
class JsonOut {
 public:
  JsonOut(std::ostream& os, int indent) : os_(os), indent_(indent) { buf_.reserve(kFlushAt + 4096); }

  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }

  // Keys are fixed ASCII names here: no escaping needed.
  void key(std::string_view k) {
    element();
    buf_ += '"';
    buf_ += k;
    buf_ += indent_ >= 0 ? "\": " : "\":";
    after_key_ = true;
  }

  template <std::integral T>
  void value(T v) {
    if constexpr (std::same_as<T, bool>) {
      element();
      buf_ += v ? "true" : "false";
    } else {
      element();
      char tmp[48];
      const auto r = std::to_chars(tmp, tmp + sizeof tmp, v);
      buf_.append(tmp, r.ptr);
    }
    maybe_flush();
  }
  // Reals and strings are rare: nlohmann formats them, so they stay identical
  // (shortest round-trip reals with ".0", NaN as null, its escaping). Invalid
  // UTF-8 in a solver's note is replaced rather than failing the export.
  void value(double v) { raw(nlohmann::json(v).dump()); }
  void value(std::string_view s) {
    raw(nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  // A string known to need no escaping (ASCII letters, digits, spaces, '_'):
  // the program's instructions, a few dozen per rank and pass.
  void plain(std::string_view s) {
    element();
    buf_ += '"';
    buf_ += s;
    buf_ += '"';
    maybe_flush();
  }
  void value(const char* s) { value(std::string_view(s)); }
  void value(const std::string& s) { value(std::string_view(s)); }

  template <class T>
  void field(std::string_view k, const T& v) {
    key(k);
    value(v);
  }

  void range(Range r) {
    begin_array();
    value(r.begin);
    value(r.end);
    end_array();
  }
  void ranges(const std::vector<Range>& rs) {
    begin_array();
    for (Range r : rs) range(r);
    end_array();
  }
  template <class Xs>  // a std::vector or an IndexPool
  void list(const Xs& xs) {
    begin_array();
    for (const auto& x : xs) value(x);
    end_array();
  }

  void finish() {
    flush();
    os_.flush();
  }

 private:
  static constexpr std::size_t kFlushAt = 1 << 16;

  void raw(const std::string& text) {
    element();
    buf_ += text;
    maybe_flush();
  }
  // Before an element of an array or a key of an object: the separator and,
  // when pretty, a new line at the element's depth.
  void element() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (counts_.empty()) return;
    if (counts_.back()++ > 0) buf_ += ',';
    newline(counts_.size());
  }
  void open(char c) {
    element();
    buf_ += c;
    counts_.push_back(0);
  }
  void close(char c) {
    const bool any = counts_.back() > 0;
    counts_.pop_back();
    if (any) newline(counts_.size());
    buf_ += c;
    maybe_flush();
  }
  void newline(std::size_t depth) {
    if (indent_ < 0) return;
    buf_ += '\n';
    buf_.append(depth * static_cast<std::size_t>(indent_), ' ');
  }
  void maybe_flush() {
    if (buf_.size() >= kFlushAt) flush();
  }
  void flush() {
    os_.write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
    buf_.clear();
  }

  std::ostream& os_;
  int indent_;
  std::string buf_;
  std::vector<std::size_t> counts_;  // elements written so far, per open level
  bool after_key_ = false;
};

// Every object below writes its keys in sorted order (nlohmann's std::map).

void problem_json(JsonOut& j, const Problem& p, const Sharding& sh) {
  j.begin_object();
  j.field("blocks_per_rank", p.grid.blocks_per_rank);
  j.field("cp_size", p.cp_size());
  j.field("dtype_bytes", p.heads.dtype_bytes);
  j.field("flatten_head_groups", p.grid.flatten_head_groups);
  j.field("head_dim", p.heads.dim);  // d_qk
  // MLA keys only when the geometry is not GQA: existing JSON stays as it was.
  if (!p.heads.is_gqa()) j.field("head_dim_v", p.heads.dv());
  j.field("head_groups", p.num_groups());
  j.field("heads_kv", p.heads.kv);
  j.field("heads_q", p.heads.q);
  j.key("host_ranges");
  j.begin_array();
  for (const RangeSet& rs : sh.all_rank_tokens()) j.ranges(rs.ranges());
  j.end_array();
  auto slices_json = [&](const RangeMask& m) {
    j.begin_array();
    for (const Slice& s : m.slices()) {
      j.begin_object();
      j.key("k");
      j.range(s.k);
      j.key("q");
      j.range(s.q);
      j.field("type", to_string(s.type));
      j.end_object();
    }
    j.end_array();
  };
  // Masks per KV head and index masks only when present: range masks' JSON stays as it was.
  if (!p.head_masks.empty()) {
    j.key("head_masks");
    j.begin_array();
    for (const RangeMask& m : p.head_masks) slices_json(m);
    j.end_array();
  }
  if (p.index_mask) {  // its shape (the indices themselves are the plan's index args)
    const IndexMask& m = *p.index_mask;
    j.key("index_mask");
    j.begin_object();
    j.field("causal", m.causal);
    j.field("kind", to_string(m.kind));
    j.field("kv_heads", m.kv_heads);
    j.key("shape");
    j.list(m.indices.shape);
    j.end_object();
  }
  if (p.index_summary) {  // planned from the ranks' summaries (the rank's own index args are in its plan)
    const IndexSummary& m = *p.index_summary;
    j.key("index_summary");
    j.begin_object();
    j.field("causal", m.causal);
    j.field("cells", static_cast<std::int64_t>(m.cells.size()));
    j.field("kv_heads", m.kv_heads);
    j.end_object();
  }
  if (!p.heads.is_gqa()) j.field("kv_shared", p.heads.kv_shared);
  j.field("layout", to_string(p.layout));
  j.key("mask");
  slices_json(p.mask);
  j.field("seqlen", p.seqlen());
  j.end_object();
}

void params_json(JsonOut& j, const Params& ps) {
  j.begin_object();
  for (const auto& [name, v] : ps.values())  // a std::map: already sorted
    std::visit([&, &n = name](const auto& x) { j.field(n, x); }, v);
  j.end_object();
}

void pass_metrics(JsonOut& j, const PassMetrics& m) {
  j.begin_object();
  j.field("bottleneck", m.bottleneck);
  j.key("recv");
  j.list(m.recv);
  j.key("send");
  j.list(m.send);
  j.field("total_send", m.total_send);
  j.end_object();
}

void metrics_json(JsonOut& j, const Metrics& m) {
  j.begin_object();
  j.key("bwd");
  pass_metrics(j, m.bwd);
  j.key("fwd");
  pass_metrics(j, m.fwd);
  j.field("imbalance", m.imbalance);
  j.key("load");
  j.list(m.load);
  j.field("remote_kv_tokens", m.remote_kv_tokens);
  j.field("remote_qo_tokens", m.remote_qo_tokens);
  j.key("stage0_load");
  j.list(m.stage0_load);
  j.field("stage0_share", m.stage0_share);
  j.end_object();
}

void tasks_json(JsonOut& j, const Assignment& a) {
  const TaskGrid& g = *a.grid;
  j.begin_array();
  for (TaskId t = 0; t < g.num_tasks(); ++t) {
    const Cell& c = g.cell_of(t);
    j.begin_object();
    j.field("area", c.area);
    j.field("group", g.group_of(t));
    j.key("k");
    j.ranges(c.cols.ranges());
    j.field("k_block", c.kblock);
    j.key("q");
    j.ranges(c.rows.ranges());
    j.field("q_block", c.qblock);
    j.field("rank", a.rank[static_cast<std::size_t>(t)]);
    j.end_object();
  }
  j.end_array();
}

const char* buf_name(BufferId b) { return b == BufferId::local ? "local" : "remote"; }

void args_json(JsonOut& j, const std::vector<AttnArg>& args) {
  j.begin_array();
  for (const AttnArg& x : args) {
    j.begin_object();
    j.field("group", x.group);
    if (x.is_index()) {  // index args only: range masks' JSON stays byte for byte
      j.field("index_offset", x.index_offset);
      j.field("index_width", x.index_width);
    }
    j.key("k");
    j.range(x.k);
    j.field("k_buf", buf_name(x.k_buf));
    j.key("q");
    j.range(x.q);
    j.field("q_buf", buf_name(x.q_buf));
    j.field("type", to_string(x.type));
    j.end_object();
  }
  j.end_array();
}

void collective_json(JsonOut& j, const GroupCollectiveArg& g) {
  j.begin_object();
  j.key("dst_indices");
  j.begin_array();
  for (const auto& d : g.dst_indices) j.list(d);
  j.end_array();
  j.key("input_groups");
  j.list(g.input_groups);
  j.key("input_ranges");
  j.ranges(g.input_ranges);
  j.key("input_split_sizes");
  j.list(g.input_split_sizes);
  j.key("output_groups");
  j.list(g.output_groups);
  j.key("output_split_sizes");
  j.list(g.output_split_sizes);
  j.key("src_index");
  j.list(g.src_index);
  j.end_object();
}

void pass_json(JsonOut& j, const PassPlan& p, bool index_rows) {
  j.begin_object();
  j.key("calc");
  j.begin_object();
  if (p.calc.deferred_index_entries > 0) j.field("deferred_index_entries", p.calc.deferred_index_entries);
  if (index_rows && !p.calc.indices.empty()) {  // index masks only
    j.key("indices");
    j.list(p.calc.indices);
  }
  j.key("local_attn_args");
  args_json(j, p.calc.local_attn_args);
  j.key("remote_attn_args");
  j.begin_array();
  for (const auto& st : p.calc.remote_attn_args) args_json(j, st);
  j.end_array();
  j.end_object();
  j.key("comm");
  j.begin_object();
  // Only in plans whose index rows the executor writes: others keep their JSON byte for byte.
  auto remote_rows_json = [&](const char* key, const std::vector<RemoteRun>& runs) {
    if (runs.empty()) return;
    j.key(key);
    j.begin_array();
    for (const RemoteRun& r : runs) {
      j.begin_array();
      j.value(r.tokens.begin);
      j.value(r.tokens.end);
      j.value(r.row);
      j.value(r.group);
      j.end_array();
    }
    j.end_array();
  };
  remote_rows_json("remote_kv_rows", p.comm.remote_kv_rows);
  remote_rows_json("remote_qo_rows", p.comm.remote_qo_rows);
  j.key("stages");
  j.begin_array();
  for (const StageComm& s : p.comm.stages) {
    j.begin_object();
    // The forwarding phases (relays) only when present: plans without relays
    // keep their JSON byte for byte.
    auto forwarding_json = [&](const char* key, const GroupCollectiveArg& g) {
      if (g.input_split_sizes.empty() && g.output_split_sizes.empty()) return;
      j.key(key);
      collective_json(j, g);
    };
    j.key("kv");
    collective_json(j, s.kv);
    forwarding_json("kv_fwd", s.kv_fwd);
    j.field("kv_recv_offset", s.kv_recv_offset);
    j.field("kv_reduce_after", s.kv_reduce_after);
    j.field("num_remote_kv_tokens", s.num_remote_kv_tokens);
    j.field("num_remote_qo_tokens", s.num_remote_qo_tokens);
    j.key("qo");
    collective_json(j, s.qo);
    forwarding_json("qo_fwd", s.qo_fwd);
    j.field("qo_recv_offset", s.qo_recv_offset);
    j.field("qo_reduce_after", s.qo_reduce_after);
    j.end_object();
  }
  j.end_array();
  j.end_object();
  if (!p.program.empty()) {  // the order the rank runs the pass in (plan/program.hpp)
    j.key("program");
    j.begin_array();
    for (const Instr& i : p.program) j.plain(to_string(i));
    j.end_array();
  }
  j.end_object();
}

}  // namespace

void write_plan_json(std::ostream& out, const PlanExport& e, int indent) {
  if (e.assignment == nullptr || e.assignment->grid == nullptr || e.metrics == nullptr)
    throw Error("plan export: an assignment with its grid and the metrics are required");
  const TaskGrid& g = *e.assignment->grid;
  JsonOut j(out, indent);
  j.begin_object();
  j.field("format", "cpsched-plan/1");
  j.key("metrics");
  metrics_json(j, *e.metrics);
  j.key("problem");
  problem_json(j, g.problem(), g.sharding());
  if (e.plan != nullptr) {
    j.key("ranks");
    j.begin_array();
    for (std::size_t r = 0; r < e.plan->ranks.size(); ++r) {
      // A rank plan (PlanOptions::rank) lists its own rank only; "rank" says which.
      if (e.plan->only_rank >= 0 && r != static_cast<std::size_t>(e.plan->only_rank)) continue;
      j.begin_object();
      j.key("bwd");
      pass_json(j, e.plan->ranks[r].bwd, e.include_index_rows);
      j.key("fwd");
      pass_json(j, e.plan->ranks[r].fwd, e.include_index_rows);
      j.field("rank", r);
      j.end_object();
    }
    j.end_array();
  }
  j.key("solver");
  j.begin_object();
  j.field("feasible", e.feasible);
  j.field("name", e.solver);
  j.field("note", e.note);
  j.key("params");
  params_json(j, e.solver_params);
  j.field("solve_ms", e.solve_ms);
  j.end_object();
  if (e.plan != nullptr) j.field("stages", e.plan->num_stages);
  // Only in plans that end with a local tail: others keep their JSON byte for byte.
  if (e.plan != nullptr && e.plan->local_tail) j.field("local_tail", true);
  if (e.include_tasks) {
    j.key("tasks");
    tasks_json(j, *e.assignment);
  }
  j.end_object();
  j.finish();
}

std::string plan_json(const PlanExport& e, int indent) {
  std::ostringstream s;
  write_plan_json(s, e, indent);
  return s.str();
}

}  // namespace cpsched
