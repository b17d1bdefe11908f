#include "plan_arrays.hpp"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "arrays.hpp"

namespace cpsched::py {

// One overload per field type of the plan structs, so that a field added to
// GroupCollectiveArg or StageComm is one line in the tables below.
static nb::object to_py(Token v) { return nb::int_(v); }
static nb::object to_py(int v) { return nb::int_(v); }
static nb::object to_py(const std::vector<Token>& v) { return numpy_of(v); }
static nb::object to_py(const std::vector<int>& v) { return numpy_of(v); }
static nb::object to_py(const std::vector<Range>& v) { return ranges_array(v); }
static nb::object to_py(const std::vector<std::vector<Rank>>& v) {
  nb::list out;
  for (const auto& x : v) out.append(numpy_of(x));
  return out;
}

// GroupCollectiveArg's fields, in the order of plan.hpp.
template <class F>
void collective_fields(F&& f) {
  f("input_split_sizes", &GroupCollectiveArg::input_split_sizes);
  f("input_ranges", &GroupCollectiveArg::input_ranges);
  f("input_groups", &GroupCollectiveArg::input_groups);
  f("dst_indices", &GroupCollectiveArg::dst_indices);
  f("output_split_sizes", &GroupCollectiveArg::output_split_sizes);
  f("src_index", &GroupCollectiveArg::src_index);
  f("output_groups", &GroupCollectiveArg::output_groups);
}

static nb::object to_py(const GroupCollectiveArg& a) {
  nb::dict d;
  collective_fields([&](const char* name, auto member) { d[name] = to_py(a.*member); });
  return d;
}

// StageComm's fields, in the order of plan.hpp.
template <class F>
void stage_fields(F&& f) {
  f("num_remote_qo_tokens", &StageComm::num_remote_qo_tokens);
  f("num_remote_kv_tokens", &StageComm::num_remote_kv_tokens);
  f("qo_recv_offset", &StageComm::qo_recv_offset);
  f("kv_recv_offset", &StageComm::kv_recv_offset);
  f("qo_reduce_after", &StageComm::qo_reduce_after);
  f("kv_reduce_after", &StageComm::kv_reduce_after);
  f("qo", &StageComm::qo);
  f("kv", &StageComm::kv);
  f("qo_fwd", &StageComm::qo_fwd);  // relays' forwarding phase (empty without relays)
  f("kv_fwd", &StageComm::kv_fwd);
}

nb::object to_py(const StageComm& s) {
  nb::dict d;
  stage_fields([&](const char* name, auto member) { d[name] = to_py(s.*member); });
  return d;
}

// A list of attention calls as parallel arrays (the seed's (q_range,
// k_range, mask_type) triples, plus the buffers and the head group).
nb::object attn_args(const std::vector<AttnArg>& args) {
  std::vector<Range> q, k;
  std::vector<int> type, qb, kb, group, width;
  std::vector<std::int64_t> offset;
  for (const AttnArg& a : args) {
    q.push_back(a.q);
    k.push_back(a.k);
    type.push_back(static_cast<int>(a.type));
    qb.push_back(static_cast<int>(a.q_buf));
    kb.push_back(static_cast<int>(a.k_buf));
    group.push_back(a.group);
    width.push_back(a.index_width);
    offset.push_back(a.is_index() ? a.index_offset : -1);  // -1: a range arg (the plan JSON has no offset)
  }
  nb::dict d;
  d["q_ranges"] = ranges_array(q);
  d["k_ranges"] = ranges_array(k);
  d["mask_types"] = numpy_of(type);
  d["q_buffers"] = numpy_of(qb);
  d["k_buffers"] = numpy_of(kb);
  d["groups"] = numpy_of(group);
  d["index_offsets"] = numpy_of(offset);
  d["index_widths"] = numpy_of(width);
  return d;
}

// A rank's remote rows of one kind (CommMeta::remote_*_rows): int64 rows (begin, end, row, group).
nb::object remote_runs(const std::vector<RemoteRun>& runs) {
  std::vector<std::int64_t> flat;
  flat.reserve(4 * runs.size());
  for (const RemoteRun& r : runs)
    for (std::int64_t v : {std::int64_t{r.tokens.begin}, std::int64_t{r.tokens.end}, std::int64_t{r.row},
                           std::int64_t{r.group}})
      flat.push_back(v);
  return numpy_from(std::move(flat), runs.size(), 4);
}

// Int64 columns filled in one pass over a plan's items, then handed to numpy without a copy.
using Column = std::vector<std::int64_t>;
static nb::object column(Column&& c) {
  const std::size_t n = c.size();
  return numpy_from(std::move(c), n, 0);
}
static nb::object column2(Column&& c) {  // pairs (begin, end)
  const std::size_t n = c.size() / 2;
  return numpy_from(std::move(c), n, 2);
}

// A pass's args, stage 0's then each remote stage's, as int64 columns; args of stage s are rows
// [stage_ptr[s], stage_ptr[s + 1]). index_offset is -1 for a range arg (the plan JSON has none).
nb::dict flat_args(const CalcMeta& c) {
  Column q, k, type, qr, kr, group, offset, width, ptr{0};
  auto add = [&](const std::vector<AttnArg>& args) {
    for (const AttnArg& a : args) {
      q.insert(q.end(), {a.q.begin, a.q.end});
      k.insert(k.end(), {a.k.begin, a.k.end});
      type.push_back(static_cast<int>(a.type));
      qr.push_back(a.q_buf == BufferId::remote);
      kr.push_back(a.k_buf == BufferId::remote);
      group.push_back(a.group);
      offset.push_back(a.is_index() ? a.index_offset : -1);
      width.push_back(a.index_width);
    }
    ptr.push_back(static_cast<std::int64_t>(type.size()));
  };
  add(c.local_attn_args);
  for (const auto& s : c.remote_attn_args) add(s);
  nb::dict d;
  d["q"] = column2(std::move(q));
  d["k"] = column2(std::move(k));
  d["type"] = column(std::move(type));
  d["q_remote"] = column(std::move(qr));
  d["k_remote"] = column(std::move(kr));
  d["group"] = column(std::move(group));
  d["index_offset"] = column(std::move(offset));
  d["index_width"] = column(std::move(width));
  d["stage_ptr"] = column(std::move(ptr));
  d["deferred_index_entries"] = c.deferred_index_entries;
  return d;
}

// A pass's comm as int64 columns: `stage` (N x 6: num_remote_qo_tokens, num_remote_kv_tokens, qo_recv_offset,
// kv_recv_offset, qo_reduce_after, kv_reduce_after); the collectives c = 4 s + (0 qo, 1 kv, 2 qo_fwd, 3 kv_fwd)
// of stage s (0-based) have input splits [in_ptr[c], in_ptr[c + 1]) of sizes / ranges / groups, whose receivers
// are dst[dst_ptr[i]:dst_ptr[i + 1]], and output splits [out_ptr[c], out_ptr[c + 1]) of out_sizes / src /
// out_groups; remote_qo_rows / remote_kv_rows as comm_meta's.
nb::dict flat_comm(const CommMeta& c) {
  Column stage, in_ptr{0}, sizes, ranges, groups, dst_ptr{0}, dst, out_ptr{0}, out_sizes, src, out_groups;
  auto add = [&](const GroupCollectiveArg& g) {
    for (std::size_t i = 0; i < g.input_split_sizes.size(); ++i) {
      sizes.push_back(g.input_split_sizes[i]);
      ranges.insert(ranges.end(), {g.input_ranges[i].begin, g.input_ranges[i].end});
      groups.push_back(g.input_groups[i]);
      dst.insert(dst.end(), g.dst_indices[i].begin(), g.dst_indices[i].end());
      dst_ptr.push_back(static_cast<std::int64_t>(dst.size()));
    }
    in_ptr.push_back(static_cast<std::int64_t>(sizes.size()));
    out_sizes.insert(out_sizes.end(), g.output_split_sizes.begin(), g.output_split_sizes.end());
    src.insert(src.end(), g.src_index.begin(), g.src_index.end());
    out_groups.insert(out_groups.end(), g.output_groups.begin(), g.output_groups.end());
    out_ptr.push_back(static_cast<std::int64_t>(out_sizes.size()));
  };
  for (const StageComm& s : c.stages) {
    stage.insert(stage.end(), {s.num_remote_qo_tokens, s.num_remote_kv_tokens, s.qo_recv_offset, s.kv_recv_offset,
                               s.qo_reduce_after, s.kv_reduce_after});
    for (const GroupCollectiveArg* g : {&s.qo, &s.kv, &s.qo_fwd, &s.kv_fwd}) add(*g);
  }
  nb::dict d;
  const std::size_t n = c.stages.size();
  d["stage"] = numpy_from(std::move(stage), n, 6);
  d["in_ptr"] = column(std::move(in_ptr));
  d["sizes"] = column(std::move(sizes));
  d["ranges"] = column2(std::move(ranges));
  d["groups"] = column(std::move(groups));
  d["dst_ptr"] = column(std::move(dst_ptr));
  d["dst"] = column(std::move(dst));
  d["out_ptr"] = column(std::move(out_ptr));
  d["out_sizes"] = column(std::move(out_sizes));
  d["src"] = column(std::move(src));
  d["out_groups"] = column(std::move(out_groups));
  d["remote_qo_rows"] = remote_runs(c.remote_qo_rows);
  d["remote_kv_rows"] = remote_runs(c.remote_kv_rows);
  return d;
}

// A range mask's slices as the arrays a Session's solve takes: q_ranges, k_ranges (N x 2), mask_types.
static nb::dict slices_dict(const RangeMask& m) {
  std::vector<Range> q, k;
  std::vector<int> t;
  for (const Slice& s : m.slices()) {
    q.push_back(s.q);
    k.push_back(s.k);
    t.push_back(static_cast<int>(s.type));
  }
  nb::dict d;
  d["q_ranges"] = ranges_array(q);
  d["k_ranges"] = ranges_array(k);
  d["mask_types"] = numpy_of(t);
  return d;
}

// The problem's fields, named as the plan JSON's "problem" (docs/plan_format.md); head_dim_v and kv_shared
// always (the JSON has them for MLA only), masks as slices_dict's arrays, host ranges one N x 2 array per rank.
nb::dict problem_dict(const Problem& p, const Sharding& sh) {
  nb::dict d;
  d["blocks_per_rank"] = p.grid.blocks_per_rank;
  d["cp_size"] = p.cp_size();
  d["dtype_bytes"] = p.heads.dtype_bytes;
  d["flatten_head_groups"] = p.grid.flatten_head_groups;
  d["head_dim"] = p.heads.dim;
  d["head_dim_v"] = p.heads.dv();
  d["head_groups"] = p.num_groups();
  d["heads_kv"] = p.heads.kv;
  d["heads_q"] = p.heads.q;
  d["kv_shared"] = p.heads.kv_shared;
  nb::list hosts;
  for (const RangeSet& rs : sh.all_rank_tokens()) hosts.append(ranges_array(rs.ranges()));
  d["host_ranges"] = hosts;
  nb::list heads;
  for (const RangeMask& m : p.head_masks) heads.append(slices_dict(m));
  d["head_masks"] = p.head_masks.empty() ? nb::object(nb::none()) : nb::object(heads);
  d["index_mask"] = nb::none();
  if (p.index_mask) {
    const IndexMask& m = *p.index_mask;
    nb::dict im;
    im["causal"] = m.causal;
    im["kind"] = std::string(to_string(m.kind));
    im["kv_heads"] = m.kv_heads;
    nb::list shape;
    for (std::int64_t n : m.indices.shape) shape.append(n);
    im["shape"] = shape;
    d["index_mask"] = im;
  }
  d["index_summary"] = nb::none();
  if (p.index_summary) {
    const IndexSummary& m = *p.index_summary;
    nb::dict is;
    is["causal"] = m.causal;
    is["cells"] = static_cast<std::int64_t>(m.cells.size());
    is["kv_heads"] = m.kv_heads;
    d["index_summary"] = is;
  }
  d["layout"] = std::string(to_string(p.layout));
  d["mask"] = slices_dict(p.mask);
  d["seqlen"] = p.seqlen();
  return d;
}

static nb::dict pass_metrics(const PassMetrics& m) {
  nb::dict d;
  d["send"] = numpy_of(m.send);
  d["recv"] = numpy_of(m.recv);
  d["total_send"] = m.total_send;
  d["bottleneck"] = m.bottleneck;
  return d;
}

nb::dict metrics_dict(const Metrics& m) {
  nb::dict d;
  d["fwd"] = pass_metrics(m.fwd);
  d["bwd"] = pass_metrics(m.bwd);
  d["load"] = numpy_of(m.load);
  d["stage0_load"] = numpy_of(m.stage0_load);
  d["imbalance"] = m.imbalance;
  d["stage0_share"] = m.stage0_share;
  d["remote_qo_tokens"] = m.remote_qo_tokens;
  d["remote_kv_tokens"] = m.remote_kv_tokens;
  return d;
}

}  // namespace cpsched::py
