#include "cpsched/timing/model.hpp"

#include "cpsched/plan/program.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "cpsched/base/error.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/hardware/task_kernel.hpp"

namespace cpsched {

double PassTimeline::makespan() const {
  double t = 0;
  for (const RankTimeline& r : ranks) t = std::max(t, r.end);
  return t;
}

namespace {

// FLOPs of `area` pairs over one head group's q heads (all q heads when
// groups are not flattened).
double area_flops(Token area, bool one_group, const Problem& problem, Pass pass) {
  const double qh = one_group ? problem.q_heads_per_task() : problem.heads.q;
  const double fwd = static_cast<double>(area) * qh * problem.heads.fwd_flops_per_pair();  // 4 x area x qh x D under GQA
  return pass == Pass::fwd ? fwd : problem.heads.bwd_flops_ratio() * fwd;
}

}  // namespace

double arg_flops(const AttnArg& arg, const CalcMeta& calc, const Problem& problem, Pass pass) {
  return area_flops(arg_area(arg, calc), arg.group >= 0, problem, pass);
}

KernelArg kernel_arg(const AttnArg& a, const CalcMeta& calc) {
  if (a.is_index()) return {KernelForm::index, a.q.size(), a.k.size(), arg_area(a, calc), a.index_width};
  return {kernel_form(a.type), a.q.size(), a.k.size(), arg_area(a, calc), 0};
}

namespace {

// Kernel seconds of a list of args run as one stage: each arg, then one call
// per (q buffer, k buffer, form) the kernel model holds.
double stage_kernel_seconds(const std::vector<AttnArg>& args, const CalcMeta& calc, const Problem& problem,
                            const KernelModel& km, Pass pass, double peak_tflops) {
  if (args.empty()) return 0.0;
  KernelStage stage(km, pass, task_flops_per_pair(problem, args.front().group >= 0, pass), peak_tflops);
  for (const AttnArg& a : args) stage.add(kernel_arg(a, calc), a.q_buf, a.k_buf);
  return stage.seconds();
}

}  // namespace

// Per-rank state of one pass and of the collective being simulated, in flat
// arrays indexed by rank (x 2 link classes for the ports). Everything is
// resized, never shrunk, so a repeated call allocates nothing.
struct TimingWorkspace::Buffers {
  // One pass.
  std::vector<std::array<double, 2>> free;  // per rank, per stream: when it is free
  std::vector<double> cast_end;             // per rank x 2: end of cast(s) at [s & 1]
  std::vector<double> reduce_end;           // per rank: latest end of a reduce it took part in
  std::vector<double> merge;                // per rank: merge seconds owed at the pass end
  std::vector<double> merge_bytes;
  std::vector<double> flops;                // per rank: FLOPs of all its args (compute_seconds' order)
  std::vector<double> kernel;               // per rank: kernel seconds of all its args (kernel model)
  std::vector<double> fwd_seconds;          // per rank: forward compute seconds (estimate_step)
  std::vector<double> cast_waited;          // per rank: end of the casts its next compute waits for
  std::vector<std::int32_t> red_off;        // per rank x phase x (N + 2): offsets of reduce parts by point
  std::vector<std::int32_t> red_item;       // (s - 1) * 2 + kind, grouped by (rank, phase, reduce point)
  // One collective.
  std::vector<double> out_bytes, in_bytes;  // per rank x class
  std::vector<std::int64_t> out_msgs, in_msgs;
  std::vector<double> t_out, t_in;          // port times, per rank x class
  std::vector<double> ready, start;         // per rank (-1: moves nothing)
  std::vector<std::uint32_t> mark_out, mark_in;  // per rank: epoch of the last message counted to / from it
  std::uint32_t epoch = 0;
  std::int64_t parts_visited = 0;           // work done (TimingWorkspace::parts_visited)
};

TimingWorkspace::TimingWorkspace() : b_(std::make_unique<Buffers>()) {}
TimingWorkspace::~TimingWorkspace() = default;
std::int64_t TimingWorkspace::parts_visited() const { return b_->parts_visited; }
TimingWorkspace::TimingWorkspace(TimingWorkspace&&) noexcept = default;
TimingWorkspace& TimingWorkspace::operator=(TimingWorkspace&&) noexcept = default;

namespace {

constexpr int kIntra = 0, kInter = 1;

// Tensors (NCCL calls per peer) of one collective part, as cuda_nccl issues
// them (runtimes/cuda_nccl/host/layout.cpp): cast / reduce x pass x kind.
int tensors_of(Pass pass, RowKind kind, bool reduce) {
  if (!reduce) return kind == RowKind::kv ? 2 : (pass == Pass::fwd ? 1 : 4);  // K V | Q | Q O dO lse
  if (pass == Pass::fwd) return kind == RowKind::qo ? 2 : 0;                   // O lse | nothing
  return kind == RowKind::qo ? 1 : 2;                                          // dQ | dK dV
}

template <class T>
void fill(std::vector<T>& v, std::size_t n, T x) {
  v.assign(n, x);  // keeps capacity: no allocation once grown
}

// What PassSim reads of one pass: the ranks and stages, each rank's FLOPs
// per stage (in the order compute_seconds sums them), each rank's program,
// and each collective part's splits. Two sources: a plan, and a
// price sheet (plan/price_sheet.hpp), which holds the same figures.
class PlanView {
 public:
  PlanView(const Problem& problem, const Plan& plan, Pass pass) : problem_(problem), plan_(plan), pass_(pass) {
    const int N = stages();
    for (int r = 0; r < ranks(); ++r) {
      const PassPlan& p = pp(r);
      if (static_cast<int>(p.calc.remote_attn_args.size()) != N || static_cast<int>(p.comm.stages.size()) != N)
        throw Error(fmt::format("timing model: rank {} {} plan has {} remote arg lists and {} comm stages, the plan "
                                "declares {} stages",
                                r, to_string(pass), p.calc.remote_attn_args.size(), p.comm.stages.size(), N));
      if (p.program.empty()) continue;
      if (const std::string why = program_error(p.program, p.comm.stages, pass); !why.empty())
        throw Error(fmt::format("timing model: rank {} {} program: {}", r, to_string(pass), why));
    }
  }
  // The order rank r runs the pass in: its plan's program (the default one
  // where the plan carries none).
  const Program& program(int r) const {
    const PassPlan& p = pp(r);
    if (!p.program.empty()) return p.program;
    if (defaults_.empty()) defaults_.resize(static_cast<std::size_t>(ranks()));
    Program& d = defaults_[static_cast<std::size_t>(r)];
    if (d.empty()) d = pass_program(p.comm.stages, pass_);
    return d;
  }
  int ranks() const { return static_cast<int>(plan_.ranks.size()); }
  int stages() const { return plan_.num_stages; }
  bool has_forwarding() const {
    for (int r = 0; r < ranks(); ++r)
      for (const StageComm& sc : pp(r).comm.stages)
        if (sc.has_forwarding()) return true;
    return false;
  }
  // f(FLOPs) for each arg of rank r's stage s.
  template <class F>
  void for_each_flops(int r, int s, F&& f) const {
    const CalcMeta& c = pp(r).calc;
    for (const AttnArg& a : s == 0 ? c.local_attn_args : c.remote_attn_args[static_cast<std::size_t>(s - 1)])
      f(arg_flops(a, c, problem_, pass_));
  }
  // Kernel seconds of rank r's stage s (the profile's kernel model).
  double kernel_seconds(int r, int s, const KernelModel& km, double peak_tflops) const {
    const CalcMeta& c = pp(r).calc;
    return stage_kernel_seconds(s == 0 ? c.local_attn_args : c.remote_attn_args[static_cast<std::size_t>(s - 1)], c,
                                problem_, km, pass_, peak_tflops);
  }
  // Rank r's part (stage s, kind, fwd: the forwarding phase): sent(tokens,
  // dst) for each destination of each input split, then received(tokens,
  // src) for each output split, in the arg's order.
  template <class Sent, class Received>
  void for_each_split(int r, int s, RowKind kind, bool fwd, Sent&& sent, Received&& received) const {
    const StageComm& sc = pp(r).comm.stages[static_cast<std::size_t>(s - 1)];
    const GroupCollectiveArg& a = kind == RowKind::qo ? (fwd ? sc.qo_fwd : sc.qo) : (fwd ? sc.kv_fwd : sc.kv);
    const std::size_t ni = std::min(a.input_split_sizes.size(), a.dst_indices.size());
    for (std::size_t i = 0; i < ni; ++i)
      for (Rank d : a.dst_indices[i]) sent(a.input_split_sizes[i], d);
    const std::size_t no = std::min(a.output_split_sizes.size(), a.src_index.size());
    for (std::size_t j = 0; j < no; ++j) received(a.output_split_sizes[j], a.src_index[j]);
  }

