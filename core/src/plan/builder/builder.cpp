#include "cpsched/plan/builder.hpp"

#include <algorithm>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/hardware/profile.hpp"
#include "plan/builder/internal.hpp"

namespace cpsched {

namespace {

// Where the remote rows of rank `r` come from (CommMeta::remote_*_rows),
// from the layout of the xfers it receives.
void fill_remote_rows(const Assignment& a, const plan_detail::Transfers& tr, const plan_detail::XferLayout& where,
                      Rank r, PassPlan& pass) {
  const bool flat = a.grid->flattened();
  for (RowKind kind : {RowKind::qo, RowKind::kv}) {
    std::vector<RemoteRun>& out = kind == RowKind::qo ? pass.comm.remote_qo_rows : pass.comm.remote_kv_rows;
    out.clear();
    for (std::size_t x = tr.dst_begin[static_cast<std::size_t>(r)]; x < tr.dst_begin[static_cast<std::size_t>(r) + 1];
         ++x) {
      const plan_detail::Xfer& xf = tr.xfers[x];
      if (xf.kind != kind) continue;
      for (std::size_t i = where.begin[x]; i < where.begin[x + 1]; ++i)
        out.push_back({where.runs[i].global, where.runs[i].off, flat ? xf.group : -1});
    }
    std::sort(out.begin(), out.end(), [](const RemoteRun& u, const RemoteRun& v) { return u.row < v.row; });
  }
}

void build_pass(const Assignment& a, const plan_detail::Transfers& tr, const std::vector<int>& stage, int stages,
                bool local_tail, const plan_detail::RelayOptions& relay, const PlanOptions& options,
                std::vector<PassPlan*>& pass) {
  const plan_detail::XferLayout where = plan_detail::layout_comm(a, tr, stage, stages, relay, pass, /*summary=*/nullptr,
                                                                 options.peers_comm ? -1 : options.rank);
  plan_detail::build_calc(a, tr, stage, where, stages, pass, options.index_rows, options.rank, options.buffers,
                          local_tail);
  // The executor writes the index rows of such a plan: it needs to know where each remote key landed.
  if (a.grid->problem().index_row_runs && options.rank >= 0)
    fill_remote_rows(a, tr, where, options.rank, *pass[static_cast<std::size_t>(options.rank)]);
}

// A price sheet's pass: what the timing model reads of build_pass's. Returns
// where the rows land with relays (none without: transfers land contiguous).
std::optional<plan_detail::XferLayout> sheet_pass(const Assignment& a, const plan_detail::Transfers& tr, const std::vector<int>& stage, int stages,
                bool local_tail, const plan_detail::RelayOptions& relay, const HardwareProfile* hw,
                const TaskKernelSeconds* kernel, Pass pass, PriceSheet::Pass& out) {
  plan_detail::SheetSink sink(a.grid->cp_size(), stages, hw != nullptr && hw->kernel.has_value());
  // (With relays, which relay forwards what is worked out as for a run, and
  // where the rows land, which cuts args under a kernel model.)
  std::optional<plan_detail::XferLayout> where;
  if (relay.node_size < 2) {
    plan_detail::summary_comm(tr, stage, sink);
  } else {
    std::vector<PassPlan*> none;
    where = plan_detail::layout_comm(a, tr, stage, stages, relay, none, &sink);
    if (!sink.keeps_layout()) where.reset();
  }
  sink.finish(out);
  plan_detail::sheet_calc(a, tr, stage, stages, local_tail, hw, kernel, pass, where ? &*where : nullptr, out);
  return where;
}

// The timer of a build that times plans (PlanOptions::timer); `what` names
// the choice in the error.
const StepTimer& timer_of(const PlanOptions& o, const char* what) {
  if (o.timer == nullptr)
    throw Error(fmt::format("plan: {} times plans on the hardware profile: PlanOptions::timer must be set (the "
                            "timing model's: timing_model_timer(), timing/model.hpp)",
                            what));
  return *o.timer;
}

void check_options(const PlanOptions& o) {
  if (o.stages < 1) throw Error(fmt::format("plan: stages must be at least 1, got {}", o.stages));
  if (o.relay_node_size < 0)
    throw Error(fmt::format("plan: relay_node_size must be 0 (no relays) or the ranks per node, got {}",
                            o.relay_node_size));
}

}  // namespace

struct PlanBuilder::State {
  Assignment a;
  int threads = 0;
  // Every rank's transfers, collected by the first build that needs them;
  // before that a rank's one-stage plan without relays is built from `own`,
  // only the transfers into and out of that rank (kept for the last such rank).
  mutable std::optional<plan_detail::Transfers> tr, own;
  TransferBytes fb, bb;
  mutable bool has_qo = false;
  // Built on first use (a one-stage plan needs neither).
  mutable std::optional<plan_detail::SendOrder> fwd_order, bwd_order;
  // The cut chosen for each (stages, relays, profile) priced so far.
  struct Chosen {
    int stages = 0;
    int relay_node_size = 0;
    HardwareProfile hardware;
    bool ports = false;
  };
  mutable std::vector<Chosen> chosen;
  // The cut priced earlier for this shape on this profile, null if none.
  const Chosen* chosen_for(const PlanOptions& o, const HardwareProfile& hw) const {
    for (const Chosen& c : chosen)
      if (c.stages == o.stages && c.relay_node_size == o.relay_node_size && c.hardware == hw) return &c;
    return nullptr;
  }

  const plan_detail::Transfers& all() const {
    if (!tr) {
      tr = plan_detail::collect_transfers(a, threads);
      own.reset();
      for (const plan_detail::Xfer& x : tr->xfers) has_qo |= x.kind == RowKind::qo;
    }
    return *tr;
  }
  // What a plan under `o` reads (a rank's own transfers need one stage and
  // no relays: the stage cut and the relays depend on every rank's).
  const plan_detail::Transfers& for_plan(const PlanOptions& o) const {
    if (tr || o.rank < 0 || o.peers_comm || o.stages != 1 || o.relay_node_size >= 2) return all();
    if (!own || own->only != o.rank) own = plan_detail::collect_transfers(a, threads, o.rank);
    return *own;
  }
  // What build()'s cut and assemble read: for_plan of its options.
  mutable const plan_detail::Transfers* current = nullptr;
  // The grid's task kernel seconds on the last kernel model priced (a
  // builder prices one placement many times).
  mutable std::shared_ptr<const TaskKernelSeconds> kernel;
  mutable HardwareProfile kernel_hw;
  const TaskKernelSeconds* kernel_seconds(const HardwareProfile& hw) const {
    if (!kernel || !(*kernel_hw.kernel == *hw.kernel) || kernel_hw.fwd_tflops != hw.fwd_tflops ||
        kernel_hw.bwd_tflops != hw.bwd_tflops) {
      kernel = task_kernel_seconds(*a.grid, hw);
      kernel_hw = hw;
    }
    return kernel.get();
  }
  const TransferTokens& tokens() const { return tr ? tr->tokens : own ? own->tokens : all().tokens; }
};

PlanBuilder::PlanBuilder(Assignment a) : PlanBuilder(std::move(a), 0) {}

PlanBuilder::PlanBuilder(Assignment a, int threads) : s_(std::make_unique<State>()) {
  if (threads < 0) throw Error(fmt::format("plan: threads must be 0 (by the grid's size) or more, got {}", threads));
  a.validate();
  s_->a = std::move(a);
  s_->threads = threads;
  const Problem& p = s_->a.grid->problem();
  s_->fb = fwd_bytes_per_token(p);
  s_->bb = bwd_bytes_per_token(p);
}

PlanBuilder::~PlanBuilder() = default;
PlanBuilder::PlanBuilder(PlanBuilder&&) noexcept = default;
PlanBuilder& PlanBuilder::operator=(PlanBuilder&&) noexcept = default;

const Assignment& PlanBuilder::assignment() const { return s_->a; }

namespace {

// (Transfer::group is -1 when head groups are not flattened, as in a task.)
std::vector<Transfer> transfers_of(const plan_detail::Transfers& tr, bool flattened) {
  std::vector<Transfer> out;
  out.reserve(tr.xfers.size());
  for (const plan_detail::Xfer& x : tr.xfers)
    out.push_back({x.kind, x.block, flattened ? x.group : -1, x.host, x.dst, x.tokens});
  return out;
}

}  // namespace

std::vector<Transfer> PlanBuilder::transfers() const { return transfers_of(s_->all(), s_->a.grid->flattened()); }

Metrics PlanBuilder::metrics() const { return compute_metrics(s_->a, s_->tokens()); }

std::vector<Transfer> transfers(const Assignment& a) {
  a.validate();
  std::vector<Transfer> out = transfers_of(plan_detail::collect_transfers(a), a.grid->flattened());
  std::sort(out.begin(), out.end(), [](const Transfer& x, const Transfer& y) {
    return std::tie(x.kind, x.block, x.group, x.dst) < std::tie(y.kind, y.block, y.group, y.dst);
  });
  return out;
}

Metrics compute_metrics(const Assignment& a) { return compute_metrics(a, transfers(a)); }

struct PlanBuilder::Cut {
  std::vector<int> fwd, bwd;  // stage (1..N) of every xfer in each pass
  bool local_tail = false;    // a stage N + 1 of local tasks only
  friend bool operator==(const Cut&, const Cut&) = default;
};

PlanBuilder::Cut PlanBuilder::cut(int stages, const HardwareProfile* by_ports) const {
  const Assignment& a = s_->a;
  const plan_detail::Transfers& tr = *s_->current;
  const TransferBytes& fb = s_->fb;
  const TransferBytes& bb = s_->bb;
  plan_detail::PortCosts ports;
  if (by_ports != nullptr) {
    ports.node_size = by_ports->gpus_per_node;
    if (by_ports->intra_node.bandwidth_gb_s > 0)
      ports.intra_cost = by_ports->inter_node.bandwidth_gb_s / by_ports->intra_node.bandwidth_gb_s;
  }
  auto cut_one = [&](const plan_detail::SendOrder& order) {
    return by_ports != nullptr ? plan_detail::assign_stages_by_ports(tr, order, stages, ports)
                               : plan_detail::assign_stages(tr, order, stages);
  };
  // The stage cut depends on the bytes per token only through the QO : KV
  // ratio, and not at all when nothing but KV moves.
  const bool same_cut = stages == 1 || !s_->has_qo || fb.qo_out * bb.kv_out == bb.qo_out * fb.kv_out;
  Cut c;
  c.fwd.assign(tr.xfers.size(), 1);
  if (stages > 1) {
    if (!s_->fwd_order) s_->fwd_order = plan_detail::send_order(a, tr, fb.qo_out, fb.kv_out);
    c.fwd = cut_one(*s_->fwd_order);
  }
  if (same_cut) {
    c.bwd = c.fwd;
  } else {
    if (!s_->bwd_order) s_->bwd_order = plan_detail::send_order(a, tr, bb.qo_out, bb.kv_out);
    c.bwd = cut_one(*s_->bwd_order);
  }
  return c;
}

Plan PlanBuilder::build(const PlanOptions& options) const {
  check_options(options);
  const Assignment& a = s_->a;
  const auto P = static_cast<std::size_t>(a.grid->cp_size());
  if (options.rank >= static_cast<Rank>(P))
    throw Error(fmt::format("plan: rank {} is outside [0, {})", options.rank, P));
  if (const Problem& pr = a.grid->problem(); pr.index_summary && options.index_rows) {
    // One rank's index rows (per-rank ingestion): only that rank's plan, and
    // only of its own queries.
    const Range mine = pr.own_index_queries();
    const Rank own = a.grid->sharding().host[static_cast<std::size_t>(a.grid->sharding().block_of(mine.begin))];
    if (options.rank != own)
      throw Error(fmt::format("plan: the problem holds rank {}'s index rows only (per-rank summaries): build rank {}'s "
                              "plan (PlanOptions::rank), not {}",
                              own, own, options.rank < 0 ? std::string("every rank's") : fmt::format("rank {}'s", options.rank)));
    for (TaskId t = 0; t < a.grid->num_tasks(); ++t)
      if (a.rank[static_cast<std::size_t>(t)] == own && a.grid->q_host(t) != own)
        throw Error(fmt::format("plan: task {} computes queries of rank {} on rank {}, which holds only its own index "
                                "rows (per-rank summaries: every query must stay on its host, owner's placement)",
                                t, a.grid->q_host(t), own));
  }
  s_->current = &s_->for_plan(options);
  return assemble(options, chosen_cut(options, nullptr, nullptr));
}

PriceSheet PlanBuilder::price_sheet(const PlanOptions& options) const { return price_sheet(options, nullptr); }

PriceSheet PlanBuilder::price_sheet(const PlanOptions& options, std::optional<StepEstimate>* timed) const {
  check_options(options);
  if (options.rank >= 0)
    throw Error("plan: a price sheet covers every rank (PlanOptions::rank must be -1, got " +
                std::to_string(options.rank) + ")");
  s_->current = &s_->all();
  std::optional<PriceSheet> kept;
  const Cut c = chosen_cut(options, &kept, timed);
  if (kept) return std::move(*kept);
  return sheet(options, c);
}

StepEstimate PlanBuilder::price(const PlanOptions& options, bool* forwards) const {
  if (options.hardware == nullptr) throw Error("plan: pricing a plan needs a hardware profile (PlanOptions::hardware)");
  check_options(options);
  const StepTimer& timer = timer_of(options, "pricing a plan");
  std::optional<StepEstimate> timed;
  const PriceSheet s = price_sheet(options, &timed);
  if (forwards) *forwards = s.has_forwarding();
  return timed ? *timed : timer.step(s_->a.grid->problem(), s, *options.hardware);
}

StepEstimate PlanBuilder::price(const PlanOptions& options, const HardwareProfile& areas, StepEstimate& on_areas,
                                bool* forwards, bool* forwards_on_areas) const {
  const HardwareProfile* hw = options.hardware;
  if (hw == nullptr) throw Error("plan: pricing a plan needs a hardware profile (PlanOptions::hardware)");
  check_options(options);
  const StepTimer& timer = timer_of(options, "pricing a plan");
  if (options.rank >= 0)
    throw Error("plan: a price sheet covers every rank (PlanOptions::rank must be -1, got " +
                std::to_string(options.rank) + ")");
  s_->current = &s_->all();
  const Problem& pr = s_->a.grid->problem();
  auto out = [&](const PriceSheet& k, const StepEstimate& ek, const PriceSheet& a, const StepEstimate& ea) {
    on_areas = ea;
    if (forwards) *forwards = k.has_forwarding();
    if (forwards_on_areas) *forwards_on_areas = a.has_forwarding();
    return ek;
  };
  if (options.stages < 2 || options.stage_cut != PlanOptions::StageCut::automatic || s_->current->xfers.empty()) {
    const PriceSheet s = sheet(options, chosen_cut(options, nullptr, nullptr));  // (one cut: nothing to choose)
    return out(s, timer.step(pr, s, *hw), s, timer.step(pr, s, areas));
  }
  // The automatic cut: the one chosen on exact areas (chosen_cut: under a
  // kernel model too), its sheet on each profile.
  PlanOptions on_areas_options = options;
  on_areas_options.hardware = &areas;
  std::optional<PriceSheet> kept;
  std::optional<StepEstimate> kept_step;
  const Cut c = chosen_cut(on_areas_options, &kept, &kept_step);
  const Cut k = chosen_cut(options, nullptr, nullptr);  // (the same cut, from the choice just made)
  const PriceSheet ks = sheet(options, k);
  const PriceSheet as = kept ? std::move(*kept) : sheet(on_areas_options, c);
  const StepEstimate ea = kept_step ? *kept_step : timer.step(pr, as, areas);
  return out(ks, timer.step(pr, ks, *hw), as, ea);
}

PlanBuilder::Cut PlanBuilder::chosen_cut(const PlanOptions& options, std::optional<PriceSheet>* kept,
                                         std::optional<StepEstimate>* kept_step) const {
  const HardwareProfile* hw = options.hardware;
  if (options.stage_cut == PlanOptions::StageCut::ports && hw == nullptr)
    throw Error("plan: the ports' stage cut (PlanOptions::stage_cut = ports) needs a hardware profile "
                "(PlanOptions::hardware)");
  if (hw == nullptr || options.stages < 2 || s_->current->xfers.empty()) return cut(options.stages, nullptr);
  // On a profile with two or more stages every cut ends with the local tail.
  auto tailed = [&](bool by_ports) {
    Cut c = cut(options.stages, by_ports ? hw : nullptr);
    c.local_tail = true;
    return c;
  };
  if (options.stage_cut != PlanOptions::StageCut::automatic)
    return tailed(options.stage_cut == PlanOptions::StageCut::ports);
  const StepTimer& timer = timer_of(options, "the automatic stage cut");

  // Both cuts priced on the profile (every rank's price sheet: a rank
  // building its own plan chooses as the others do), once per shape and
  // profile.
  if (const State::Chosen* c = s_->chosen_for(options, *hw)) return tailed(c->ports);
  // Under a kernel model the cut is chosen on exact areas, as on the profile
  // without the table (the links are the same): today's cut, at today's cost
  // (sheets without the kernels' content, which cost the used-once path
  // fewer instructions than the kernels' own sheets:
  // docs/bounds.md#measurements-behind-code-constants).
  // The kernel model prices the plan of the cut chosen.
  std::optional<HardwareProfile> flat;
  if (hw->kernel) {
    flat = *hw;
    flat->kernel.reset();
    if (const State::Chosen* c = s_->chosen_for(options, *flat)) {
      const bool ports = c->ports;
      s_->chosen.push_back({options.stages, options.relay_node_size, *hw, ports});
      return tailed(ports);
    }
  }
  const Cut receivers = tailed(false), by_ports = tailed(true);
  bool ports = false;
  if (!(by_ports == receivers)) {
    // (Two or more stages: the current transfers are every rank's.)
    PlanOptions on = options;
    if (flat) on.hardware = &*flat;
    PriceSheet pa = sheet(on, receivers), pb = sheet(on, by_ports);
    const Problem& pr = s_->a.grid->problem();
    const StepEstimate eb = timer.step(pr, pb, *on.hardware), ea = timer.step(pr, pa, *on.hardware);
    ports = eb.step() < ea.step();
    if (!flat) {  // (a sheet on exact areas is not the kernels' sheet)
      if (kept) *kept = ports ? std::move(pb) : std::move(pa);
      if (kept_step) *kept_step = ports ? eb : ea;
    }
  }
  if (flat) s_->chosen.push_back({options.stages, options.relay_node_size, *flat, ports});
  s_->chosen.push_back({options.stages, options.relay_node_size, *hw, ports});
  return ports ? by_ports : receivers;
}

PriceSheet PlanBuilder::sheet(const PlanOptions& options, const Cut& cut) const {
  const Assignment& a = s_->a;
  const plan_detail::Transfers& tr = *s_->current;
  PriceSheet out;
  out.ranks = a.grid->cp_size();
  out.stages = options.stages + (cut.local_tail ? 1 : 0);
  out.local_tail = cut.local_tail;
  out.flattened = a.grid->flattened();
  const HardwareProfile* hw = options.hardware;
  if (hw && hw->kernel) {
    out.kernel = hw->kernel;
    out.peak_tflops[0] = hw->fwd_tflops;
    out.peak_tflops[1] = hw->bwd_tflops;
  }
  const int node = options.relay_node_size >= 2 ? options.relay_node_size : 0;
  const TaskKernelSeconds* kernel = out.kernel ? s_->kernel_seconds(*hw) : nullptr;
  const std::optional<plan_detail::XferLayout> where = sheet_pass(
      a, tr, cut.fwd, out.stages, cut.local_tail, {node, s_->fb.qo_out, s_->fb.kv_out}, hw, kernel, Pass::fwd, out.fwd);
  if (cut.bwd == cut.fwd) {
    out.bwd = out.fwd;  // (as a plan's backward description is then its forward one)
    // Its args are the forward's: the backward's kernel seconds of them.
    if (out.kernel)
      plan_detail::sheet_calc(a, tr, cut.bwd, out.stages, cut.local_tail, hw, kernel, Pass::bwd,
                              where ? &*where : nullptr, out.bwd);
  } else {
    sheet_pass(a, tr, cut.bwd, out.stages, cut.local_tail, {node, s_->bb.qo_out, s_->bb.kv_out}, hw, kernel,
               Pass::bwd, out.bwd);
  }
  return out;
}

PlanShape::Cut PlanBuilder::cut_of(const PlanOptions& options) const {
  const HardwareProfile* hw = options.hardware;
  if (hw == nullptr || options.stages < 2) return PlanShape::Cut::automatic;
  if (options.stage_cut != PlanShape::Cut::automatic) return options.stage_cut;
  if (const State::Chosen* c = s_->chosen_for(options, *hw))
    return c->ports ? PlanShape::Cut::ports : PlanShape::Cut::receivers;
  return PlanShape::Cut::automatic;
}

Plan PlanBuilder::assemble(const PlanOptions& options, const Cut& cut) const {
  const int stages = options.stages + (cut.local_tail ? 1 : 0);
  const Assignment& a = s_->a;
  const plan_detail::Transfers& tr = *s_->current;
  const TransferBytes& fb = s_->fb;
  const TransferBytes& bb = s_->bb;
  const auto P = static_cast<std::size_t>(a.grid->cp_size());

  Plan plan;
  plan.num_stages = stages;
  plan.local_tail = cut.local_tail;
  plan.sharding = a.grid->sharding();
  plan.layout = a.grid->problem().layout;
  plan.only_rank = options.rank;
  plan.ranks.resize(P);
  const std::vector<int>& fwd_stage = cut.fwd;
  const std::vector<int>& bwd_stage = cut.bwd;

  std::vector<PassPlan*> pass(P);
  for (std::size_t r = 0; r < P; ++r) pass[r] = &plan.ranks[r].fwd;
  const int node = options.relay_node_size >= 2 ? options.relay_node_size : 0;
  build_pass(a, tr, fwd_stage, stages, cut.local_tail, {node, fb.qo_out, fb.kv_out}, options, pass);
  if (bwd_stage == fwd_stage) {
    // Same stage cut: the backward description is the forward one (sharing its index pool).
    for (std::size_t r = 0; r < P; ++r)
      if (options.rank < 0 || options.peers_comm || static_cast<Rank>(r) == options.rank)
        plan.ranks[r].bwd = plan.ranks[r].fwd;
  } else {
    for (std::size_t r = 0; r < P; ++r) pass[r] = &plan.ranks[r].bwd;
    build_pass(a, tr, bwd_stage, stages, cut.local_tail, {node, bb.qo_out, bb.kv_out}, options, pass);
  }
  // The order each rank runs its passes in: the default program, written once here.
  for (std::size_t r = 0; r < P; ++r)
    if (options.rank < 0 || options.peers_comm || static_cast<Rank>(r) == options.rank) {
      RankPlan& rp = plan.ranks[r];
      rp.fwd.program = pass_program(rp.fwd.comm.stages, Pass::fwd);
      rp.bwd.program = pass_program(rp.bwd.comm.stages, Pass::bwd);
    }

#ifndef NDEBUG
  const std::vector<std::string> problems =
      options.rank < 0 && (options.index_rows || !a.grid->index_cells()) ? validate_plan(a, plan)
                                                                          : std::vector<std::string>{};
  if (!problems.empty()) {
    std::string msg = fmt::format("plan builder produced an invalid plan ({} problems):", problems.size());
    for (std::size_t i = 0; i < problems.size() && i < 20; ++i) msg += "\n  " + problems[i];
    throw Error(msg);
  }
#endif
  return plan;
}

Plan build_plan(const Assignment& a, const PlanOptions& options) {
  check_options(options);  // before the assignment's checks, as the builder's own errors come first
  return PlanBuilder(a).build(options);
}

}  // namespace cpsched
