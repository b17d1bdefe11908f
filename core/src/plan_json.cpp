// Plan export as JSON (docs/plan_format.md).
#include "cpsched/plan_json.hpp"

#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>

#include "cpsched/error.hpp"

namespace cpsched {

namespace {

using nlohmann::json;

json range(Range r) { return json::array({r.begin, r.end}); }

json ranges(const std::vector<Range>& rs) {
  json a = json::array();
  for (Range r : rs) a.push_back(range(r));
  return a;
}

json problem_json(const Problem& p, const Sharding& sh) {
  json hosts = json::array();
  for (const RangeSet& rs : sh.all_rank_tokens()) hosts.push_back(ranges(rs.ranges()));
  json mask = json::array();
  for (const Slice& s : p.mask.slices())
    mask.push_back({{"q", range(s.q)}, {"k", range(s.k)}, {"type", std::string(to_string(s.type))}});
  return {{"seqlen", p.seqlen()},          {"cp_size", p.cp_size()},
          {"heads_q", p.heads.q},          {"heads_kv", p.heads.kv},
          {"head_dim", p.heads.dim},       {"dtype_bytes", p.heads.dtype_bytes},
          {"head_groups", p.num_groups()}, {"flatten_head_groups", p.grid.flatten_head_groups},
          {"blocks_per_rank", p.grid.blocks_per_rank}, {"host_ranges", hosts},
          {"mask", mask}};
}

json params_json(const Params& ps) {
  json o = json::object();
  for (const auto& [name, v] : ps.values()) std::visit([&, n = name](const auto& x) { o[n] = x; }, v);
  return o;
}

json pass_metrics(const PassMetrics& m) {
  return {{"send", m.send}, {"recv", m.recv}, {"total_send", m.total_send}, {"bottleneck", m.bottleneck}};
}

json metrics_json(const Metrics& m) {
  return {{"fwd", pass_metrics(m.fwd)},
          {"bwd", pass_metrics(m.bwd)},
          {"load", m.load},
          {"stage0_load", m.stage0_load},
          {"imbalance", m.imbalance},
          {"stage0_share", m.stage0_share},
          {"remote_qo_tokens", m.remote_qo_tokens},
          {"remote_kv_tokens", m.remote_kv_tokens}};
}

json tasks_json(const Assignment& a) {
  const TaskGrid& g = *a.grid;
  json out = json::array();
  for (TaskId t = 0; t < g.num_tasks(); ++t) {
    const Cell& c = g.cell_of(t);
    out.push_back({{"q", ranges(c.rows.ranges())},
                   {"k", ranges(c.cols.ranges())},
                   {"q_block", c.qblock},
                   {"k_block", c.kblock},
                   {"group", g.group_of(t)},
                   {"rank", a.rank[static_cast<std::size_t>(t)]},
                   {"area", c.area}});
  }
  return out;
}

const char* buf_name(BufferId b) { return b == BufferId::local ? "local" : "remote"; }

json args_json(const std::vector<AttnArg>& args) {
  json out = json::array();
  for (const AttnArg& x : args)
    out.push_back({{"q", range(x.q)},
                   {"k", range(x.k)},
                   {"type", std::string(to_string(x.type))},
                   {"q_buf", buf_name(x.q_buf)},
                   {"k_buf", buf_name(x.k_buf)},
                   {"group", x.group}});
  return out;
}

json collective_json(const GroupCollectiveArg& g) {
  return {{"input_split_sizes", g.input_split_sizes}, {"input_ranges", ranges(g.input_ranges)},
          {"input_groups", g.input_groups},           {"dst_indices", g.dst_indices},
          {"output_split_sizes", g.output_split_sizes}, {"src_index", g.src_index},
          {"output_groups", g.output_groups}};
}

json pass_json(const PassPlan& p) {
  json remote = json::array();
  for (const auto& st : p.calc.remote_attn_args) remote.push_back(args_json(st));
  json stages = json::array();
  for (const StageComm& s : p.comm.stages)
    stages.push_back({{"num_remote_qo_tokens", s.num_remote_qo_tokens},
                      {"num_remote_kv_tokens", s.num_remote_kv_tokens},
                      {"qo_recv_offset", s.qo_recv_offset},
                      {"kv_recv_offset", s.kv_recv_offset},
                      {"qo_reduce_after", s.qo_reduce_after},
                      {"kv_reduce_after", s.kv_reduce_after},
                      {"qo", collective_json(s.qo)},
                      {"kv", collective_json(s.kv)}});
  return {{"calc", {{"local_attn_args", args_json(p.calc.local_attn_args)}, {"remote_attn_args", remote}}},
          {"comm", {{"stages", stages}}}};
}

}  // namespace

void write_plan_json(std::ostream& out, const PlanExport& e, int indent) {
  if (e.assignment == nullptr || e.assignment->grid == nullptr || e.metrics == nullptr)
    throw Error("plan export: an assignment with its grid and the metrics are required");
  const TaskGrid& g = *e.assignment->grid;
  json doc;
  doc["format"] = "cpsched-plan/1";
  doc["problem"] = problem_json(g.problem(), g.sharding());
  doc["solver"] = {{"name", e.solver},
                   {"params", params_json(e.solver_params)},
                   {"solve_ms", e.solve_ms},
                   {"feasible", e.assignment->feasible},
                   {"note", e.assignment->note}};
  if (e.include_tasks) doc["tasks"] = tasks_json(*e.assignment);
  doc["metrics"] = metrics_json(*e.metrics);
  if (e.plan != nullptr) {
    doc["stages"] = e.plan->num_stages;
    json rs = json::array();
    for (std::size_t r = 0; r < e.plan->ranks.size(); ++r)
      rs.push_back({{"rank", r}, {"fwd", pass_json(e.plan->ranks[r].fwd)}, {"bwd", pass_json(e.plan->ranks[r].bwd)}});
    doc["ranks"] = std::move(rs);
  }
  out << doc.dump(indent);
}

std::string plan_json(const PlanExport& e, int indent) {
  std::ostringstream s;
  write_plan_json(s, e, indent);
  return s.str();
}

}  // namespace cpsched
