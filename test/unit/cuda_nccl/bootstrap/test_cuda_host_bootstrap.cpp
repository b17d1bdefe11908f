// Bootstrap (env/file launch), launch selection, the rank-plan codec of
// plan_source = broadcast, and the small collectives over a backend.
#include <doctest/doctest.h>

#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <unistd.h>

#include "brute_force.hpp"
#include "cpsched/base/error.hpp"
#include "host/backend/host_backend.hpp"
#include "host/bootstrap/bootstrap.hpp"
#include "host/plan/plan_codec.hpp"
#include "host/run/collectives.hpp"
#include "plans.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

g::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string temp_path(const char* tag) {
  return (std::filesystem::temp_directory_path() / fmt::format("cpsched_test_{}_{}", tag, ::getpid())).string();
}

std::map<std::string, std::string> rank_env(int r, int world, const std::string& file, const std::string& run) {
  return {{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(world)}, {"LOCAL_RANK", std::to_string(r % 2)},
          {"CPSCHED_NCCL_ID_FILE", file}, {"CPSCHED_RUN_ID", run}};
}

}  // namespace

TEST_CASE("env launch: rank 0's id reaches every rank through the shared file; a stale file is ignored") {
  const std::string file = temp_path("id");
  // A file left by an earlier run (another run id) must not be read.
  {
    std::ofstream f(file, std::ios::binary);
    f << "cpsched-bootstrap/1\nold-run\n3\nxyz";
  }
  constexpr int W = 4;
  std::vector<std::vector<std::uint8_t>> got(W);
  std::vector<g::LaunchInfo> infos(W);
  std::vector<std::thread> ts;
  for (int r = 0; r < W; ++r)
    ts.emplace_back([&, r] {
      auto bs = g::make_env_bootstrap(env_of(rank_env(r, W, file, "run-42")));
      infos[static_cast<std::size_t>(r)] = bs->info();
      std::vector<std::uint8_t> id;
      if (r == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // readers start on the stale file
        for (int i = 0; i < 128; ++i) id.push_back(static_cast<std::uint8_t>(i * 7 + 3));
      }
      bs->broadcast(id);
      got[static_cast<std::size_t>(r)] = id;
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < W; ++r) {
    CHECK(got[static_cast<std::size_t>(r)] == got[0]);
    CHECK(infos[static_cast<std::size_t>(r)].rank == r);
    CHECK(infos[static_cast<std::size_t>(r)].world == W);
    CHECK(infos[static_cast<std::size_t>(r)].local_rank == r % 2);
    CHECK(infos[static_cast<std::size_t>(r)].how == "env");
  }
  REQUIRE(got[0].size() == 128);
  CHECK(got[0][5] == 38);
  g::make_env_bootstrap(env_of(rank_env(0, W, file, "run-42")))->done();
  CHECK_FALSE(std::filesystem::exists(file));
}

TEST_CASE("env launch errors name the variable or the file") {
  const std::string file = temp_path("none");
  auto e = rank_env(1, 2, file, "r");
  e.erase("RANK");
  CHECK_THROWS_WITH_AS(g::make_env_bootstrap(env_of(e)), doctest::Contains("RANK is not set"), Error);
  e = rank_env(1, 2, file, "r");
  e["WORLD_SIZE"] = "two";
  CHECK_THROWS_WITH_AS(g::make_env_bootstrap(env_of(e)), doctest::Contains("WORLD_SIZE=two"), Error);
  e = rank_env(3, 2, file, "r");
  CHECK_THROWS_WITH_AS(g::make_env_bootstrap(env_of(e)), doctest::Contains("outside WORLD_SIZE"), Error);
  e = rank_env(1, 2, file, "r");
  e.erase("CPSCHED_NCCL_ID_FILE");
  CHECK_THROWS_WITH_AS(g::make_env_bootstrap(env_of(e)), doctest::Contains("CPSCHED_NCCL_ID_FILE"), Error);
  g::FileOptions quick;
  quick.timeout = std::chrono::milliseconds(60);
  quick.poll = std::chrono::milliseconds(5);
  auto bs = g::make_env_bootstrap(env_of(rank_env(1, 2, file, "r")), quick);
  std::vector<std::uint8_t> id;
  CHECK_THROWS_WITH_AS(bs->broadcast(id), doctest::Contains(file.c_str()), Error);
}

TEST_CASE("auto launch: mpirun variables pick MPI (when built), RANK/WORLD_SIZE the env launch, else single") {
  CHECK(g::resolve_launch("auto", env_of({})) == "single");
  CHECK(g::resolve_launch("auto", env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}})) == "env");
  CHECK(g::resolve_launch("auto", env_of({{"OMPI_COMM_WORLD_SIZE", "2"}})) == (g::mpi_available() ? "mpi" : "single"));
  CHECK(g::resolve_launch("env", env_of({})) == "env");
  CHECK_THROWS_WITH_AS(g::resolve_launch("slurm", env_of({})), doctest::Contains("slurm"), Error);
  auto single = g::make_bootstrap("single", env_of({}));
  CHECK(single->info().world == 1);
  CHECK(single->info().rank == 0);
}

