#include "virtual_ranks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "attention_kernel.hpp"
#include "index_kernel.hpp"
#include "cpsched/base/error.hpp"
#include "lse_merge.hpp"
#include "parallel.hpp"
#include "plan_access.hpp"

namespace cpsched::sim {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One virtual rank's memory. Local rows hold every head; remote rows hold the
// heads of one group (q_per_group / kv_per_group).
struct RankMem {
  std::vector<Token> global;                 // local row -> global token
  std::vector<float> q, k, v, d_o;           // inputs
  std::vector<float> o, lse, dq, dk, dv;     // outputs
  // Remote buffers of the current pass (all stages concatenated).
  Token qo_rows = 0, kv_rows = 0;
  std::vector<float> rq, ro, rdo, rlse, rdq, rk, rv, rdk, rdv;
  std::vector<char> qo_read, kv_read;        // rows some arg reads
  std::vector<std::string> faults;           // from the parallel compute phase
  Token rows() const { return static_cast<Token>(global.size()); }
};

class Cluster {
 public:
  Cluster(const Problem& problem, const Plan& plan, const GlobalInputs& in, int threads)
      : plan_(plan), h_(HeadLayout::of(problem)), P_(static_cast<int>(plan.ranks.size())),
        N_(plan.num_stages), threads_(resolve_threads(threads)) {
    if (P_ != problem.cp_size())
      throw Error(fmt::format("sim numeric: plan has {} ranks, the problem {}", P_, problem.cp_size()));
    if (plan.sharding.cp_size != P_)
      throw Error(fmt::format("sim numeric: plan sharding is for {} ranks, the plan has {}", plan.sharding.cp_size, P_));
    plan.sharding.validate(problem.seqlen());
    if (N_ < 0) throw Error("sim numeric: negative stage count");
    qw_ = static_cast<std::int64_t>(h_.hq) * h_.dim;
    ow_ = static_cast<std::int64_t>(h_.hq) * h_.dim_v;
    kw_ = static_cast<std::int64_t>(h_.hkv) * h_.dim;
    vw_ = h_.kv_shared ? 0 : static_cast<std::int64_t>(h_.hkv) * h_.dim_v;
    rqw_ = static_cast<std::int64_t>(h_.q_per_group) * h_.dim;
    row_ = static_cast<std::int64_t>(h_.q_per_group) * h_.dim_v;
    rkw_ = static_cast<std::int64_t>(h_.kv_per_group) * h_.dim;
    rvw_ = h_.kv_shared ? 0 : static_cast<std::int64_t>(h_.kv_per_group) * h_.dim_v;
    mem_.resize(static_cast<std::size_t>(P_));
    for (int r = 0; r < P_; ++r) {
      RankMem& m = mem_[static_cast<std::size_t>(r)];
      const RangeSet tokens = plan.sharding.rank_tokens(r);
      for (const Range& rg : tokens.ranges())
        for (Token t = rg.begin; t < rg.end; ++t) m.global.push_back(t);
      m.q = gather(in.q, m.global, qw_);
      m.d_o = gather(in.d_o, m.global, ow_);
      m.k = gather(in.k, m.global, kw_);
      m.v = gather(in.v, m.global, vw_);
      local_rows_.push_back(m.rows());
    }
  }

  VirtualRun run() {
    for (RankMem& m : mem_) {
      m.o.assign(m.d_o.size(), 0.0f);
      m.lse.assign(static_cast<std::size_t>(m.rows() * h_.hq), kNegInf);
    }
    run_pass(Pass::fwd);
    for (RankMem& m : mem_) {
      m.dq.assign(m.q.size(), 0.0f);
      m.dk.assign(m.k.size(), 0.0f);
      m.dv.assign(m.v.size(), 0.0f);
    }
    run_pass(Pass::bwd);
    VirtualRun out;
    out.outputs = gather_outputs();
    out.faults = std::move(faults_);
    out.args_run = args_run_;
    out.rows_moved = rows_moved_;
    out.ran[0] = std::move(ran_[0]);
    out.ran[1] = std::move(ran_[1]);
    return out;
  }

