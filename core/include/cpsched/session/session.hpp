#pragma once
// The library facade for embedding cpsched in a training framework: the
// counterpart of the seed's Direct Solver API
//
//   solver = DynamicAttnSolver(algorithm, num_heads_q, num_heads_kv, head_dim, cp_group, ...)
//   solver.solve(q_ranges, k_ranges, attn_mask_type)
//   calc_meta = solver.make_calc_meta(); comm_meta = solver.make_comm_meta()
//   solver.output_solve_result(visualize=True, save_path=...)
//
// as
//
//   cpsched::SessionOptions o;
//   o.solver = "binary_greedy"; o.heads = {64, 8, 128, 2}; o.cp_size = 8; o.seqlen = 65536;
//   cpsched::Session s(o);                      // or cpsched::Session s(cpsched::load_config(file));
//   s.solve(q_ranges, k_ranges, types);         // per layer / per mask; repeated masks hit the cache
//   const cpsched::CalcMeta& calc = s.calc_meta(rank);
//   const cpsched::CommMeta& comm = s.comm_meta(rank);
//   s.write_svg("solver_output.svg");
//
// A Session loads its solver and cost model plugins once and keeps them; it
// is not thread safe (use one Session per thread; they may share a Registry).
#include <filesystem>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpsched/problem/assignment.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plugin/params.hpp"
#include "cpsched/plan/plan.hpp"
#include "cpsched/plan/cache.hpp"
#include "cpsched/plan/shape.hpp"
#include "cpsched/plan/uses.hpp"
#include "cpsched/io/plan_json.hpp"
#include "cpsched/io/plan_svg.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/plugin/registry.hpp"
#include "cpsched/problem/resources.hpp"
#include "cpsched/session/solve_path.hpp"

namespace cpsched {

struct SessionOptions {
  int cp_size = 8;                 // P
  Token seqlen = 0;                // S; 0: each mask's largest range end
  Heads heads;                     // hq, hkv, D (d_qk), dtype bytes; MLA's dim_v, kv_shared (docs/heads.md)
  GridOptions grid;                // flatten_head_groups, blocks_per_rank
  // problem.layout: fixed (the shards as they are: sequential, or
  // host_ranges when given) or planned (the solver may re-lay out the
  // tokens; the caller then dispatches its inputs as the plan's host_ranges
  // say). docs/design.md#vocabulary.
  Layout layout = Layout::fixed;
  std::vector<std::vector<Range>> host_ranges;  // per rank; empty: sequential
  std::string solver = "balanced_bytes";  // the default solver (docs/design.md, "Solvers"); "binary_greedy" is the seed's
  Params solver_params;            // given values; the plugin's defaults fill the rest
  std::string cost_model = "area";
  Params cost_params;
  // Remote stages (N, or auto: the solver chooses) and relays (off, on or
  // auto, on nodes of node_size ranks; 0: the cost model's hardware
  // profile's GPUs per node). From a Config: plan.stages and plan.relay, the
  // node size from its hardware profile.
  PlanShape plan;
  // plan.uses: attention calls that run each plan, or ahead (made ahead of
  // need); the default solver spends planning time by it. nullopt: by the
  // layout (fixed: 1, planned: ahead).
  std::optional<PlanUses> uses;
  // >= 0: this process is that rank of the CP group, and only its CalcMeta
  // and CommMeta are built (in time close to its share of the plan). Every
  // rank solves the same input to the same assignment (solvers are
  // deterministic), so no broadcast is needed. -1: all ranks' plans.
  Rank rank = -1;
  std::size_t cache_size = 64;     // plan cache entries; 0 disables the cache
  // solve_async: masks that may wait to be planned ahead; a caller that
  // would queue more waits for a slot.
  std::size_t ahead_queue = 4;
  // Plugin folders scanned besides the build's / installation's and CPSCHED_PLUGIN_PATH
  // (only when the Session makes its own Registry).
  std::vector<std::filesystem::path> plugin_paths;
  // The process's memory budget for the resource checks (resources.hpp;
  // bytes, 0: CPSCHED_MEMORY_BUDGET or MemAvailable). From a Config: its
  // `memory_budget:`. Setting it sets the process's budget (set_memory_budget).
  std::int64_t memory_budget = 0;
  bool validate = false;           // run validate_result on every new plan (a rank's plan against its peers)
};

class Session {
 public:
  // `registry`: plugins to use; null: a new Registry scanning the default
  // folder, CPSCHED_PLUGIN_PATH and `plugin_paths`. Throws cpsched::Error when
  // a plugin is missing, a parameter is unknown or of the wrong type, or an
  // option is out of range.
  explicit Session(SessionOptions options, std::shared_ptr<Registry> registry = nullptr);
  // From a loaded config: problem sizes, solver, cost model, plan options and
  // plugin paths; `solve_config_mask()` solves its mask.
  explicit Session(const Config& config, std::shared_ptr<Registry> registry = nullptr);
  // The same as rank `rank` of the CP group (SessionOptions::rank; -1: every
  // rank's plan): a config is the same on every rank, the rank is not.
  Session(const Config& config, Rank rank, std::shared_ptr<Registry> registry = nullptr);
  static SessionOptions options_from(const Config& config);
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  // Solves one mask given as the seed's three lists (global token ranges);
  // builds the plan and metrics, or takes them from the cache. Throws
  // cpsched::Error for an invalid mask (naming the slice).
  const SolveResult& solve(const std::vector<Range>& q_ranges, const std::vector<Range>& k_ranges,
                          const std::vector<MaskType>& types);
  const SolveResult& solve(const RangeMask& mask);
  // An index mask (index_mask.hpp: token top-k, block top-k, BSR). Its arrays
  // may borrow the caller's memory (IndexArray::view) for the call. Not
  // cached: an indexer's selection changes every step, and a key would hash
  // the whole index tensor. Throws cpsched::Error naming the array and the
  // first bad entry.
  const SolveResult& solve(const IndexMask& mask);
  // A problem made with this session's P, heads and grid options (e.g.
  // make_problem of its config): range masks go through the cache, index
  // masks do not.
  const SolveResult& solve(std::shared_ptr<const Problem> problem);
  // Token top-k indices [S, kv_heads, k] (row-major, -1 padded), borrowed.
  const SolveResult& solve_topk(std::span<const std::int32_t> indices, Token seqlen, int kv_heads, bool causal = true);
  // Per-rank ingestion of a token top-k mask (mask/index/summary.hpp), for
  // a session of one rank (SessionOptions::rank): each rank summarises its
  // own rows [rows, kv_heads, k] with summarize_topk (no collective), the
  // caller gathers the P summaries (one all-gather; a loop in one process)
  // and every rank passes them, in rank order, with its own rows. The plan
  // is this rank's part only, and every query stays on its host (owner's
  // placement, whatever the session's solver: a rank holds only its own
  // queries' indices, so it can build args for them alone). Not cached.
  // The rank's sorted rows and its index pool (tens of MiB for a DSA layer)
  // take their memory from earlier results' buffers once those are let go
  // (at most 4 idle, base/buffer_recycler.hpp): after the first few calls
  // nothing that large is allocated. Throws cpsched::Error naming the rank
  // and what differs.
  std::vector<IndexCell> summarize_topk(std::span<const std::int32_t> own_rows, Token seqlen, int kv_heads,
                                        bool causal = true) const;
  const SolveResult& solve_topk_summaries(const std::vector<std::vector<IndexCell>>& summaries,
                                          std::span<const std::int32_t> own_rows, Token seqlen, int kv_heads,
                                          bool causal = true);
  // The same without the rows on the host: the rank's row runs
  // (summarize_topk_runs, or the same counted where the rows live, e.g. on
  // a device) instead. The plan's index args have their shapes and the
  // executor writes their rows (CalcMeta::deferred_index_entries, with
  // CommMeta::remote_kv_rows to find the keys that arrived).
  TopkRowRuns summarize_topk_runs(std::span<const std::int32_t> own_rows, Token seqlen, int kv_heads,
                                  bool causal = true) const;
  const SolveResult& solve_topk_runs(const std::vector<std::vector<IndexCell>>& summaries, TopkRowRuns own_runs);
  // The config's mask, range or index kind, built with located errors
  // (make_problem): what `cpsched plan` and `cpsched run` solve. A Session
  // built from a Config; else an error.
  const SolveResult& solve_config_mask();

