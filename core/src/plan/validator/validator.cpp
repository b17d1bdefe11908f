// Plan validator: entry point, CommMeta shape and send/receive agreement,
// metrics recomputed from the plan.
#include "cpsched/plan/validator.hpp"

#include "cpsched/plan/builder.hpp"

#include "cpsched/problem/metrics.hpp"
#include "plan/validator/internal.hpp"

namespace cpsched {

namespace validate_detail {

namespace {

bool group_ok(int g, const TaskGrid& grid) {
  return grid.flattened() ? g >= 0 && g < grid.num_groups() : g == -1;
}

// What a receiver should get from one sender's input split.
struct Expect {
  Rank src;
  Token size;
  int group;
  std::vector<Range> global;  // the split's tokens, in order
};

// Shape of one GroupCollectiveArg; false when its vectors are unusable.
bool check_shape(const GroupCollectiveArg& g, const TaskGrid& grid, Token local_size, Rank r, const char* where,
                 int k, Problems& pr) {
  const auto P = grid.cp_size();
  const std::size_t ni = g.input_split_sizes.size(), no = g.output_split_sizes.size();
  if (g.input_ranges.size() != ni || g.input_groups.size() != ni || g.dst_indices.size() != ni) {
    pr.add("{} {} rank {}: input vectors differ in length (sizes {}, ranges {}, groups {}, dst_indices {})",
           where, kind_name(k), r, ni, g.input_ranges.size(), g.input_groups.size(), g.dst_indices.size());
    return false;
  }
  if (g.src_index.size() != no || g.output_groups.size() != no) {
    pr.add("{} {} rank {}: output vectors differ in length (sizes {}, src_index {}, groups {})", where,
           kind_name(k), r, no, g.src_index.size(), g.output_groups.size());
    return false;
  }
  bool ok = true;
  for (std::size_t i = 0; i < ni; ++i) {
    const Range x = g.input_ranges[i];
    if (g.input_split_sizes[i] <= 0 || x.size() != g.input_split_sizes[i])
      pr.add("{} {} rank {}: input split {} has size {} but range [{}, {})", where, kind_name(k), r, i,
             g.input_split_sizes[i], x.begin, x.end), ok = false;
    if (x.begin < 0 || x.end > local_size)
      pr.add("{} {} rank {}: input split {} range [{}, {}) is outside the {} [0, {})", where, kind_name(k), r, i,
             x.begin, x.end, std::string_view(where).ends_with("forwarding") ? "stage's first-phase rows" : "local shard",
             local_size), ok = false;
    if (!group_ok(g.input_groups[i], grid))
      pr.add("{} {} rank {}: input split {} has head group {}, outside the grid's groups", where, kind_name(k),
             r, i, g.input_groups[i]), ok = false;
    const auto& d = g.dst_indices[i];
    if (d.empty()) pr.add("{} {} rank {}: input split {} has no destination", where, kind_name(k), r, i), ok = false;
    for (std::size_t j = 0; j < d.size(); ++j) {
      if (d[j] < 0 || d[j] >= P || d[j] == r)
        pr.add("{} {} rank {}: input split {} names destination {} (outside [0, {}) or the sender)", where,
               kind_name(k), r, i, d[j], P), ok = false;
      if (j > 0 && d[j] <= d[j - 1])
        pr.add("{} {} rank {}: input split {} destinations are not strictly ascending", where, kind_name(k), r,
               i), ok = false;
    }
  }
  for (std::size_t j = 0; j < no; ++j) {
    if (g.output_split_sizes[j] <= 0)
      pr.add("{} {} rank {}: output split {} has size {}", where, kind_name(k), r, j, g.output_split_sizes[j]);
    if (g.src_index[j] < 0 || g.src_index[j] >= P || g.src_index[j] == r)
      pr.add("{} {} rank {}: output split {} names source {} (outside [0, {}) or the receiver)", where,
             kind_name(k), r, j, g.src_index[j], P);
    if (j > 0 && g.src_index[j] < g.src_index[j - 1])
      pr.add("{} {} rank {}: output split {} from rank {} follows one from rank {} (must be ordered by source)",
             where, kind_name(k), r, j, g.src_index[j], g.src_index[j - 1]);
    if (!group_ok(g.output_groups[j], grid))
      pr.add("{} {} rank {}: output split {} has head group {}, outside the grid's groups", where, kind_name(k),
             r, j, g.output_groups[j]);
  }
  return ok;
}

// check_comm's state for one pass: every rank's buffer maps, and per stage
// and kind what the senders' input splits give each receiver.
class CommChecker {
 public:
  CommChecker(const TaskGrid& grid, const Plan& plan, bool fwd, Problems& pr)
      : grid_(grid),
        plan_(plan),
        fwd_(fwd),
        pr_(pr),
        P_(static_cast<std::size_t>(grid.cp_size())),
        N_(static_cast<std::size_t>(plan.num_stages)),
        maps_(P_),
        expect_(P_),
        stage_begin_(P_),
        got_(P_),
        usable_(P_) {
    const std::vector<RangeSet> shard = grid.sharding().all_rank_tokens();
    for (std::size_t r = 0; r < P_; ++r) {
      for (Range x : shard[r].ranges()) maps_[r].local.append(x, -1);
      for (int k = 0; k < 2; ++k) maps_[r].end[k].assign(N_ + 1, 0);
    }
  }

  std::size_t num_stages() const { return N_; }
  std::vector<RankMaps> take_maps() { return std::move(maps_); }

  // Stage s + 1, both kinds, each with its first phase and forwarding phase.
  void check_stage(std::size_t s) {
    const std::string where = fmt::format("{} stage {}", pass_name(fwd_), s + 1);
    const std::string where_fwd = where + " forwarding";
    for (int k = 0; k < 2; ++k) {
      // First phase: input splits index the local shard.
      expect_first_phase(s, k, where);
      receive_first_phase(s, k, where);
      // Forwarding phase (relays): input splits index the relay's rows of
      // this stage's first phase, and carry their data and head group on.
      expect_forwarding(s, k, where_fwd);
      receive_forwarding(s, k, where, where_fwd);
    }
  }

 private:
  const StageComm& stage_of(std::size_t r, std::size_t s) const {
    return pass_of(plan_.ranks[r], fwd_).comm.stages[s];
  }

  // Hands `e` (rank r's split i of `g`) to each valid destination.
  void send_expect(std::size_t r, const GroupCollectiveArg& g, std::size_t i, const Expect& e) {
    for (Rank d : g.dst_indices[i])
      if (d >= 0 && static_cast<std::size_t>(d) < P_ && static_cast<std::size_t>(d) != r)
        expect_[static_cast<std::size_t>(d)].push_back(e);
  }

  void expect_first_phase(std::size_t s, int k, const std::string& where) {
    for (auto& e : expect_) e.clear();
    for (std::size_t r = 0; r < P_; ++r) {
      const GroupCollectiveArg& g = arg_of(stage_of(r, s), k);
      usable_[r] = check_shape(g, grid_, maps_[r].local.size(), static_cast<Rank>(r), where.c_str(), k, pr_);
      if (!usable_[r]) continue;
      for (std::size_t i = 0; i < g.input_ranges.size(); ++i) {
        Expect e{static_cast<Rank>(r), g.input_split_sizes[i], g.input_groups[i], {}};
        const Range x = g.input_ranges[i];
        if (x.begin < 0 || x.end > maps_[r].local.size() || x.empty()) continue;
        maps_[r].local.walk(x, [&](Range b, Token gb, int) { e.global.push_back({gb, gb + b.size()}); });
        send_expect(r, g, i, e);
      }
    }
  }

  void receive_first_phase(std::size_t s, int k, const std::string& where) {
    for (std::size_t r = 0; r < P_; ++r) {
      const StageComm& sc = stage_of(r, s);
      const Token off = k == 0 ? sc.qo_recv_offset : sc.kv_recv_offset;
      if (off != maps_[r].remote[k].size())
        pr_.add("{} {} rank {}: receive offset is {} but stages before it receive {} tokens", where, kind_name(k),
                r, off, maps_[r].remote[k].size());
      stage_begin_[r] = maps_[r].remote[k].size();
      got_[r] = 0;
      receive(r, arg_of(sc, k), where.c_str(), k);
    }
  }

