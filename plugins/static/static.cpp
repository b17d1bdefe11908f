// Solver plugin `static`: MagiAttention's pre-iteration dispatch (docs/design.md#solvers).
// Tokens are re-dispatched in chunks balanced by area, then every task runs
// on the rank hosting its q block: only KV moves. The assignment's grid is
// built over the dispatched sharding, so the metrics and the plan see the
// token permutation.
#include <memory>
#include <numeric>
#include <string>

#include <cpsched/base/error.hpp>
#include <cpsched/plugin/plugin.hpp>
#include <cpsched/plugin/solver.hpp>
#include <cpsched/hardware/profile.hpp>

#include <fmt/format.h>

#include "dispatch.hpp"

namespace {

using namespace cpsched;

// tile_cuts=auto takes the published deal cut after only where its busiest
// rank touches this share fewer tiles than the deal cut at tiles.
constexpr double kAutoMargin = 0.02;

// The tokens a cut must be a multiple of for the kernels' tiles (all tile
// sides of both passes), or 0 without a kernel model.
Token kernel_tile(const SolveInput& in) {
  if (!in.time_prices() || !in.time_prices()->kernel || !in.time_prices()->kernel->kernel) return 0;
  const KernelModel& km = *in.time_prices()->kernel->kernel;
  Token tile = 1;
  for (const int t : {km.fwd.tile_q, km.fwd.tile_k, km.bwd.tile_q, km.bwd.tile_k})
    if (t > 0) tile = std::lcm(tile, Token{t});
  return tile;
}

class Static final : public Solver {
 public:
  explicit Static(const Params& p)
      : chunk_tokens_(p.get_int("chunk_tokens")),
        chunks_per_rank_(p.get_int("chunks_per_rank")),
        node_ranks_(p.get_int("node_ranks")),
        node_chunks_(p.get_int("node_chunks")),
        tile_tokens_(p.get_int("tile_tokens")),
        tile_cuts_(p.get_string("tile_cuts")) {
    if (tile_cuts_ != "before" && tile_cuts_ != "after" && tile_cuts_ != "auto")
      throw Error("static: tile_cuts = '" + tile_cuts_ + "' must be 'before', 'after' or 'auto' (the deal)");
    if (chunks_per_rank_ < 1 || chunks_per_rank_ > 4096)
      throw Error("static: chunks_per_rank = " + std::to_string(chunks_per_rank_) + " must be in [1, 4096]");
    if (node_chunks_ < 1 || node_chunks_ > 1024)
      throw Error("static: node_chunks = " + std::to_string(node_chunks_) + " must be in [1, 1024]");
    if (node_ranks_ < -1)
      throw Error("static: node_ranks = " + std::to_string(node_ranks_) +
                  " must be -1 (the cost model's GPUs per node), 0 (one level, as published) or a rank count");
    if (tile_tokens_ < 0 || tile_tokens_ > (1 << 20))
      throw Error("static: tile_tokens = " + std::to_string(tile_tokens_) +
                  " must be in [0, 1048576] (0: the cost model's kernel tiles, none without a kernel model)");
    if (chunk_tokens_ < 0)
      throw Error("static: chunk_tokens = " + std::to_string(chunk_tokens_) + " must be >= 0 (0: S / (8 P))");
  }