  // Plans a range mask ahead of need (step t + 1's mask while step t runs):
  // one background thread solves queued masks in order, and each result
  // lands in the plan cache before the future is ready, so solve() of the
  // same mask then is a cache hit (and one still in flight waits for it
  // instead of solving it again). Identical masks in flight share one solve;
  // a mask already cached is ready at once. At most `ahead_queue` masks
  // wait; a caller that would queue more waits for a slot. The solves of
  // one Session run one at a time (solve() waits for the one in progress).
  // Mask errors are thrown here; the solver's from the future. The last
  // result (calc_meta, ...) is unchanged. Destroying the Session finishes
  // the solve in progress and fails the waiting ones.
  std::shared_future<std::shared_ptr<const SolveResult>> solve_async(const RangeMask& mask);
  std::shared_future<std::shared_ptr<const SolveResult>> solve_async(const std::vector<Range>& q_ranges,
                                                                     const std::vector<Range>& k_ranges,
                                                                     const std::vector<MaskType>& types);

  // Results of the last solve (an error before the first).
  const CalcMeta& calc_meta(Rank rank, Pass pass = Pass::fwd) const;
  const CommMeta& comm_meta(Rank rank, Pass pass = Pass::fwd) const;
  const Metrics& metrics() const;
  const Plan& plan() const;
  const Assignment& assignment() const;
  const Problem& problem() const;
  const SolveResult& result() const;
  bool last_was_cached() const;
  double last_call_ms() const;  // wall time of the last solve call (look-up, or solve + plan)

  // The picture / JSON of the last solve.
  void write_svg(const std::filesystem::path& file, SvgOptions options = {}) const;
  std::string plan_json(int indent = -1) const;
  // What plan_json writes (for streaming it: write_plan_json); its pointers
  // refer to the last result.
  PlanExport plan_export() const;
  // validate_result on the last result (a rank's plan against its peers).
  std::vector<std::string> validate() const;

  const SessionOptions& options() const;
  const Params& solver_params() const;  // resolved
  const PlanCache& cache() const;
  Registry& registry() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpsched
