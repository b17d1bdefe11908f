// Solver plugin `static`: MagiAttention's pre-iteration dispatch (DESIGN §6).
// Tokens are re-dispatched in chunks balanced by area, then every task runs
// on the rank hosting its q block: only KV moves. The assignment's grid is
// built over the dispatched sharding, so the metrics and the plan see the
// token permutation.
#include <memory>
#include <string>

#include <cpsched/error.hpp>
#include <cpsched/plugin.hpp>
#include <cpsched/solver.hpp>

#include "dispatch.hpp"

namespace {

using namespace cpsched;

class Static final : public Solver {
 public:
  explicit Static(const Params& p) : chunk_tokens_(p.get_int("chunk_tokens")) {
    if (chunk_tokens_ < 0)
      throw Error("static: chunk_tokens = " + std::to_string(chunk_tokens_) + " must be >= 0 (0: S / (8 P))");
  }

  Assignment solve(const SolveInput& in) override {
    if (!in.grid) throw Error("static: no task grid given");
    const TaskGrid& grid = *in.grid;
    const Problem& p = grid.problem();
    const int P = grid.cp_size();
    const Token S = p.seqlen();
    if (S <= 0) throw Error("static: the sequence is empty");
    const Token chunk = chunk_tokens_ > 0 ? chunk_tokens_ : std::max<Token>(1, S / (Token{8} * P));
    const Token n = (S + chunk - 1) / chunk;
    if (n < P)
      throw Error("static: " + std::to_string(n) + " chunks of " + std::to_string(chunk) + " tokens for " +
                  std::to_string(P) + " ranks; every rank needs at least one chunk (lower chunk_tokens)");

    const std::vector<Token> areas = static_solver::chunk_areas(p.mask, chunk);
    const std::vector<Rank> host = static_solver::deal_chunks(areas, P);
    auto dispatched =
        std::make_shared<const TaskGrid>(grid.problem_ptr(), static_solver::dispatched_sharding(S, chunk, host, P));

    Assignment a;
    a.grid = dispatched;
    a.rank.resize(static_cast<std::size_t>(dispatched->num_tasks()));
    for (TaskId t = 0; t < dispatched->num_tasks(); ++t) a.rank[static_cast<std::size_t>(t)] = dispatched->q_host(t);
    a.note = "static: " + std::to_string(n) + " chunks of " + std::to_string(chunk) + " tokens dispatched to " +
             std::to_string(P) + " ranks (" + std::to_string(dispatched->sharding().num_blocks()) +
             " blocks after merging neighbours on one rank)";
    return a;
  }

 private:
  std::int64_t chunk_tokens_;
};

const cpsched_param_spec kParams[] = {
    {"chunk_tokens", CPSCHED_PARAM_INT, "0", "dispatch chunk length in tokens (0: S / (8 P))"},
};

}  // namespace

CPSCHED_SOLVER_PLUGIN(Static, "static",
                      "pre-iteration dispatch of area-balanced chunks, every task on its q host (KV-only)",
                      kParams)