 private:
  const PassPlan& pp(int r) const { return pass_plan(plan_.ranks[static_cast<std::size_t>(r)], pass_); }
  const Problem& problem_;
  const Plan& plan_;
  Pass pass_;
  mutable std::vector<Program> defaults_;
};

class SheetView {
 public:
  SheetView(const Problem& problem, const PriceSheet& sheet, Pass pass)
      : problem_(problem), sheet_(sheet), p_(pass == Pass::fwd ? sheet.fwd : sheet.bwd), pass_(pass) {
    const auto N = static_cast<std::size_t>(sheet.stages);
    const auto P = static_cast<std::size_t>(sheet.ranks);
    if (p_.area.size() != P * (N + 1) || p_.qo_reduce_after.size() != N || p_.kv_reduce_after.size() != N ||
        p_.send_begin.size() != sheet.parts() + 1 || p_.recv_begin.size() != sheet.parts() + 1 ||
        (sheet.kernel && p_.kernel.size() != p_.area.size()))
      throw Error(fmt::format("timing model: the {} price sheet's arrays do not match its {} ranks and {} stages",
                              to_string(pass), sheet.ranks, sheet.stages));
    program_ = pass_program(sheet.stages, p_.qo_reduce_after, p_.kv_reduce_after, pass);
  }
  // A sheet prices the default program (the same on every rank).
  const Program& program(int) const { return program_; }
  int ranks() const { return sheet_.ranks; }
  int stages() const { return sheet_.stages; }
  bool has_forwarding() const { return p_.has_forwarding; }
  template <class F>
  void for_each_flops(int r, int s, F&& f) const {
    const Token a = p_.area[static_cast<std::size_t>(r) * (static_cast<std::size_t>(sheet_.stages) + 1) +
                            static_cast<std::size_t>(s)];
    if (a != 0) f(area_flops(a, sheet_.flattened, problem_, pass_));
  }
  // (The sheet holds them, priced when it was made on the same profile: estimate_step checks.)
  double kernel_seconds(int r, int s, const KernelModel&, double) const {
    return p_.kernel[static_cast<std::size_t>(r) * (static_cast<std::size_t>(sheet_.stages) + 1) +
                     static_cast<std::size_t>(s)];
  }
  template <class Sent, class Received>
  void for_each_split(int r, int s, RowKind kind, bool fwd, Sent&& sent, Received&& received) const {
    const std::size_t i = sheet_.part(r, s, index_of(kind), fwd ? 1 : 0);
    for (auto k = p_.send_begin[i]; k < p_.send_begin[i + 1]; ++k)
      sent(p_.send[static_cast<std::size_t>(k)].tokens, p_.send[static_cast<std::size_t>(k)].peer);
    for (auto k = p_.recv_begin[i]; k < p_.recv_begin[i + 1]; ++k)
      received(p_.recv[static_cast<std::size_t>(k)].tokens, p_.recv[static_cast<std::size_t>(k)].peer);
  }

 private:
  const Problem& problem_;
  const PriceSheet& sheet_;
  const PriceSheet::Pass& p_;
  Pass pass_;
  Program program_;
};

template <class View>
class PassSim {
 public:
  PassSim(const Problem& problem, const View& view, const HardwareProfile& hw, Pass pass,
          TimingWorkspace::Buffers& w)
      : view_(view), hw_(hw), pass_(pass), w_(w),
        bpt_(pass == Pass::fwd ? fwd_bytes_per_token(problem) : bwd_bytes_per_token(problem)),
        P_(view.ranks()), N_(view.stages()),
        tflops_(pass == Pass::fwd ? hw.fwd_tflops : hw.bwd_tflops),
        hbm_(hw.hbm_gb_s > 0 ? 1.0 / (hw.hbm_gb_s * 1e9) : 0.0), km_(hw.kernel ? &*hw.kernel : nullptr) {
    has_fwd_ = view.has_forwarding();
    for (int c = 0; c < 2; ++c) {
      const Link& l = c == kIntra ? hw.intra_node : hw.inter_node;
      lat_[c] = l.latency_us * 1e-6;
      inv_bw_[c] = 1.0 / (l.bandwidth_gb_s * 1e9);
    }
  }

  // Compute seconds of rank r's args in this pass (after run()); equals compute_seconds().
  double compute_seconds_of(int r) const { return w_.flops[static_cast<std::size_t>(r)] / (tflops_ * 1e12); }
  // Its compute stream's seconds of args (after run()): the kernel model's,
  // else compute_seconds_of.
  double kernel_seconds_of(int r) const { return km_ ? w_.kernel[static_cast<std::size_t>(r)] : compute_seconds_of(r); }

  // Simulates the pass; fills `out` when given. Returns the makespan.
  double run(PassTimeline* out) {
    out_ = out;
    const auto P = static_cast<std::size_t>(P_);
    if (out_) {
      out_->pass = pass_;
      out_->ranks.assign(P, RankTimeline{});
    }
    fill(w_.free, P, std::array<double, 2>{0.0, 0.0});
    fill(w_.cast_end, 2 * P, 0.0);
    fill(w_.reduce_end, P, -1.0);
    fill(w_.merge, P, 0.0);
    fill(w_.merge_bytes, P, 0.0);
    fill(w_.flops, P, 0.0);
    fill(w_.kernel, P, 0.0);
    fill(w_.out_bytes, 2 * P, 0.0);
    fill(w_.in_bytes, 2 * P, 0.0);
    fill(w_.out_msgs, 2 * P, std::int64_t{0});
    fill(w_.in_msgs, 2 * P, std::int64_t{0});
    fill(w_.t_out, 2 * P, 0.0);
    fill(w_.t_in, 2 * P, 0.0);
    fill(w_.ready, P, -1.0);
    fill(w_.start, P, -1.0);
    if (w_.mark_out.size() < P) {
      w_.mark_out.assign(P, 0);
      w_.mark_in.assign(P, 0);
      w_.epoch = 0;
    }
    fill(w_.cast_waited, P, 0.0);
    bucket_reduces();
    if (P_ > 0) interpret(view_.program(0));
    double makespan = 0;
    for (std::size_t r = 0; r < P; ++r) {
      const auto& f = w_.free[r];
      const double end = std::max(f[0], f[1]);
      if (out_) out_->ranks[r].end = end;
      makespan = std::max(makespan, end);
    }
    return makespan;
  }