 private:
  static std::vector<float> gather(const std::vector<float>& g, const std::vector<Token>& rows, std::int64_t w) {
    std::vector<float> out(rows.size() * static_cast<std::size_t>(w));
    if (w == 0) return out;  // V of a shared latent
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::copy_n(g.begin() + rows[i] * w, w, out.begin() + static_cast<std::ptrdiff_t>(i) * w);
    return out;
  }

  GlobalOutputs gather_outputs() const {
    GlobalOutputs g;
    const std::size_t S = static_cast<std::size_t>(plan_.sharding.blocks.empty() ? 0 : plan_.sharding.blocks.back().end);
    g.o.assign(S * static_cast<std::size_t>(ow_), kNaN);
    g.dq.assign(S * static_cast<std::size_t>(qw_), kNaN);
    g.dk.assign(S * static_cast<std::size_t>(kw_), kNaN);
    g.dv.assign(S * static_cast<std::size_t>(vw_), kNaN);
    g.lse.assign(S * static_cast<std::size_t>(h_.hq), kNaN);
    for (const RankMem& m : mem_)
      for (std::size_t i = 0; i < m.global.size(); ++i) {
        const std::size_t t = static_cast<std::size_t>(m.global[i]);
        auto put = [&](const std::vector<float>& src, std::vector<float>& dst, std::int64_t w) {
          if (w == 0) return;
          std::copy_n(src.begin() + static_cast<std::ptrdiff_t>(i) * w, w, dst.begin() + static_cast<std::ptrdiff_t>(t) * w);
        };
        put(m.o, g.o, ow_);
        put(m.dq, g.dq, qw_);
        put(m.dk, g.dk, kw_);
        put(m.dv, g.dv, vw_);
        put(m.lse, g.lse, h_.hq);
      }
    return g;
  }

  // ---- pass structure --------------------------------------------------

  const PassPlan& pp(int r, Pass pass) const { return pass_plan(plan_.ranks[static_cast<std::size_t>(r)], pass); }

  bool shape_ok(Pass pass) {
    bool ok = true;
    for (int r = 0; r < P_; ++r) {
      const PassPlan& x = pp(r, pass);
      if (static_cast<int>(x.calc.remote_attn_args.size()) != N_ || static_cast<int>(x.comm.stages.size()) != N_) {
        faults_.add(fmt::format("{} plan of rank {}: {} remote arg lists and {} comm stages for {} stages",
                                to_string(pass), r, x.calc.remote_attn_args.size(), x.comm.stages.size(), N_));
        ok = false;
      }
    }
    return ok;
  }

  // Declared receive offsets must be the prefix sums of the stages' sizes.
  void check_offsets(Pass pass) {
    for (int r = 0; r < P_; ++r) {
      Token qo = 0, kv = 0;
      const auto& st = pp(r, pass).comm.stages;
      for (std::size_t s = 0; s < st.size(); ++s) {
        if (st[s].qo_recv_offset != qo || st[s].kv_recv_offset != kv)
          faults_.add(fmt::format("{} stage {} of rank {}: receive offsets (QO {}, KV {}) are not the sums of the "
                                  "earlier stages (QO {}, KV {})",
                                  to_string(pass), s + 1, r, st[s].qo_recv_offset, st[s].kv_recv_offset, qo, kv));
        qo += std::max<Token>(st[s].num_remote_qo_tokens, 0);
        kv += std::max<Token>(st[s].num_remote_kv_tokens, 0);
      }
    }
  }

