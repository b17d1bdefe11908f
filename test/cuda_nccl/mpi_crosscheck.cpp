// MPI test of the CUDA runtime's host side, 4 processes on the CPU:
//  1. the real MPI bootstrap gives rank, size and a local rank, and broadcasts
//     a stand-in NCCL unique id (128 bytes) that every rank then holds;
//  2. every rank solves the same problem deterministically and keeps its own
//     RankPlan (plan_source = solve_everywhere); rank 0's encoded plans,
//     broadcast, equal what each rank solved (plan_source = broadcast);
//  3. every rank translates its plan into NCCL calls; the calls of all ranks
//     are gathered and every rank's sends are cross-checked against its
//     peers' receives, call by call (tensor, bytes).
// Exit 0 when all holds on every rank.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <mpi.h>
#include <random>
#include <unistd.h>

#include "cpsched/mask/generators.hpp"
#include "host/bootstrap/bootstrap.hpp"
#include "host/plan/plan_codec.hpp"
#include "host/plan/transfers.hpp"
#include "plans.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

int fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

}  // namespace

int main() {
  int bad = 0;
  int rank = 0, world = 0;
  {
    auto bs = g::make_mpi_bootstrap();
    const g::LaunchInfo info = bs->info();
    rank = info.rank;
    world = info.world;
    if (world != 4) bad += fail(rank, fmt::format("expected 4 processes, got {}", world));
    if (info.local_rank < 0 || info.local_rank >= world) bad += fail(rank, fmt::format("local rank {}", info.local_rank));

    // 1. A stand-in unique id from rank 0 (its bytes depend on rank 0's pid: no rank can guess them).
    std::vector<std::uint8_t> id;
    if (rank == 0) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(::getpid()) * 7919u);
      for (int i = 0; i < 128; ++i) id.push_back(static_cast<std::uint8_t>(rng()));
    }
    bs->broadcast(id);
    std::vector<std::uint8_t> all(static_cast<std::size_t>(128 * world));
    if (id.size() != 128) bad += fail(rank, fmt::format("id of {} bytes", id.size()));
    id.resize(128);
    MPI_Allgather(id.data(), 128, MPI_BYTE, all.data(), 128, MPI_BYTE, MPI_COMM_WORLD);
    for (int r = 1; r < world; ++r)
      if (!std::equal(all.begin(), all.begin() + 128, all.begin() + 128 * r))
        bad += fail(rank, fmt::format("rank {} holds another id than rank 0", r));

    // 2. The same problem on every rank: documents, 4 ranks, 2 blocks each, 2 stages, random placement.
    const Token S = 4 * 512;
    auto c = test::make_plan_case(test::generated_mask(MaskKind::causal_document, S, {700, 300, 520, 228, 300}), world,
                                  Heads{8, 2, 64, 2}, GridOptions{true, 2}, 2, 99);
    const RankPlan& mine = c.plan.ranks[static_cast<std::size_t>(rank)];
    std::vector<std::uint8_t> blob;
    if (rank == 0) {
      // All ranks' plans, length-prefixed, in one broadcast.
      for (const RankPlan& rp : c.plan.ranks) {
        const auto b = g::encode_rank_plan(rp, c.plan.num_stages);
        const auto n = static_cast<std::uint64_t>(b.size());
        blob.insert(blob.end(), reinterpret_cast<const std::uint8_t*>(&n), reinterpret_cast<const std::uint8_t*>(&n) + 8);
        blob.insert(blob.end(), b.begin(), b.end());
      }
    }
    bs->broadcast(blob);
    std::size_t at = 0;
    for (int r = 0; r <= rank && at + 8 <= blob.size(); ++r) {
      std::uint64_t n = 0;
      std::memcpy(&n, blob.data() + at, 8);
      at += 8;
      if (r == rank) {
        const RankPlan got = g::decode_rank_plan(std::vector<std::uint8_t>(blob.begin() + static_cast<std::ptrdiff_t>(at),
                                                                           blob.begin() + static_cast<std::ptrdiff_t>(at + n)));
        if (!(got.fwd.comm.stages == mine.fwd.comm.stages && got.bwd.comm.stages == mine.bwd.comm.stages &&
              got.fwd.calc.remote_attn_args == mine.fwd.calc.remote_attn_args &&
              got.bwd.calc.local_attn_args == mine.bwd.calc.local_attn_args))
          bad += fail(rank, "rank 0's broadcast plan differs from the plan solved here");
      }
      at += static_cast<std::size_t>(n);
    }

    // 3. Cross-check of the NCCL calls of all ranks.
    const g::HeadLayout h = g::HeadLayout::of(*c.problem);
    const std::vector<g::WireOp> ops =
        g::wire_ops(g::translate(mine.fwd, g::Pass::fwd, h, rank), g::translate(mine.bwd, g::Pass::bwd, h, rank), rank);
    int n = static_cast<int>(ops.size() * sizeof(g::WireOp));
    std::vector<int> counts(static_cast<std::size_t>(world)), displs(static_cast<std::size_t>(world));
    MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
    int total = 0;
    for (int r = 0; r < world; ++r) {
      displs[static_cast<std::size_t>(r)] = total;
      total += counts[static_cast<std::size_t>(r)];
    }
    std::vector<std::uint8_t> buf(static_cast<std::size_t>(total));
    MPI_Allgatherv(ops.data(), n, MPI_BYTE, buf.data(), counts.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD);
    std::vector<std::vector<g::WireOp>> per_rank(static_cast<std::size_t>(world));
    std::size_t calls = 0;
    for (int r = 0; r < world; ++r) {
      auto& v = per_rank[static_cast<std::size_t>(r)];
      v.resize(static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]) / sizeof(g::WireOp));
      std::memcpy(v.data(), buf.data() + displs[static_cast<std::size_t>(r)], v.size() * sizeof(g::WireOp));
      for (const g::WireOp& w : v)
        if (w.self != r) bad += fail(rank, fmt::format("a call of rank {} claims rank {}", r, w.self));
      calls += v.size();
    }
    for (const std::string& p : g::cross_check(per_rank)) bad += fail(rank, p);
    if (calls == 0) bad += fail(rank, "the plan moves nothing: the cross-check would prove nothing");

    int all_bad = 0;
    MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
      std::printf("mpi cross-check: %d ranks, stand-in id broadcast, %zu NCCL calls cross-checked: %s\n", world, calls,
                  all_bad == 0 ? "ok" : "FAILED");
    bad = all_bad;
  }  // the bootstrap finalizes MPI
  return bad == 0 ? 0 : 1;
}