 private:
  int compute_stream() const { return 0; }
  int comm_stream() const { return hw_.overlap ? 1 : 0; }
  static std::size_t port(int r, int c) { return 2 * static_cast<std::size_t>(r) + static_cast<std::size_t>(c); }
  int link_class(int a, int b) const { return hw_.nodes().same_node(a, b) ? kIntra : kInter; }
  bool valid_peer(int r, Rank p) const { return p >= 0 && p < P_ && p != r; }

  // Runs the program: its casts, waits and computes as written; the reduces
  // that follow compute(s) (every rank's own, bucket_reduces) as one
  // collective per phase, forwarding first, once the run of them ends; the
  // pass-end merge. The skeleton (all but the reduces) is the same on every
  // rank: rank 0's drives the ranks in step.
  void interpret(const Program& prog) {
    int pending = 0;  // the point whose reduces are still to run (0: none)
    auto run_reduces = [&] {
      if (pending == 0) return;
      if (has_fwd_) run_comm(OpKind::reduce, pending, true);
      run_comm(OpKind::reduce, pending, false);
      pending = 0;
    };
    for (const Instr& i : prog) {
      if (i.op != Op::reduce) run_reduces();
      switch (i.op) {
        case Op::cast:
          if (i.phase == Phase::first || has_fwd_) run_comm(OpKind::cast, i.stage, i.phase == Phase::forwarding);
          break;
        case Op::wait_cast:
          for (int r = 0; r < P_; ++r)
            w_.cast_waited[static_cast<std::size_t>(r)] =
                w_.cast_end[2 * static_cast<std::size_t>(r) + static_cast<std::size_t>(i.stage & 1)];
          break;
        case Op::compute:
          run_compute(i.stage);
          pending = i.stage;
          break;
        case Op::reduce: break;          // in the collective of their point
        case Op::wait_reduces: break;    // the merge starts after every reduce's end
        case Op::merge: merge_returns(); break;
      }
    }
    run_reduces();
  }

  // Pass end: once every reduce is in, the returned partials are merged on
  // the compute stream.
  void merge_returns() {
    for (std::size_t r = 0; r < static_cast<std::size_t>(P_); ++r) {
      if (w_.merge[r] <= 0) continue;
      double& cs = w_.free[r][static_cast<std::size_t>(compute_stream())];
      const double start = std::max(cs, w_.reduce_end[r]);
      cs = start + w_.merge[r];
      if (out_) out_->ranks[r].compute.push_back({OpKind::merge, N_, start, cs, w_.merge_bytes[r], 0});
    }
  }

  std::size_t bucket(int r, Phase ph) const {
    return (2 * static_cast<std::size_t>(r) + static_cast<std::size_t>(ph)) * (static_cast<std::size_t>(N_) + 2);
  }

  // Groups each rank's reduce instructions by phase and by the stage computed
  // before them, its point (a counting sort, in program order within one):
  // a reduce collective then visits only its own parts, so the pass is
  // linear in the number of stages.
  void bucket_reduces() {
    const auto P = static_cast<std::size_t>(P_);
    const std::size_t B = static_cast<std::size_t>(N_) + 2;  // points 0..N, and the end
    const std::size_t per_rank = 4 * static_cast<std::size_t>(N_) + 4;
    fill(w_.red_off, P * 2 * B, std::int32_t{0});
    fill(w_.red_item, P * per_rank, std::int32_t{0});
    auto each_reduce = [&](int r, auto&& f) {
      int point = 0;
      for (const Instr& i : view_.program(r)) {
        if (i.op == Op::compute) point = i.stage;
        else if (i.op == Op::reduce) f(i, point);
      }
    };
    for (int r = 0; r < P_; ++r) {
      each_reduce(r, [&](const Instr& i, int point) { ++w_.red_off[bucket(r, i.phase) + static_cast<std::size_t>(point) + 1]; });
      // One item array per rank: the forwarding phase's buckets after the first's.
      std::int32_t* off = w_.red_off.data() + bucket(r, Phase::first);
      std::int32_t total = 0;
      for (std::size_t t = 0; t < 2 * B; ++t) {
        total += off[t];
        off[t] = total;
      }
      if (static_cast<std::size_t>(total) > per_rank)
        throw Error(fmt::format("timing model: rank {}'s program has {} reduces for {} stages", r, total, N_));
      std::int32_t* items = w_.red_item.data() + static_cast<std::size_t>(r) * per_rank;
      each_reduce(r, [&](const Instr& i, int point) {  // fills off[t] up to off[t + 1]; shifted back below
        items[off[static_cast<std::size_t>(i.phase) * B + static_cast<std::size_t>(point)]++] =
            (i.stage - 1) * 2 + static_cast<std::int32_t>(i.kind);
      });
      for (std::size_t t = 2 * B - 1; t > 0; --t) off[t] = off[t - 1];
      off[0] = 0;
    }
  }