  void alloc_remote(Pass pass) {
    for (int r = 0; r < P_; ++r) {
      RankMem& m = mem_[static_cast<std::size_t>(r)];
      m.qo_rows = m.kv_rows = 0;
      for (const StageComm& sc : pp(r, pass).comm.stages) {
        m.qo_rows = std::max(m.qo_rows, sc.qo_recv_offset + std::max<Token>(sc.num_remote_qo_tokens, 0));
        m.kv_rows = std::max(m.kv_rows, sc.kv_recv_offset + std::max<Token>(sc.num_remote_kv_tokens, 0));
      }
      const std::size_t nq = static_cast<std::size_t>(m.qo_rows), nk = static_cast<std::size_t>(m.kv_rows);
      const std::size_t qg = static_cast<std::size_t>(h_.q_per_group);
      m.rq.assign(nq * static_cast<std::size_t>(rqw_), kNaN);
      m.rk.assign(nk * static_cast<std::size_t>(rkw_), kNaN);
      m.rv.assign(nk * static_cast<std::size_t>(rvw_), kNaN);
      const std::size_t no = nq * static_cast<std::size_t>(row_);
      if (pass == Pass::fwd) {
        m.ro.assign(no, 0.0f);
        m.rlse.assign(nq * qg, kNegInf);
        m.rdo.clear();
        m.rdq.clear();
        m.rdk.clear();
        m.rdv.clear();
      } else {
        m.ro.assign(no, kNaN);
        m.rdo.assign(no, kNaN);
        m.rlse.assign(nq * qg, kNaN);
        m.rdq.assign(m.rq.size(), 0.0f);
        m.rdk.assign(m.rk.size(), 0.0f);
        m.rdv.assign(m.rv.size(), 0.0f);
      }
      m.qo_read.assign(nq, 0);
      m.kv_read.assign(nk, 0);
    }
  }

  void run_pass(Pass pass) {
    if (!shape_ok(pass)) return;
    check_offsets(pass);
    alloc_remote(pass);
    // routes[s - 1][kind], and those of the forwarding phase (relays)
    std::vector<std::array<std::vector<Route>, 2>> routes(static_cast<std::size_t>(N_)), fwd_routes(routes.size());
    for (int s = 1; s <= N_; ++s)
      for (RowKind k : {RowKind::qo, RowKind::kv}) {
        const auto si = static_cast<std::size_t>(s - 1), ki = static_cast<std::size_t>(k);
        routes[si][ki] = match_routes(plan_, pass, s, k, h_, local_rows_, faults_);
        fwd_routes[si][ki] = match_routes(plan_, pass, s, k, h_, local_rows_, faults_, true);
      }
    const std::vector<int> qo_after = reduce_points(pass, RowKind::qo, routes);
    const std::vector<int> kv_after = reduce_points(pass, RowKind::kv, routes);
    const std::optional<Program> prog = agreed_program(pass);
    if (!prog) return;
    // A cast's rows are there once it is waited for (both phases, in the
    // order issued); a reduce sends its partials as they are when issued.
    std::vector<Instr> in_flight;
    for (const Instr& i : *prog) {
      ran_[static_cast<int>(pass)].push_back(i);
      const auto si = static_cast<std::size_t>(i.stage - 1);
      const bool fwd = i.phase == Phase::forwarding;
      switch (i.op) {
        case Op::cast: in_flight.push_back(i); break;
        case Op::wait_cast:
          for (const Instr& c : in_flight) {
            if (c.stage != i.stage) continue;
            const bool cf = c.phase == Phase::forwarding;
            for (RowKind k : {RowKind::qo, RowKind::kv})
              cast(pass, c.stage, k, (cf ? fwd_routes : routes)[static_cast<std::size_t>(c.stage - 1)][static_cast<std::size_t>(k)], cf);
          }
          std::erase_if(in_flight, [&](const Instr& c) { return c.stage == i.stage; });
          break;
        case Op::compute: compute_stage(pass, i.stage); break;
        case Op::reduce:
          // (reduce_points reported a stage whose reduce point is wrong: it is not reduced.)
          if ((i.kind == RowKind::qo ? qo_after : kv_after)[si + 1] != 0)
            reduce(pass, i.stage, i.kind, (fwd ? fwd_routes : routes)[si][static_cast<std::size_t>(i.kind)], fwd);
          break;
        case Op::wait_reduces: break;  // each reduce merged as it was issued
        case Op::merge: break;
      }
    }
    report_unread(pass);
  }