TEST_CASE("a rank plan survives encode/decode; truncated or foreign bytes are rejected") {
  std::mt19937_64 rng(13);
  auto c = test::make_plan_case(test::random_document_mask(500, rng), 4, Heads{8, 4, 16, 2}, GridOptions{true, 2}, 3, 17);
  for (const RankPlan& rp : c.plan.ranks) {
    const auto bytes = g::encode_rank_plan(rp, c.plan.num_stages);
    int stages = 0;
    const RankPlan back = g::decode_rank_plan(bytes, &stages);
    CHECK(stages == 3);
    for (const auto& [a, b] : {std::pair{&rp.fwd, &back.fwd}, std::pair{&rp.bwd, &back.bwd}}) {
      CHECK(a->calc.local_attn_args == b->calc.local_attn_args);
      CHECK(a->calc.remote_attn_args == b->calc.remote_attn_args);
      CHECK(a->comm.stages == b->comm.stages);
    }
    auto cut = bytes;
    cut.resize(cut.size() / 2);
    CHECK_THROWS_WITH_AS(g::decode_rank_plan(cut), doctest::Contains("truncated"), Error);
  }
  CHECK_THROWS_WITH_AS(g::decode_rank_plan(std::vector<std::uint8_t>(64, 0)), doctest::Contains("not a cpsched rank plan"),
                       Error);
}

TEST_CASE("scatter, gather and broadcast over point-to-point groups, through one staging buffer") {
  constexpr int W = 3;
  g::HostWorld world(W);
  std::vector<g::Blob> scattered(W), bcast(W);
  std::vector<std::vector<g::Blob>> gathered(W);
  std::vector<int> allocations(W), grown(W);
  std::vector<Bytes> held_before(W), held_after(W);
  std::vector<std::thread> ts;
  for (Rank r = 0; r < W; ++r)
    ts.emplace_back([&, r] {
      g::HostBackend be(world, r, g::Schedule::lazy_comm);
      const auto i = static_cast<std::size_t>(r);
      std::vector<g::Blob> blobs;
      for (int k = 0; k < W; ++k) blobs.push_back(g::Blob(static_cast<std::size_t>(k * 3), static_cast<std::uint8_t>(k + 1)));
      {
        g::Staging st(be, 64);  // room for every message of this test
        held_before[i] = be.bytes_held();
        for (int round = 0; round < 4; ++round) {  // repeated calls allocate nothing more
          scattered[i] = g::scatter_from_root(st, r == 0 ? &blobs : nullptr);
          gathered[i] = g::gather_to_root(st, g::Blob(i + 1, static_cast<std::uint8_t>(10 + r)));
          bcast[i] = g::broadcast_from_root(st, r == 0 ? g::Blob{9, 8, 7} : g::Blob{});
        }
        allocations[i] = st.allocations();
        held_after[i] = be.bytes_held();
        // A message larger than the buffer grows it once, freeing the old one.
        const g::Blob big = g::broadcast_from_root(st, r == 0 ? g::Blob(1000, 5) : g::Blob{});
        CHECK(big == g::Blob(1000, 5));
        grown[i] = st.allocations();
        CHECK(be.bytes_held() == 1000);
      }
      CHECK(be.bytes_held() == 0);  // the staging buffer is released with it
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < W; ++r) {
    const auto i = static_cast<std::size_t>(r);
    CHECK(scattered[i] == g::Blob(i * 3, static_cast<std::uint8_t>(r + 1)));
    CHECK(bcast[i] == g::Blob{9, 8, 7});
    CHECK(allocations[i] == 1);
    CHECK(held_before[i] == 64);
    CHECK(held_after[i] == 64);
    CHECK(grown[i] == 2);
  }
  REQUIRE(gathered[0].size() == W);
  for (int r = 0; r < W; ++r)
    CHECK(gathered[0][static_cast<std::size_t>(r)] == g::Blob(static_cast<std::size_t>(r + 1), static_cast<std::uint8_t>(10 + r)));
  CHECK(gathered[1].empty());
}

TEST_CASE("gather_each_to_root hands rank 0 one rank's blob at a time, in rank order") {
  constexpr int W = 4;
  g::HostWorld world(W);
  std::vector<Rank> order;
  std::vector<std::size_t> sizes;
  std::vector<std::thread> ts;
  for (Rank r = 0; r < W; ++r)
    ts.emplace_back([&, r] {
      g::HostBackend be(world, r);
      g::Staging st(be, 8 * W);
      // Rank 2 sends nothing: an empty blob still reaches the callback.
      const g::Blob mine(r == 2 ? 0 : static_cast<std::size_t>(100 * (r + 1)), static_cast<std::uint8_t>(r));
      g::gather_each_to_root(st, mine, [&](Rank from, const g::Blob& b) {
        order.push_back(from);
        sizes.push_back(b.size());
        for (std::uint8_t x : b) REQUIRE(x == static_cast<std::uint8_t>(from));
      });
      // Rank 0 holds one message's buffer at a time: the largest, never their sum.
      if (r == 0) CHECK(be.bytes_held() == 400);
    });
  for (auto& t : ts) t.join();
  CHECK(order == std::vector<Rank>{0, 1, 2, 3});
  CHECK(sizes == std::vector<std::size_t>{100, 200, 0, 400});
}