  // Calls f(s, kind) for every part (stage s, kind) of collective `stage`
  // on rank r: a cast's two kinds of its stage, a reduce's bucket.
  template <class F>
  void for_each_part(int r, OpKind op, int stage, bool fwd, F&& f) const {
    if (op == OpKind::cast) {
      w_.parts_visited += 2;
      f(stage, RowKind::qo);
      f(stage, RowKind::kv);
      return;
    }
    const std::int32_t* off = w_.red_off.data() + bucket(r, fwd ? Phase::forwarding : Phase::first);
    const std::int32_t* items = w_.red_item.data() + static_cast<std::size_t>(r) * (4 * static_cast<std::size_t>(N_) + 4);
    w_.parts_visited += off[stage + 1] - off[stage];
    for (std::int32_t i = off[stage]; i < off[stage + 1]; ++i)
      f(items[i] / 2 + 1, items[i] % 2 == 0 ? RowKind::qo : RowKind::kv);
  }

  double token_bytes(RowKind k, bool back) const {
    if (k == RowKind::qo) return static_cast<double>(back ? bpt_.qo_back : bpt_.qo_out);
    return static_cast<double>(back ? bpt_.kv_back : bpt_.kv_out);
  }

  // Calls f(peer, bytes, sends) for every transfer of rank r in the collective
  // (one call per split and peer; bytes > 0). Cast: input splits go to their
  // dsts, output splits come from their srcs. Reduce (transposed): output
  // splits go back to their srcs, input splits come back from their dsts.
  // part_begin(kind) is called before each part with bytes.
  template <class Begin, class F>
  void for_each_transfer(int r, OpKind op, int stage, bool fwd, Begin&& part_begin, F&& f) const {
    const bool back = op == OpKind::reduce;
    for_each_part(r, op, stage, fwd, [&](int s, RowKind kind) {
      const double b = token_bytes(kind, back);
      if (b <= 0) return;
      part_begin(kind);
      view_.for_each_split(
          r, s, kind, fwd,
          [&](Token tokens, Rank d) {
            if (tokens > 0 && valid_peer(r, d)) f(d, static_cast<double>(tokens) * b, !back);
          },
          [&](Token tokens, Rank p) {
            if (tokens > 0 && valid_peer(r, p)) f(p, static_cast<double>(tokens) * b, back);
          });
    });
  }

  void run_compute(int s) {
    for (int r = 0; r < P_; ++r) {
      double flops = 0;
      double& total = w_.flops[static_cast<std::size_t>(r)];
      view_.for_each_flops(r, s, [&](double f) {
        flops += f;
        total += f;  // same order as compute_seconds: equal to it bit for bit
      });
      double seconds = 0;
      if (km_) {
        seconds = view_.kernel_seconds(r, s, *km_, tflops_);
        if (seconds <= 0) continue;
        w_.kernel[static_cast<std::size_t>(r)] += seconds;
      } else if (flops <= 0) {
        continue;
      }
      double& f = w_.free[static_cast<std::size_t>(r)][static_cast<std::size_t>(compute_stream())];
      const double start = std::max(f, s > 0 ? w_.cast_waited[static_cast<std::size_t>(r)] : 0.0);
      f = km_ ? start + seconds : start + flops / (tflops_ * 1e12);
      if (out_) out_->ranks[static_cast<std::size_t>(r)].compute.push_back({OpKind::compute, s, start, f, 0.0, 0});
    }
  }

  // One collective on every rank: port loads, readiness (after the pack),
  // start (rank and peers ready), transfer ends, unpack or merge. fwd: the
  // forwarding phase of relays (a collective of its own).
  void run_comm(OpKind op, int stage, bool fwd) {
    // 1. Port loads and readiness.
    for (int r = 0; r < P_; ++r) {
      count_ports(r, op, stage, fwd);
      set_ready(r, op, stage, fwd);
    }
    // 2. Start: the rank and every peer it exchanges data with are ready.
    for (int r = 0; r < P_; ++r) set_start(r, op, stage, fwd);
    // 3. Ends, and what follows them.
    for (int r = 0; r < P_; ++r) finish_comm(r, op, stage, fwd);
    // A rank that skips cast(s) has its data at once: compute(s) must not
    // wait for an older cast's end kept in the same slot (a rank skipping the
    // forwarding phase keeps its first phase's end).
    if (op != OpKind::reduce && !fwd)
      for (int r = 0; r < P_; ++r)
        if (w_.start[static_cast<std::size_t>(r)] < 0)
          w_.cast_end[2 * static_cast<std::size_t>(r) + static_cast<std::size_t>(stage & 1)] = 0.0;
  }