  // The pass's program: the sim runs the ranks in step, so every rank's must
  // be the same and runnable (a fault otherwise, and the pass is not run).
  std::optional<Program> agreed_program(Pass pass) {
    auto of = [&](int r) { return pp(r, pass).program.empty() ? pass_program(pp(r, pass).comm.stages, pass) : pp(r, pass).program; };
    if (P_ == 0) return std::nullopt;
    const Program first = of(0);
    bool ok = true;
    for (int r = 0; r < P_; ++r) {
      const Program p = r == 0 ? first : of(r);
      if (const std::string why = program_error(p, pp(r, pass).comm.stages, pass); !why.empty()) {
        faults_.add(fmt::format("{} program of rank {}: {}", to_string(pass), r, why));
        ok = false;
      } else if (p != first) {
        faults_.add(fmt::format("{} program of rank {} differs from rank 0's (the ranks run one schedule)", to_string(pass), r));
        ok = false;
      }
    }
    if (!ok) return std::nullopt;
    return first;
  }

  // When each stage's outputs go back (index s = 1..N; 0: never). A value
  // that differs between ranks, or lies outside [s, N] while the stage moves
  // data, is a fault and that stage is not reduced.
  std::vector<int> reduce_points(Pass pass, RowKind kind, const std::vector<std::array<std::vector<Route>, 2>>& routes) {
    std::vector<int> at(static_cast<std::size_t>(N_ + 1), 0);
    const bool has_reduce = kind == RowKind::qo || pass == Pass::bwd;
    for (int s = 1; s <= N_; ++s) {
      std::set<int> values;
      for (int r = 0; r < P_; ++r) {
        const StageComm& sc = pp(r, pass).comm.stages[static_cast<std::size_t>(s - 1)];
        values.insert(kind == RowKind::qo ? sc.qo_reduce_after : sc.kv_reduce_after);
      }
      const std::string what = fmt::format("{} stage {} {}_reduce_after", to_string(pass), s,
                                           kind == RowKind::qo ? "qo" : "kv");
      if (values.size() > 1) {
        faults_.add(fmt::format("{} differs between ranks ({} values)", what, values.size()));
        continue;
      }
      const int v = values.empty() ? 0 : *values.begin();
      const bool moves = !routes[static_cast<std::size_t>(s - 1)][static_cast<std::size_t>(kind)].empty();
      if (!has_reduce || !moves) continue;
      if (v < s || v > N_) {
        faults_.add(fmt::format("{} is {} but the stage's outputs can only go back after stage {}..{}", what, v, s, N_));
        continue;
      }
      at[static_cast<std::size_t>(s)] = v;
    }
    return at;
  }

  // ---- communication ---------------------------------------------------

  Token seg_offset(int r, Pass pass, int s, RowKind k) const {
    const StageComm& sc = pp(r, pass).comm.stages[static_cast<std::size_t>(s - 1)];
    return k == RowKind::qo ? sc.qo_recv_offset : sc.kv_recv_offset;
  }

