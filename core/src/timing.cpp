#include "cpsched/timing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "cpsched/error.hpp"
#include "cpsched/metrics.hpp"

namespace cpsched {

double PassTimeline::makespan() const {
  double t = 0;
  for (const RankTimeline& r : ranks) t = std::max(t, r.end);
  return t;
}

double arg_flops(const AttnArg& arg, const Problem& problem, Pass pass) {
  const double area = static_cast<double>(slice_area(Slice{arg.q, arg.k, arg.type}));
  const double qh = arg.group < 0 ? problem.heads.q : problem.q_heads_per_task();
  const double fwd = 4.0 * area * qh * problem.heads.dim;
  return pass == Pass::fwd ? fwd : 2.5 * fwd;
}

namespace {

constexpr int kIntra = 0, kInter = 1;

struct LinkLoad {
  double bytes = 0;
  std::int64_t messages = 0;
};

// What one rank moves in one collective, per direction and link class.
struct CommLoad {
  LinkLoad send[2], recv[2];
  bool empty() const {
    return send[0].messages + send[1].messages + recv[0].messages + recv[1].messages == 0;
  }
  double bytes() const { return send[0].bytes + send[1].bytes + recv[0].bytes + recv[1].bytes; }
  double seconds(const HardwareProfile& hw) const {
    double t = 0;
    for (int c = 0; c < 2; ++c) {
      const Link& l = c == kIntra ? hw.intra_node : hw.inter_node;
      for (const LinkLoad* x : {&send[c], &recv[c]})
        t = std::max(t, static_cast<double>(x->messages) * l.latency_us * 1e-6 + x->bytes / (l.bandwidth_gb_s * 1e9));
    }
    return t;
  }
};

struct Op {
  OpKind kind;
  int stage;
};

class PassSim {
 public:
  PassSim(const Problem& problem, const Plan& plan, const HardwareProfile& hw, Pass pass)
      : plan_(plan), hw_(hw), pass_(pass), problem_(problem),
        bpt_(pass == Pass::fwd ? fwd_bytes_per_token(problem) : bwd_bytes_per_token(problem)),
        P_(static_cast<int>(plan.ranks.size())), N_(plan.num_stages),
        mark_(static_cast<std::size_t>(P_), 0) {
    for (int r = 0; r < P_; ++r) {
      const PassPlan& pp = pass_plan(plan.ranks[static_cast<std::size_t>(r)], pass);
      if (static_cast<int>(pp.calc.remote_attn_args.size()) != N_ || static_cast<int>(pp.comm.stages.size()) != N_)
        throw Error(fmt::format("sim timing: rank {} {} plan has {} remote arg lists and {} comm stages, the plan "
                                "declares {} stages",
                                r, to_string(pass), pp.calc.remote_attn_args.size(), pp.comm.stages.size(), N_));
    }
  }

  PassTimeline run() {
    PassTimeline out;
    out.pass = pass_;
    out.ranks.resize(static_cast<std::size_t>(P_));
    free_.assign(static_cast<std::size_t>(P_), {0.0, 0.0});
    cast_end_.assign(static_cast<std::size_t>(P_) * static_cast<std::size_t>(N_ + 1), 0.0);
    std::vector<Op> program;
    if (N_ >= 1) program.push_back({OpKind::cast, 1});
    program.push_back({OpKind::compute, 0});
    for (int s = 1; s <= N_; ++s) {
      if (s < N_) program.push_back({OpKind::cast, s + 1});
      program.push_back({OpKind::compute, s});
      program.push_back({OpKind::reduce, s});
    }
    for (const Op& op : program) {
      if (op.kind == OpKind::compute) run_compute(op.stage, out);
      else run_comm(op, out);
    }
    for (int r = 0; r < P_; ++r) {
      const auto& f = free_[static_cast<std::size_t>(r)];
      out.ranks[static_cast<std::size_t>(r)].end = std::max(f[0], f[1]);
    }
    return out;
  }

 private:
  int compute_stream() const { return 0; }
  int comm_stream() const { return hw_.overlap ? 1 : 0; }
  const PassPlan& pp(int r) const { return pass_plan(plan_.ranks[static_cast<std::size_t>(r)], pass_); }
  double& cast_end(int r, int s) {
    return cast_end_[static_cast<std::size_t>(r) * static_cast<std::size_t>(N_ + 1) + static_cast<std::size_t>(s)];
  }