  // Rank r's port loads and times in the collective. Messages: one per (peer,
  // tensor) in each part, per direction.
  void count_ports(int r, OpKind op, int stage, bool fwd) {
    const bool reduce = op == OpKind::reduce;
    double* ob = &w_.out_bytes[port(r, 0)];
    double* ib = &w_.in_bytes[port(r, 0)];
    std::int64_t* om = &w_.out_msgs[port(r, 0)];
    std::int64_t* im = &w_.in_msgs[port(r, 0)];
    ob[0] = ob[1] = ib[0] = ib[1] = 0;
    om[0] = om[1] = im[0] = im[1] = 0;
    std::uint32_t e = 0;
    int tensors = 0;
    for_each_transfer(
        r, op, stage, fwd,
        [&](RowKind kind) {
          e = next_epoch();
          tensors = tensors_of(pass_, kind, reduce);
        },
        [&](Rank p, double bytes, bool sends) {
          const int c = link_class(r, p);
          (sends ? ob : ib)[c] += bytes;
          std::uint32_t& m = (sends ? w_.mark_out : w_.mark_in)[static_cast<std::size_t>(p)];
          if (m != e) {  // first split of this part with this peer in this direction
            m = e;
            (sends ? om : im)[c] += tensors;
          }
        });
    for (int c = 0; c < 2; ++c) {
      w_.t_out[port(r, c)] = om[c] > 0 ? lat_[c] + ob[c] * inv_bw_[c] : 0.0;
      w_.t_in[port(r, c)] = im[c] > 0 ? lat_[c] + ib[c] * inv_bw_[c] : 0.0;
    }
  }

  // When rank r is ready for the collective (after count_ports): its comm
  // stream (and for a reduce its compute stream) free, then its pack done;
  // -1 where it moves nothing.
  void set_ready(int r, OpKind op, int stage, bool fwd) {
    const double* ob = &w_.out_bytes[port(r, 0)];
    const std::int64_t* om = &w_.out_msgs[port(r, 0)];
    const std::int64_t* im = &w_.in_msgs[port(r, 0)];
    double& ready = w_.ready[static_cast<std::size_t>(r)];
    ready = -1.0;
    if (om[0] + om[1] + im[0] + im[1] == 0) return;
    const auto& f = w_.free[static_cast<std::size_t>(r)];
    double t = f[static_cast<std::size_t>(comm_stream())];
    if (op == OpKind::reduce) t = std::max(t, f[static_cast<std::size_t>(compute_stream())]);
    const double pack = kPackFactor * (ob[0] + ob[1]) * hbm_;
    if (out_ && pack > 0)
      out_->ranks[static_cast<std::size_t>(r)].comm.push_back(
          {OpKind::pack, stage, t, t + pack, ob[0] + ob[1], 0, fwd});
    ready = t + pack;
  }

  // Rank r starts once it and every peer it exchanges data with are ready.
  void set_start(int r, OpKind op, int stage, bool fwd) {
    const double ready = w_.ready[static_cast<std::size_t>(r)];
    double& start = w_.start[static_cast<std::size_t>(r)];
    start = ready;
    if (ready < 0) return;
    for_each_transfer(
        r, op, stage, fwd, [](RowKind) {},
        [&](Rank p, double, bool) { start = std::max(start, w_.ready[static_cast<std::size_t>(p)]); });
  }

  // Each transfer of rank r ends at max(start of both ends) + the slower of
  // its two ports; the rank's part ends with its last transfer.
  double last_transfer_end(int r, OpKind op, int stage, bool fwd, double start) const {
    double end = start;
    for_each_transfer(
        r, op, stage, fwd, [](RowKind) {},
        [&](Rank p, double, bool sends) {
          const int c = link_class(r, p);
          const double ps = w_.t_out[port(sends ? r : p, c)], pr = w_.t_in[port(sends ? p : r, c)];
          end = std::max(end, std::max(start, w_.start[static_cast<std::size_t>(p)]) + std::max(ps, pr));
        });
    return end;
  }