  // Calls f(src rank mem, src row, dst mem, dst remote row, group) for each
  // row of each route. First phase: the src row is local; forwarding phase:
  // it is a remote row of the src's (the relay's) stage-s receive, and the
  // dst rows follow the dst's first-phase rows of the stage.
  template <class F>
  void for_each_row(Pass pass, int s, RowKind k, const std::vector<Route>& routes, bool fwd, F&& f) {
    std::vector<std::vector<Token>> offsets(static_cast<std::size_t>(P_));  // per receiver, computed once
    auto arg_of = [&](int r) -> const GroupCollectiveArg& {
      const StageComm& sc = pp(r, pass).comm.stages[static_cast<std::size_t>(s - 1)];
      return fwd ? forwarding(sc, k) : collective(sc, k);
    };
    for (const Route& rt : routes) {
      const GroupCollectiveArg& a = arg_of(rt.src);
      std::vector<Token>& off = offsets[static_cast<std::size_t>(rt.dst)];
      if (off.empty()) off = output_offsets(arg_of(rt.dst));
      const Range in = a.input_ranges[static_cast<std::size_t>(rt.in)];
      const Token src0 = in.begin + (fwd ? seg_offset(rt.src, pass, s, k) : 0);
      const Token first =
          fwd ? first_phase_tokens(collective(pp(rt.dst, pass).comm.stages[static_cast<std::size_t>(s - 1)], k)) : 0;
      const Token dst0 = seg_offset(rt.dst, pass, s, k) + first + off[static_cast<std::size_t>(rt.out)];
      RankMem& ms = mem_[static_cast<std::size_t>(rt.src)];
      RankMem& md = mem_[static_cast<std::size_t>(rt.dst)];
      const Token limit = k == RowKind::qo ? md.qo_rows : md.kv_rows;
      const Token src_limit = fwd ? (k == RowKind::qo ? ms.qo_rows : ms.kv_rows) : ms.rows();
      if (dst0 < 0 || dst0 + in.size() > limit || src0 < 0 || src0 + in.size() > src_limit) {
        faults_.add(fmt::format("{} stage {} {}{} rank {} -> {}: output split {} lies outside the receive buffer",
                                to_string(pass), s, to_string(k), fwd ? " forwarding" : "", rt.src, rt.dst, rt.out));
        continue;
      }
      const int g = a.input_groups[static_cast<std::size_t>(rt.in)];
      for (Token i = 0; i < in.size(); ++i) f(ms, src0 + i, md, dst0 + i, g);
    }
  }

  void copy_row(const std::vector<float>& src, Token srow, std::int64_t sw, std::int64_t soff, std::vector<float>& dst,
                Token drow, std::int64_t dw) {
    if (dw == 0) return;  // V of a shared latent: it travels inside K's rows
    std::copy_n(src.begin() + srow * sw + soff, dw, dst.begin() + drow * dw);
  }

  void cast(Pass pass, int s, RowKind k, const std::vector<Route>& routes, bool fwd) {
    const std::int64_t D = h_.dim, DV = h_.dim_v;
    for_each_row(pass, s, k, routes, fwd, [&](RankMem& ms, Token sr, RankMem& md, Token dr, int g) {
      ++rows_moved_;
      if (fwd) {  // remote rows to remote rows: the group's heads only
        if (k == RowKind::kv) {
          copy_row(ms.rk, sr, rkw_, 0, md.rk, dr, rkw_);
          copy_row(ms.rv, sr, rvw_, 0, md.rv, dr, rvw_);
          return;
        }
        copy_row(ms.rq, sr, rqw_, 0, md.rq, dr, rqw_);
        if (pass == Pass::bwd) {
          copy_row(ms.ro, sr, row_, 0, md.ro, dr, row_);
          copy_row(ms.rdo, sr, row_, 0, md.rdo, dr, row_);
          copy_row(ms.rlse, sr, h_.q_per_group, 0, md.rlse, dr, h_.q_per_group);
        }
        return;
      }
      if (k == RowKind::kv) {
        copy_row(ms.k, sr, kw_, h_.kv_head0(g) * D, md.rk, dr, rkw_);
        copy_row(ms.v, sr, vw_, h_.kv_head0(g) * DV, md.rv, dr, rvw_);
        return;
      }
      copy_row(ms.q, sr, qw_, h_.q_head0(g) * D, md.rq, dr, rqw_);
      if (pass == Pass::bwd) {
        const std::int64_t off = h_.q_head0(g) * DV;
        copy_row(ms.o, sr, ow_, off, md.ro, dr, row_);
        copy_row(ms.d_o, sr, ow_, off, md.rdo, dr, row_);
        copy_row(ms.lse, sr, h_.hq, h_.q_head0(g), md.rlse, dr, h_.q_per_group);
      }
    });
  }