  Solution solve(const SolveInput& in) override {
    if (!in.grid()) throw Error("static: no task grid given");
    const TaskGrid& grid = *in.grid();
    const Problem& p = grid.problem();
    const int P = grid.cp_size();
    const Token S = p.seqlen();
    if (S <= 0) throw Error("static: the sequence is empty");
    if (p.layout == Layout::fixed)
      throw Error("static: re-lays out the tokens before the step, which problem.layout: fixed rules out (the tokens "
                  "stay where the caller holds them); use problem.layout: planned and lay the inputs out as the "
                  "plan's host_ranges say, or another solver");
    const Token chunk = chunk_tokens_ > 0 ? chunk_tokens_ : std::max<Token>(1, S / (Token{chunks_per_rank_} * P));
    const Token n = (S + chunk - 1) / chunk;
    if (n < P)
      throw Error("static: " + std::to_string(n) + " chunks of " + std::to_string(chunk) + " tokens for " +
                  std::to_string(P) + " ranks; every rank needs at least one chunk (lower chunk_tokens)");

    // Under a kernel model (the cost model's profile has one) the cuts inside
    // a document move to tile multiples from its start: cut there, its
    // pieces touch no more tiles than it does (static's 1024-token chunks
    // had made tiles cost its plans up to 13 % on short documents,
    // docs/bounds.md). Without one, the chunks as published. tile_tokens
    // sets the tile where the cost model does not show it (balanced_bytes
    // used a few times decides on the profile without its kernel model).
    // tile_cuts=after keeps the published deal and moves its cuts
    // (tile_cuts_after_deal): balanced_bytes made ahead prices both ways;
    // auto takes one of the two by their busiest ranks' tiles (used a few
    // times, on one node, balanced_bytes' members).
    const Token tile = tile_tokens_ > 0 ? Token{tile_tokens_} : kernel_tile(in);
    const bool aligned = tile > 1 && !p.index_mask && p.head_masks.empty();
    // Two levels when asked for and the cluster has several nodes.
    int node = static_cast<int>(node_ranks_);
    if (node < 0) {
      node = in.time_prices() ? in.time_prices()->nodes.gpus_per_node : 0;
    }
    const bool two_level = node > 0 && P > node && P % node == 0;
    // Node chunks of S / (node_chunks x nodes) tokens.
    const Token node_chunk =
        two_level ? std::max<Token>(chunk, (S / (Token{node_chunks_} * (P / node))) / chunk * chunk) : 0;
    // The deal of the chunks cut at tiles (before) or as published, its cuts
    // then moved to tiles where aligned (after).
    struct Deal {
      std::vector<Range> chunks;
      std::vector<Rank> host;
    };
    const auto deal = [&](bool before) {
      Deal d{static_solver::uniform_chunks(S, chunk), {}};
      if (before) d.chunks = static_solver::tile_aligned_chunks(p, std::move(d.chunks), tile);
      const std::vector<Token> areas = before ? static_solver::chunk_areas(p, d.chunks) : query_chunk_areas(p, chunk);
      d.host = two_level
                   ? static_solver::deal_chunks_by_node(areas, static_solver::chunk_key_ranges(p, d.chunks), d.chunks,
                                                        static_cast<std::size_t>(node_chunk / chunk), P, node)
                   : static_solver::deal_chunks(areas, P);
      if (aligned && !before) d.chunks = static_solver::tile_cuts_after_deal(p, std::move(d.chunks), d.host, tile);
      return d;
    };
    // auto, one level: both deals; after where its busiest rank touches at
    // least kAutoMargin fewer tiles, else before. Each deal balances exact
    // areas, and either can leave a rank more tiles than the other
    // (causal_document's pack 16 at P = 8: 5.5 % more before); a few percent
    // less does not make the step shorter (the args' rates and areas decide
    // the rest: docs/bounds.md). Two levels: after, which keeps the nodes' deal.
    bool before = aligned && tile_cuts_ == "before";
    std::string chose;
    Deal d;
    if (aligned && tile_cuts_ == "auto" && !two_level) {
      Deal a = deal(true), b = deal(false);
      const std::int64_t ta = static_solver::busiest_rank_tiles(p, a.chunks, a.host, P, tile);
      const std::int64_t tb = static_solver::busiest_rank_tiles(p, b.chunks, b.host, P, tile);
      before = static_cast<double>(tb) > (1 - kAutoMargin) * static_cast<double>(ta);
      d = std::move(before ? a : b);
      chose = fmt::format(" (tile_cuts=auto: busiest rank {} tiles of {} before the deal, {} after)", ta, tile, tb);
    } else {
      d = deal(before);
    }
    const std::vector<Range>& chunks = d.chunks;
    const std::vector<Rank>& host = d.host;
    auto dispatched =
        std::make_shared<const TaskGrid>(grid.problem_ptr(), static_solver::dispatched_sharding(chunks, host, P));

    Solution sol;
    Assignment& a = sol.assignment;
    a.grid = dispatched;
    a.rank.resize(static_cast<std::size_t>(dispatched->num_tasks()));
    for (TaskId t = 0; t < dispatched->num_tasks(); ++t) a.rank[static_cast<std::size_t>(t)] = dispatched->q_host(t);
    sol.figures.set("chunks", static_cast<double>(n));
    sol.figures.set("chunk_tokens", static_cast<double>(chunk));
    sol.figures.set("dispatched_blocks", dispatched->sharding().num_blocks());
    sol.figures.set("node_ranks", two_level ? node : 0);
    sol.figures.set("tile_aligned", aligned ? static_cast<double>(tile) : 0.0);
    sol.note = "static: " + std::to_string(n) + " chunks of " + std::to_string(chunk) + " tokens dispatched to " +
             std::to_string(P) + " ranks (" + std::to_string(dispatched->sharding().num_blocks()) +
             " blocks after merging neighbours on one rank)" +
             (two_level ? "; two levels: node chunks of " + std::to_string(node_chunk) + " tokens dealt to " +
                              std::to_string(P / node) + " nodes of " + std::to_string(node) + " ranks"
                        : std::string()) +
             (before ? "; cuts inside documents at multiples of " + std::to_string(tile) +
                           " tokens from their starts (the kernel model's tiles)"
              : aligned ? "; the deal's cuts between ranks moved up to multiples of " + std::to_string(tile) +
                              " tokens from their documents' starts (the kernel model's tiles)"
                        : std::string()) +
             chose;
    return sol;
  }

 private:
  std::int64_t chunk_tokens_;
  std::int64_t chunks_per_rank_;
  std::int64_t node_ranks_;
  std::int64_t node_chunks_;
  std::int64_t tile_tokens_;
  std::string tile_cuts_;
};

const cpsched_param_spec kParams[] = {
    {"chunk_tokens", CPSCHED_PARAM_INT, "0", "dispatch chunk length in tokens (0: S / (chunks_per_rank x P))"},
    {"chunks_per_rank", CPSCHED_PARAM_INT, "8", "chunks per rank when chunk_tokens is 0 (8: as published)"},
    {"node_ranks", CPSCHED_PARAM_INT, "0",
     "0: one-level dispatch (as published); N > 0: two levels, node chunks dealt to nodes of N ranks (balanced, "
     "then swapped to keep documents inside few nodes), then chunks to the node's ranks; -1: N from the time cost "
     "model's GPUs per node"},
    {"node_chunks", CPSCHED_PARAM_INT, "4", "two levels: node chunks per node (node chunk = S / (node_chunks x nodes))"},
    {"tile_tokens", CPSCHED_PARAM_INT, "0",
     "cuts inside a document move to multiples of this many tokens from its start (at most half of it); 0: the "
     "time cost model's kernel tiles, and the published cuts without a kernel model"},
    {"tile_cuts", CPSCHED_PARAM_STRING, "before",
     "cutting at tiles: 'before' deals the chunks cut at tiles; 'after' deals the chunks as published, then moves "
     "each cut between two ranks up to a tile (the same deal; a document's pieces touch no more tiles in all); "
     "'auto': both deals, after where its busiest rank touches 2 % fewer tiles, else before (one level; two levels: "
     "after)"},
};

}  // namespace

CPSCHED_SOLVER_PLUGIN(Static, "static",
                      "pre-iteration dispatch of area-balanced chunks, every task on its q host (KV-only)",
                      kParams)