  // Rank r's end of the collective (when it started) and what it owes after:
  // a cast's unpack, a reduce's merge at the pass end, a relay's merge.
  void finish_comm(int r, OpKind op, int stage, bool fwd) {
    const bool reduce = op == OpKind::reduce;
    const auto R = static_cast<std::size_t>(r);
    const double start = w_.start[R];
    if (start < 0) return;
    double end = last_transfer_end(r, op, stage, fwd, start);
    const double sent = w_.out_bytes[port(r, 0)] + w_.out_bytes[port(r, 1)];
    const double recv = w_.in_bytes[port(r, 0)] + w_.in_bytes[port(r, 1)];
    if (reduce && fwd) {
      w_.reduce_end[R] = std::max(w_.reduce_end[R], end);
    } else if (reduce) {
      w_.reduce_end[R] = std::max(w_.reduce_end[R], end);
      w_.merge[R] += kMergeFactor * recv * hbm_;
      w_.merge_bytes[R] += recv;
    } else {
      end += kUnpackFactor * recv * hbm_;
      w_.cast_end[2 * R + static_cast<std::size_t>(stage & 1)] = end;
    }
    w_.free[R][static_cast<std::size_t>(comm_stream())] = end;
    if (reduce && fwd && recv > 0) relay_merge(R, stage, end, recv);
    if (out_) {
      const std::int64_t msgs = w_.out_msgs[port(r, 0)] + w_.out_msgs[port(r, 1)] + w_.in_msgs[port(r, 0)] +
                                w_.in_msgs[port(r, 1)];
      out_->ranks[R].comm.push_back({op, stage, start, end, sent + recv, msgs, fwd});
    }
  }

  // A relay merges the forwarded partials (`recv` bytes) into its rows before
  // they go on to the source: on its compute stream once they are in (`end`),
  // as cuda_nccl issues it; its part of the first phase's reduce waits.
  void relay_merge(std::size_t R, int stage, double end, double recv) {
    double& cs = w_.free[R][static_cast<std::size_t>(compute_stream())];
    const double m0 = std::max(cs, end);
    cs = m0 + kMergeFactor * recv * hbm_;
    if (out_) out_->ranks[R].compute.push_back({OpKind::merge, stage, m0, cs, recv, 0, true});
  }

  // A fresh tag for the marks of one part (every mark differs from it).
  std::uint32_t next_epoch() {
    if (++w_.epoch == 0) {  // wrapped: forget every mark
      std::fill(w_.mark_out.begin(), w_.mark_out.end(), 0u);
      std::fill(w_.mark_in.begin(), w_.mark_in.end(), 0u);
      w_.epoch = 1;
    }
    return w_.epoch;
  }

  const View& view_;
  const HardwareProfile& hw_;
  Pass pass_;
  TimingWorkspace::Buffers& w_;
  TransferBytes bpt_;
  int P_, N_;
  double tflops_;
  double hbm_;  // seconds per HBM byte (0: not charged)
  double lat_[2] = {0, 0}, inv_bw_[2] = {0, 0};
  const KernelModel* km_;  // the profile's kernel model, null: FLOPs / tflops_
  bool has_fwd_ = false;  // some rank has a forwarding phase in this pass (relays)
  PassTimeline* out_ = nullptr;
};

void check_shape(const Problem& problem, const Plan& plan) {
  if (plan.num_stages < 0) throw Error("timing model: plan has a negative stage count");
  if (static_cast<int>(plan.ranks.size()) != problem.cp_size())
    throw Error(fmt::format("timing model: plan has {} ranks, the problem {}", plan.ranks.size(), problem.cp_size()));
}

}  // namespace

PassTimeline simulate_pass(const Problem& problem, const Plan& plan, const HardwareProfile& hw, Pass pass,
                           TimingWorkspace& ws) {
  check_shape(problem, plan);
  PassTimeline out;
  const PlanView view(problem, plan, pass);
  PassSim<PlanView>(problem, view, hw, pass, ws.buffers()).run(&out);
  return out;
}

PassTimeline simulate_pass(const Problem& problem, const Plan& plan, const HardwareProfile& hw, Pass pass) {
  TimingWorkspace ws;
  return simulate_pass(problem, plan, hw, pass, ws);
}

Timeline simulate_timeline(const Problem& problem, const Plan& plan, const HardwareProfile& hw) {
  return {simulate_pass(problem, plan, hw, Pass::fwd), simulate_pass(problem, plan, hw, Pass::bwd)};
}

namespace {

// The args' exact area at the peak rate: the compute bound's seconds.
double area_seconds(const Problem& problem, const PassPlan& plan, const HardwareProfile& hw, Pass pass) {
  double flops = 0;
  for (const AttnArg& a : plan.calc.local_attn_args) flops += arg_flops(a, plan.calc, problem, pass);
  for (const auto& stage : plan.calc.remote_attn_args)
    for (const AttnArg& a : stage) flops += arg_flops(a, plan.calc, problem, pass);
  return flops / ((pass == Pass::fwd ? hw.fwd_tflops : hw.bwd_tflops) * 1e12);
}

}  // namespace

double compute_seconds(const Problem& problem, const PassPlan& plan, const HardwareProfile& hw, Pass pass) {
  if (!hw.kernel) return area_seconds(problem, plan, hw, pass);
  const double peak = pass == Pass::fwd ? hw.fwd_tflops : hw.bwd_tflops;
  double t = stage_kernel_seconds(plan.calc.local_attn_args, plan.calc, problem, *hw.kernel, pass, peak);
  for (const auto& stage : plan.calc.remote_attn_args)
    t += stage_kernel_seconds(stage, plan.calc, problem, *hw.kernel, pass, peak);
  return t;
}

std::vector<RankCompute> predicted_compute(const Problem& problem, const Plan& plan, const HardwareProfile& hw) {
  check_shape(problem, plan);
  std::vector<RankCompute> out(plan.ranks.size());
  for (std::size_t r = 0; r < plan.ranks.size(); ++r)
    out[r] = {compute_seconds(problem, plan.ranks[r].fwd, hw, Pass::fwd),
              compute_seconds(problem, plan.ranks[r].bwd, hw, Pass::bwd)};
  return out;
}

double compute_bound(const Problem& problem, const Plan& plan, const HardwareProfile& hw) {
  if (plan.ranks.empty()) return 0.0;
  double total = 0;
  for (const RankPlan& r : plan.ranks)
    total += area_seconds(problem, r.fwd, hw, Pass::fwd) + area_seconds(problem, r.bwd, hw, Pass::bwd);
  return total / static_cast<double>(plan.ranks.size());
}

// Both passes, and the bound from the FLOPs the runs sum anyway (in
// compute_bound's order: per rank fwd + bwd, ranks in order), saving a
// third walk over the args.
template <class View>
StepEstimate estimate_both(const Problem& problem, const View& fv, const View& bv, const HardwareProfile& hw,
                           TimingWorkspace& ws) {
  StepEstimate e;
  const int P = fv.ranks();
  std::vector<double>& fwd_seconds = ws.buffers().fwd_seconds;
  PassSim<View> fwd(problem, fv, hw, Pass::fwd, ws.buffers());
  e.fwd = fwd.run(nullptr);
  fwd_seconds.resize(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) fwd_seconds[static_cast<std::size_t>(r)] = fwd.compute_seconds_of(r);
  // (The backward run reuses the buffers: the forward kernel seconds first.)
  double kernel = 0;
  if (hw.kernel)
    for (int r = 0; r < P; ++r) kernel += fwd.kernel_seconds_of(r);
  PassSim<View> bwd(problem, bv, hw, Pass::bwd, ws.buffers());
  e.bwd = bwd.run(nullptr);
  double total = 0;
  for (int r = 0; r < P; ++r) total += fwd_seconds[static_cast<std::size_t>(r)] + bwd.compute_seconds_of(r);
  e.compute_bound = P > 0 ? total / static_cast<double>(P) : 0.0;
  e.compute_floor = e.compute_bound;
  if (hw.kernel && P > 0) {
    for (int r = 0; r < P; ++r) kernel += bwd.kernel_seconds_of(r);
    e.compute_floor = kernel / static_cast<double>(P);
  }
  return e;
}

StepEstimate estimate_step(const Problem& problem, const Plan& plan, const HardwareProfile& hw, TimingWorkspace& ws) {
  check_shape(problem, plan);
  return estimate_both(problem, PlanView(problem, plan, Pass::fwd), PlanView(problem, plan, Pass::bwd), hw, ws);
}

StepEstimate estimate_step(const Problem& problem, const Plan& plan, const HardwareProfile& hw) {
  thread_local TimingWorkspace ws;
  return estimate_step(problem, plan, hw, ws);
}

StepEstimate estimate_step(const Problem& problem, const PriceSheet& sheet, const HardwareProfile& hw,
                           TimingWorkspace& ws) {
  if (sheet.stages < 0 || sheet.ranks != problem.cp_size())
    throw Error(fmt::format("timing model: the price sheet has {} ranks and {} stages, the problem {} ranks",
                            sheet.ranks, sheet.stages, problem.cp_size()));
  if (hw.kernel && !sheet.kernel_for(hw))
    throw Error(fmt::format("timing model: the price sheet was not made for the kernel model of profile '{}' "
                            "(PlanOptions::hardware names the profile a sheet is priced on)",
                            hw.name));
  return estimate_both(problem, SheetView(problem, sheet, Pass::fwd), SheetView(problem, sheet, Pass::bwd), hw, ws);
}

StepEstimate estimate_step(const Problem& problem, const PriceSheet& sheet, const HardwareProfile& hw) {
  thread_local TimingWorkspace ws;
  return estimate_step(problem, sheet, hw, ws);
}

namespace {

class ModelTimer final : public StepTimer {
 public:
  StepEstimate step(const Problem& problem, const PriceSheet& sheet, const HardwareProfile& hw) const override {
    return estimate_step(problem, sheet, hw);
  }
};

}  // namespace

const StepTimer& timing_model_timer() {
  static const ModelTimer timer;
  return timer;
}

}  // namespace cpsched