  // The transpose of the cast: the receiver's rows go back to the sender
  // (forwarding phase: into the relay's remote rows).
  void reduce(Pass pass, int s, RowKind k, const std::vector<Route>& routes, bool fwd) {
    const std::int64_t D = h_.dim, DV = h_.dim_v;
    for_each_row(pass, s, k, routes, fwd, [&](RankMem& host, Token hr, RankMem& comp, Token cr, int g) {
      const int qg = h_.q_per_group;
      if (fwd) {
        if (k == RowKind::qo && pass == Pass::fwd) {
          merge_rows(MView{host.ro.data() + hr * row_, row_}, MView{host.rlse.data() + hr * qg, qg},
                     CView{comp.ro.data() + cr * row_, row_}, CView{comp.rlse.data() + cr * qg, qg}, 1, qg, h_.dim_v);
        } else if (k == RowKind::qo) {
          add_rows(MView{host.rdq.data() + hr * rqw_, rqw_}, CView{comp.rdq.data() + cr * rqw_, rqw_}, 1, rqw_);
        } else {
          add_rows(MView{host.rdk.data() + hr * rkw_, rkw_}, CView{comp.rdk.data() + cr * rkw_, rkw_}, 1, rkw_);
          if (rvw_ > 0)
            add_rows(MView{host.rdv.data() + hr * rvw_, rvw_}, CView{comp.rdv.data() + cr * rvw_, rvw_}, 1, rvw_);
        }
        return;
      }
      if (k == RowKind::qo && pass == Pass::fwd) {
        const std::int64_t off = h_.q_head0(g) * DV;
        merge_rows(MView{host.o.data() + hr * ow_ + off, ow_}, MView{host.lse.data() + hr * h_.hq + h_.q_head0(g), h_.hq},
                   CView{comp.ro.data() + cr * row_, row_}, CView{comp.rlse.data() + cr * qg, qg}, 1, qg, h_.dim_v);
      } else if (k == RowKind::qo) {
        const std::int64_t off = static_cast<std::int64_t>(h_.q_head0(g)) * D;
        add_rows(MView{host.dq.data() + hr * qw_ + off, qw_}, CView{comp.rdq.data() + cr * rqw_, rqw_}, 1, rqw_);
      } else {
        add_rows(MView{host.dk.data() + hr * kw_ + h_.kv_head0(g) * D, kw_}, CView{comp.rdk.data() + cr * rkw_, rkw_}, 1,
                 rkw_);
        if (rvw_ > 0)
          add_rows(MView{host.dv.data() + hr * vw_ + h_.kv_head0(g) * DV, vw_}, CView{comp.rdv.data() + cr * rvw_, rvw_},
                   1, rvw_);
      }
    });
  }

  // ---- compute ---------------------------------------------------------

  void compute_stage(Pass pass, int s) {
    const bool by_rank = P_ >= threads_ && threads_ > 1;
    const int inner = by_rank ? 1 : threads_;
    parallel_for(P_, by_rank ? threads_ : 1, [&](std::int64_t r) {
      const CalcMeta& c = pp(static_cast<int>(r), pass).calc;
      const auto& args = s == 0 ? c.local_attn_args : c.remote_attn_args[static_cast<std::size_t>(s - 1)];
      RankMem& m = mem_[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < args.size(); ++i) run_arg(pass, s, static_cast<int>(r), i, args[i], c, m, inner);
    });
    for (int r = 0; r < P_; ++r) {
      RankMem& m = mem_[static_cast<std::size_t>(r)];
      for (std::string& f : m.faults) faults_.add(std::move(f));
      m.faults.clear();
      const CalcMeta& c = pp(r, pass).calc;
      args_run_ += static_cast<std::int64_t>(s == 0 ? c.local_attn_args.size()
                                                    : c.remote_attn_args[static_cast<std::size_t>(s - 1)].size());
    }
  }

  void run_arg(Pass pass, int s, int r, std::size_t idx, const AttnArg& a, const CalcMeta& calc, RankMem& m,
               int threads) {
    const std::string where = fmt::format("{} stage {} arg {} of rank {}", to_string(pass), s, idx, r);
    if (!h_.valid_group(a.group)) {
      m.faults.push_back(fmt::format("{}: invalid head group {}", where, a.group));
      return;
    }
    if (s == 0 && (a.q_buf != BufferId::local || a.k_buf != BufferId::local)) {
      m.faults.push_back(where + ": a stage-0 arg reads a remote buffer");
      return;
    }
    const bool qr = a.q_buf == BufferId::remote, kr = a.k_buf == BufferId::remote;
    const Token q_limit = qr ? m.qo_rows : m.rows(), k_limit = kr ? m.kv_rows : m.rows();
    if (a.q.begin < 0 || a.q.end > q_limit || a.q.end < a.q.begin || a.k.begin < 0 || a.k.end > k_limit ||
        a.k.end < a.k.begin) {
      m.faults.push_back(fmt::format("{}: q [{}, {}) of {} rows or k [{}, {}) of {} rows is outside its buffer", where,
                                     a.q.begin, a.q.end, q_limit, a.k.begin, a.k.end, k_limit));
      return;
    }
    const std::int32_t* keys = nullptr;  // index args: their rows of the pool
    if (a.is_index()) {
      const auto need = static_cast<std::size_t>(a.q.size()) * static_cast<std::size_t>(a.index_width);
      if (a.index_offset < 0 || static_cast<std::size_t>(a.index_offset) + need > calc.indices.size()) {
        m.faults.push_back(fmt::format("{}: index rows at {} ({} x {}) are outside the pool of {}", where,
                                       a.index_offset, a.q.size(), a.index_width, calc.indices.size()));
        return;
      }
      keys = calc.indices.data() + a.index_offset;
      for (std::size_t e = 0; e < need; ++e)
        if (keys[e] != -1 && !a.k.contains(keys[e])) {
          m.faults.push_back(fmt::format("{}: index entry {} = {} is outside the arg's k rows [{}, {})", where, e,
                                         keys[e], a.k.begin, a.k.end));
          return;
        }
    }
    if (qr) std::fill(m.qo_read.begin() + a.q.begin, m.qo_read.begin() + a.q.end, 1);
    if (kr && keys == nullptr) std::fill(m.kv_read.begin() + a.k.begin, m.kv_read.begin() + a.k.end, 1);
    if (kr && keys != nullptr)
      for (std::size_t e = 0; e < static_cast<std::size_t>(a.q.size() * a.index_width); ++e)
        if (keys[e] >= 0) m.kv_read[static_cast<std::size_t>(keys[e])] = 1;

    const KernelShape shape{h_.q_per_group, h_.kv_per_group, h_.dim, h_.dim_v, h_.kv_shared};
    const std::int64_t qoff = static_cast<std::int64_t>(h_.q_head0(a.group)) * h_.dim;
    const std::int64_t ooff = static_cast<std::int64_t>(h_.q_head0(a.group)) * h_.dim_v;
    const std::int64_t koff = static_cast<std::int64_t>(h_.kv_head0(a.group)) * h_.dim;
    const std::int64_t voff = static_cast<std::int64_t>(h_.kv_head0(a.group)) * h_.dim_v;
    const int l0 = h_.q_head0(a.group);
    // Views of the heads of the arg's group in the buffers it names.
    auto qv = [&](std::vector<float>& local, std::vector<float>& remote) {
      return qr ? MView{remote.data(), rqw_} : MView{local.data() + qoff, qw_};
    };
    auto ov = [&](std::vector<float>& local, std::vector<float>& remote) {  // O, dO: d_v per head
      return qr ? MView{remote.data(), row_} : MView{local.data() + ooff, ow_};
    };
    auto lv = [&](std::vector<float>& local, std::vector<float>& remote) {
      return qr ? MView{remote.data(), h_.q_per_group} : MView{local.data() + l0, h_.hq};
    };
    auto kv = [&](std::vector<float>& local, std::vector<float>& remote) {
      return kr ? MView{remote.data(), rkw_} : MView{local.data() + koff, kw_};
    };
    // V and dV; a shared latent reads K's rows and sums dV into dK.
    auto vv = [&](std::vector<float>& k_local, std::vector<float>& k_remote, std::vector<float>& local,
                  std::vector<float>& remote) {
      if (h_.kv_shared) return kv(k_local, k_remote);
      return kr ? MView{remote.data(), rvw_} : MView{local.data() + voff, vw_};
    };
    const Slice slice{a.q, a.k, a.type};
    const IndexRows rows{keys, a.index_width};
    if (pass == Pass::fwd) {
      const CView q = as_const(qv(m.q, m.rq)), k = as_const(kv(m.k, m.rk)), v = as_const(vv(m.k, m.rk, m.v, m.rv));
      const Partial part = keys != nullptr ? attention_forward_index(shape, q, k, v, a.q, rows, threads)
                                           : attention_forward(shape, q, k, v, slice, threads);
      merge_rows(ov(m.o, m.ro).from(a.q.begin), lv(m.lse, m.rlse).from(a.q.begin), part.o_view(), part.lse_view(),
                 part.rows, shape.q_heads, shape.dv());
      return;
    }
    const BackwardInputs in{as_const(qv(m.q, m.rq)), as_const(kv(m.k, m.rk)), as_const(vv(m.k, m.rk, m.v, m.rv)),
                            as_const(ov(m.o, m.ro)), as_const(ov(m.d_o, m.rdo)), as_const(lv(m.lse, m.rlse))};
    const BackwardOutputs out{qv(m.dq, m.rdq), kv(m.dk, m.rdk), vv(m.dk, m.rdk, m.dv, m.rdv)};
    if (keys != nullptr) attention_backward_index(shape, in, out, a.q, rows, threads);
    else attention_backward(shape, in, out, slice, threads);
  }