  void expect_forwarding(std::size_t s, int k, const std::string& where_fwd) {
    for (auto& e : expect_) e.clear();
    for (std::size_t r = 0; r < P_; ++r) {
      const GroupCollectiveArg& g = forwarding(stage_of(r, s), k == 0 ? RowKind::qo : RowKind::kv);
      const Token first = maps_[r].remote[k].size() - stage_begin_[r];
      usable_[r] = check_shape(g, grid_, first, static_cast<Rank>(r), where_fwd.c_str(), k, pr_);
      if (!usable_[r]) continue;
      for (std::size_t i = 0; i < g.input_ranges.size(); ++i) {
        Expect e{static_cast<Rank>(r), g.input_split_sizes[i], g.input_groups[i], {}};
        const Range x = g.input_ranges[i];
        if (x.begin < 0 || x.end > first || x.empty()) continue;
        bool same_group = true;
        maps_[r].remote[k].walk({stage_begin_[r] + x.begin, stage_begin_[r] + x.end}, [&](Range b, Token gb, int grp) {
          e.global.push_back({gb, gb + b.size()});
          same_group = same_group && grp == g.input_groups[i];
        });
        if (!same_group)
          pr_.add("{} {} rank {}: forwarding input split {} (group {}) covers received rows of another head group",
                  where_fwd, kind_name(k), r, i, g.input_groups[i]);
        send_expect(r, g, i, e);
      }
    }
  }

  void receive_forwarding(std::size_t s, int k, const std::string& where, const std::string& where_fwd) {
    for (std::size_t r = 0; r < P_; ++r) {
      const StageComm& sc = stage_of(r, s);
      receive(r, forwarding(sc, k == 0 ? RowKind::qo : RowKind::kv), where_fwd.c_str(), k);
      const Token declared = k == 0 ? sc.num_remote_qo_tokens : sc.num_remote_kv_tokens;
      if (declared != got_[r])
        pr_.add("{} {} rank {}: num_remote_{}_tokens is {} but {} tokens are sent to it", where, kind_name(k), r,
                k == 0 ? "qo" : "kv", declared, got_[r]);
      maps_[r].end[k][s + 1] = maps_[r].remote[k].size();
    }
  }

  // Output splits of rank r's `g` against what the senders' input splits
  // naming r give (expect_[r]); appends the rows to r's remote map.
  void receive(std::size_t r, const GroupCollectiveArg& g, const char* where, int k) {
    const std::vector<Expect>& ex = expect_[r];
    for (const Expect& e : ex) got_[r] += e.size;
    if (usable_[r]) check_received(r, g, where, k);
    // The receive buffer holds what the senders send, in the documented order.
    for (const Expect& e : ex)
      for (Range x : e.global) maps_[r].remote[k].append(x, e.group);
  }

  // Reports the first output split of `g` that differs from expect_[r].
  void check_received(std::size_t r, const GroupCollectiveArg& g, const char* where, int k) {
    const std::vector<Expect>& ex = expect_[r];
    const std::size_t n = std::min(ex.size(), g.output_split_sizes.size());
    std::size_t j = 0;
    while (j < n && ex[j].src == g.src_index[j] && ex[j].size == g.output_split_sizes[j] &&
           ex[j].group == g.output_groups[j])
      ++j;
    if (j >= g.output_split_sizes.size() && j >= ex.size()) return;
    const std::string want = j < ex.size() ? fmt::format("src {}, {} tokens, group {}", ex[j].src,
                                                         ex[j].size, ex[j].group)
                                           : std::string("nothing");
    const std::string have = j < g.output_split_sizes.size()
                                 ? fmt::format("src {}, {} tokens, group {}", g.src_index[j],
                                               g.output_split_sizes[j], g.output_groups[j])
                                 : std::string("nothing");
    pr_.add("{} {} rank {}: output split {} is ({}) but the senders' input splits naming rank {} give ({}) "
            "({} output splits declared, {} sent)",
            where, kind_name(k), r, j, have, r, want, g.output_split_sizes.size(), ex.size());
  }

  const TaskGrid& grid_;
  const Plan& plan_;
  const bool fwd_;
  Problems& pr_;
  const std::size_t P_, N_;
  std::vector<RankMaps> maps_;
  std::vector<std::vector<Expect>> expect_;
  std::vector<Token> stage_begin_, got_;
  std::vector<bool> usable_;
};

}  // namespace

std::vector<RankMaps> check_comm(const Assignment& a, const Plan& plan, bool fwd, Problems& pr) {
  CommChecker c(*a.grid, plan, fwd, pr);
  for (std::size_t s = 0; s < c.num_stages(); ++s) c.check_stage(s);
  return c.take_maps();
}

}  // namespace validate_detail

namespace {

using namespace validate_detail;

// only >= 0: the loads are that rank's alone (its CalcMeta is the only one checked).
void check_pass_metrics(const Assignment& a, const Plan& plan, bool fwd, const Loads& loads, const Metrics& m,
                        Problems& pr, Rank only) {
  const Problem& p = a.grid->problem();
  const TransferBytes tb = fwd ? fwd_bytes_per_token(p) : bwd_bytes_per_token(p);
  const auto P = static_cast<std::size_t>(a.grid->cp_size());
  std::vector<Bytes> send(P, 0), recv(P, 0);
  Token remote[2] = {0, 0};
  // Relays move the same rows over other links: total bytes and received
  // tokens stay the metrics', per-rank send / receive do not.
  bool relays = false;
  for (std::size_t r = 0; r < P; ++r)
    for (const StageComm& sc : pass_of(plan.ranks[r], fwd).comm.stages)
      for (int k = 0; k < 4; ++k) {
        const GroupCollectiveArg& g = k < 2 ? arg_of(sc, k) : forwarding(sc, k == 2 ? RowKind::qo : RowKind::kv);
        relays = relays || (k >= 2 && !g.input_split_sizes.empty());
        const Bytes out = k % 2 == 0 ? tb.qo_out : tb.kv_out, back = k % 2 == 0 ? tb.qo_back : tb.kv_back;
        for (std::size_t i = 0; i < g.input_split_sizes.size() && i < g.dst_indices.size(); ++i) {
          const auto n = static_cast<Bytes>(g.dst_indices[i].size());
          send[r] += g.input_split_sizes[i] * n * out;
          recv[r] += g.input_split_sizes[i] * n * back;
        }
        for (std::size_t j = 0; j < g.output_split_sizes.size(); ++j) {
          recv[r] += g.output_split_sizes[j] * out;
          send[r] += g.output_split_sizes[j] * back;
          remote[k % 2] += g.output_split_sizes[j];
        }
      }
  const PassMetrics& pm = fwd ? m.fwd : m.bwd;
  Bytes total = 0, bottleneck = 0;
  for (std::size_t r = 0; r < P; ++r) {
    total += send[r];
    bottleneck = std::max({bottleneck, send[r], recv[r]});
    if (!relays && (send[r] != pm.send[r] || recv[r] != pm.recv[r]))
      pr.add("{} metrics rank {}: the CommMeta sends {} and receives {} bytes, the metrics say {} and {}",
             pass_name(fwd), r, send[r], recv[r], pm.send[r], pm.recv[r]);
    if ((only < 0 || static_cast<Rank>(r) == only) && (loads.load[r] != m.load[r] || loads.local[r] != m.stage0_load[r]))
      pr.add("{} metrics rank {}: the CalcMeta computes load {} (local: {}), the metrics say {} (local: {})",
             pass_name(fwd), r, loads.load[r], loads.local[r], m.load[r], m.stage0_load[r]);
  }
  if (total != pm.total_send || (!relays && bottleneck != pm.bottleneck))
    pr.add("{} metrics: the CommMeta gives total send {} and bottleneck {}, the metrics say {} and {}",
           pass_name(fwd), total, bottleneck, pm.total_send, pm.bottleneck);
  if (remote[0] != m.remote_qo_tokens || remote[1] != m.remote_kv_tokens)
    pr.add("{} metrics: the CommMeta receives {} QO and {} KV tokens, the metrics say {} and {}", pass_name(fwd),
           remote[0], remote[1], m.remote_qo_tokens, m.remote_kv_tokens);
}

// Top-level shape; false when the plan cannot be walked at all. only >= 0:
// the other ranks' CalcMeta is not the plan's to check (a rank's plan among
// its peers).
bool check_top(const Assignment& a, const Plan& plan, Problems& pr, Rank only) {
  const TaskGrid& grid = *a.grid;
  const auto P = static_cast<std::size_t>(grid.cp_size());
  bool ok = true;
  if (plan.num_stages < 1) pr.add("plan: num_stages is {}, must be at least 1", plan.num_stages), ok = false;
  if (plan.ranks.size() != P)
    pr.add("plan: {} rank plans for {} ranks", plan.ranks.size(), P), ok = false;
  if (plan.sharding.blocks != grid.sharding().blocks || plan.sharding.host != grid.sharding().host ||
      plan.sharding.cp_size != grid.sharding().cp_size)
    pr.add("plan: its sharding differs from the assignment grid's sharding"), ok = false;
  if (!ok) return false;
  const auto N = static_cast<std::size_t>(plan.num_stages);
  for (std::size_t r = 0; r < P; ++r)
    for (bool fwd : {true, false}) {
      const PassPlan& pp = pass_of(plan.ranks[r], fwd);
      const bool calc = only < 0 || static_cast<Rank>(r) == only;
      if ((calc && pp.calc.remote_attn_args.size() != N) || pp.comm.stages.size() != N) {
        pr.add("{} rank {}: {} remote arg lists and {} comm stages for {} stages", pass_name(fwd), r,
               pp.calc.remote_attn_args.size(), pp.comm.stages.size(), N), ok = false;
        continue;
      }
      if (plan.local_tail) {
        const StageComm& tail = pp.comm.stages.back();
        if (N < 2 || tail.num_remote_qo_tokens != 0 || tail.num_remote_kv_tokens != 0 ||
            !tail.qo.input_split_sizes.empty() || !tail.kv.input_split_sizes.empty() || tail.has_forwarding())
          pr.add("{} rank {}: the local tail (stage {}) moves rows; it must receive and send nothing", pass_name(fwd),
                 r, N);
      }
    }
  return ok;
}

}  // namespace

namespace validate_detail {

std::vector<std::string> validate_whole(const Assignment& a, const Plan& plan, const ValidateOptions& opt, Rank only) {
  std::vector<std::string> out;
  Problems pr(out, opt.max_problems);
  try {
    a.validate();
  } catch (const std::exception& e) {
    pr.add("{}", e.what());
    pr.finish();
    return out;
  }
  if (!check_top(a, plan, pr, only)) {
    pr.finish();
    return out;
  }
  const Metrics m = opt.check_metrics ? compute_metrics(a) : Metrics{};
  for (bool fwd : {true, false}) {
    const std::vector<RankMaps> maps = check_comm(a, plan, fwd, pr);
    const Loads loads = check_calc(a, plan, fwd, maps, pr, opt.index_chunk_pairs, only);
    if (opt.check_metrics) check_pass_metrics(a, plan, fwd, loads, m, pr, only);
  }
  pr.finish();
  return out;
}

}  // namespace validate_detail

std::vector<std::string> validate_plan(const Assignment& a, const Plan& plan, const ValidateOptions& opt) {
  if (plan.only_rank >= 0)
    return {fmt::format("plan: it is rank {}'s plan (Plan::only_rank; the other ranks' entries were not built), not a "
                        "whole plan: validate it with validate_rank_plan against its peers (validate_result does)",
                        plan.only_rank)};
  return validate_whole(a, plan, opt, -1);
}

}  // namespace cpsched