  void run_compute(int s, PassTimeline& out) {
    const double tflops = pass_ == Pass::fwd ? hw_.fwd_tflops : hw_.bwd_tflops;
    for (int r = 0; r < P_; ++r) {
      const CalcMeta& c = pp(r).calc;
      const auto& args = s == 0 ? c.local_attn_args : c.remote_attn_args[static_cast<std::size_t>(s - 1)];
      double flops = 0;
      for (const AttnArg& a : args) flops += arg_flops(a, problem_, pass_);
      if (flops <= 0) continue;
      double& f = free_[static_cast<std::size_t>(r)][static_cast<std::size_t>(compute_stream())];
      const double start = std::max(f, s > 0 ? cast_end(r, s) : 0.0);
      f = start + flops / (tflops * 1e12);
      out.ranks[static_cast<std::size_t>(r)].compute.push_back({OpKind::compute, s, start, f, 0.0});
    }
  }

  // Stage whose reduce follows compute(t) for stage s's outputs: the plan's
  // *_reduce_after, or the last stage when it is out of [s, N].
  int reduce_stage(int s, int after) const { return after >= s && after <= N_ ? after : N_; }

  // Calls f(arg, stage, kind, transposed) for every collective part of op on rank r.
  template <class F>
  void for_each_part(int r, const Op& op, F&& f) const {
    const auto& stages = pp(r).comm.stages;
    if (op.kind == OpKind::cast) {
      const StageComm& sc = stages[static_cast<std::size_t>(op.stage - 1)];
      f(sc.qo, CommKind::qo, false);
      f(sc.kv, CommKind::kv, false);
      return;
    }
    for (int s = 1; s <= N_; ++s) {
      const StageComm& sc = stages[static_cast<std::size_t>(s - 1)];
      if (reduce_stage(s, sc.qo_reduce_after) == op.stage) f(sc.qo, CommKind::qo, true);
      if (reduce_stage(s, sc.kv_reduce_after) == op.stage) f(sc.kv, CommKind::kv, true);
    }
  }

  double token_bytes(CommKind k, bool back) const {
    if (k == CommKind::qo) return static_cast<double>(back ? bpt_.qo_back : bpt_.qo_out);
    return static_cast<double>(back ? bpt_.kv_back : bpt_.kv_out);
  }

  bool valid_peer(int r, Rank p) const { return p >= 0 && p < P_ && p != r; }

  // Counts a message the first time a peer is seen under `epoch`.
  void add(LinkLoad& l, Rank peer, double bytes, std::uint32_t epoch) {
    l.bytes += bytes;
    if (mark_[static_cast<std::size_t>(peer)] != epoch) {
      mark_[static_cast<std::size_t>(peer)] = epoch;
      ++l.messages;
    }
  }

  // Cast: input splits go to their dsts, output splits come from their srcs.
  // Reduce (transposed): output splits go back to their srcs, input splits
  // come back from their dsts.
  CommLoad load_of(int r, const Op& op) {
    CommLoad load;
    for_each_part(r, op, [&](const GroupCollectiveArg& a, CommKind kind, bool back) {
      const double b = token_bytes(kind, back);
      if (b <= 0) return;
      const std::uint32_t e_in = ++epoch_, e_out = ++epoch_;
      const std::size_t ni = std::min(a.input_split_sizes.size(), a.dst_indices.size());
      for (std::size_t i = 0; i < ni; ++i)
        for (Rank d : a.dst_indices[i]) {
          if (!valid_peer(r, d)) continue;
          const int c = hw_.same_node(r, d) ? kIntra : kInter;
          add(back ? load.recv[c] : load.send[c], d, static_cast<double>(a.input_split_sizes[i]) * b, e_in);
        }
      const std::size_t no = std::min(a.output_split_sizes.size(), a.src_index.size());
      for (std::size_t j = 0; j < no; ++j) {
        const Rank p = a.src_index[j];
        if (!valid_peer(r, p)) continue;
        const int c = hw_.same_node(r, p) ? kIntra : kInter;
        add(back ? load.send[c] : load.recv[c], p, static_cast<double>(a.output_split_sizes[j]) * b, e_out);
      }
    });
    return load;
  }

  void run_comm(const Op& op, PassTimeline& out) {
    std::vector<CommLoad> loads(static_cast<std::size_t>(P_));
    std::vector<double> ready(static_cast<std::size_t>(P_), -1.0);  // -1: nothing to move
    for (int r = 0; r < P_; ++r) {
      loads[static_cast<std::size_t>(r)] = load_of(r, op);
      if (loads[static_cast<std::size_t>(r)].empty()) continue;
      const auto& f = free_[static_cast<std::size_t>(r)];
      double t = f[static_cast<std::size_t>(comm_stream())];
      if (op.kind == OpKind::reduce) t = std::max(t, f[static_cast<std::size_t>(compute_stream())]);
      ready[static_cast<std::size_t>(r)] = t;
    }
    for (int r = 0; r < P_; ++r) {
      const CommLoad& load = loads[static_cast<std::size_t>(r)];
      if (load.empty()) continue;
      double start = ready[static_cast<std::size_t>(r)];
      for_each_part(r, op, [&](const GroupCollectiveArg& a, CommKind kind, bool back) {
        if (token_bytes(kind, back) <= 0) return;
        for (const auto& dsts : a.dst_indices)
          for (Rank d : dsts)
            if (valid_peer(r, d)) start = std::max(start, ready[static_cast<std::size_t>(d)]);
        for (Rank p : a.src_index)
          if (valid_peer(r, p)) start = std::max(start, ready[static_cast<std::size_t>(p)]);
      });
      const double end = start + load.seconds(hw_);
      free_[static_cast<std::size_t>(r)][static_cast<std::size_t>(comm_stream())] = end;
      if (op.kind == OpKind::cast) cast_end(r, op.stage) = end;
      out.ranks[static_cast<std::size_t>(r)].comm.push_back({op.kind, op.stage, start, end, load.bytes()});
    }
  }

  const Plan& plan_;
  const HardwareProfile& hw_;
  Pass pass_;
  const Problem& problem_;
  TransferBytes bpt_;
  int P_, N_;
  std::vector<std::uint32_t> mark_;
  std::uint32_t epoch_ = 0;
  std::vector<std::array<double, 2>> free_;  // per rank, per stream: when it is free
  std::vector<double> cast_end_;             // per rank, per stage
};

}  // namespace

PassTimeline simulate_pass(const Problem& problem, const Plan& plan, const HardwareProfile& hw, Pass pass) {
  if (plan.num_stages < 0) throw Error("sim timing: plan has a negative stage count");
  if (static_cast<int>(plan.ranks.size()) != problem.cp_size())
    throw Error(fmt::format("sim timing: plan has {} ranks, the problem {}", plan.ranks.size(), problem.cp_size()));
  return PassSim(problem, plan, hw, pass).run();
}

Timeline simulate_timeline(const Problem& problem, const Plan& plan, const HardwareProfile& hw) {
  return {simulate_pass(problem, plan, hw, Pass::fwd), simulate_pass(problem, plan, hw, Pass::bwd)};
}

double compute_seconds(const Problem& problem, const PassPlan& plan, const HardwareProfile& hw, Pass pass) {
  double flops = 0;
  for (const AttnArg& a : plan.calc.local_attn_args) flops += arg_flops(a, problem, pass);
  for (const auto& stage : plan.calc.remote_attn_args)
    for (const AttnArg& a : stage) flops += arg_flops(a, problem, pass);
  return flops / ((pass == Pass::fwd ? hw.fwd_tflops : hw.bwd_tflops) * 1e12);
}

double compute_bound(const Problem& problem, const Plan& plan, const HardwareProfile& hw) {
  if (plan.ranks.empty()) return 0.0;
  double total = 0;
  for (const RankPlan& r : plan.ranks)
    total += compute_seconds(problem, r.fwd, hw, Pass::fwd) + compute_seconds(problem, r.bwd, hw, Pass::bwd);
  return total / static_cast<double>(plan.ranks.size());
}

StepEstimate estimate_step(const Problem& problem, const Plan& plan, const HardwareProfile& hw) {
  StepEstimate e;
  e.fwd = simulate_pass(problem, plan, hw, Pass::fwd).makespan();
  e.bwd = simulate_pass(problem, plan, hw, Pass::bwd).makespan();
  e.compute_bound = compute_bound(problem, plan, hw);
  return e;
}

}  // namespace cpsched