  // Rows received that no arg reads: data moved for nothing, a plan defect.
  void report_unread(Pass pass) {
    for (int r = 0; r < P_; ++r) {
      const RankMem& m = mem_[static_cast<std::size_t>(r)];
      const auto qo = std::count(m.qo_read.begin(), m.qo_read.end(), 0);
      const auto kv = std::count(m.kv_read.begin(), m.kv_read.end(), 0);
      if (qo + kv > 0)
        faults_.add(fmt::format("{}: rank {} receives {} QO rows and {} KV rows that no arg reads", to_string(pass), r,
                                qo, kv));
    }
  }

  const Plan& plan_;
  HeadLayout h_;
  int P_, N_, threads_;
  // Row widths, local and remote (r*): Q/dQ, O/dO, K/dK, V/dV (0: shared latent).
  std::int64_t qw_ = 0, ow_ = 0, kw_ = 0, vw_ = 0, rqw_ = 0, row_ = 0, rkw_ = 0, rvw_ = 0;
  std::vector<RankMem> mem_;
  std::vector<Token> local_rows_;
  Faults faults_;
  std::int64_t args_run_ = 0, rows_moved_ = 0;
  Program ran_[2];  // per pass: the instructions run
};

}  // namespace

VirtualRun run_virtual_ranks(const Problem& problem, const Plan& plan, const GlobalInputs& in, int threads) {
  return Cluster(problem, plan, in, threads).run();
}

}  // namespace cpsched::sim
