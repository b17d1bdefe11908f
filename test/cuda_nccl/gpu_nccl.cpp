// GPU test (label gpu; exit 77 with fewer than 2 devices): the executor over
// real NCCL, one process per GPU (up to 4), env launch (RANK, WORLD_SIZE,
// LOCAL_RANK, CPSCHED_NCCL_ID_FILE), both plan sources, 1 and 2 stages, with
// the self-check against the sim runtime. Processes are forked before any
// CUDA call, so each child owns its CUDA context.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpsched/mask/generators.hpp"
#include "device/cuda_backend.hpp"
#include "device/executor.hpp"
#include "plans.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

int visible_devices() {
  const pid_t pid = fork();
  if (pid == 0) _exit(std::min(g::cuda_device_count(), 100));
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

int child(int rank, int world, int stages, const char* source, const std::string& file, const std::string& run) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("CPSCHED_NCCL_ID_FILE", file.c_str(), 1);
  setenv("CPSCHED_RUN_ID", run.c_str(), 1);
  try {
    const Token S = 2048 * world;
    auto c = test::make_plan_case(test::generated_mask(MaskKind::causal_document, S, {S / 2, S / 4, S / 8, S - S / 2 - S / 4 - S / 8}),
                                  world, Heads{8, 2, 128, 2}, GridOptions{true, 1}, stages, 31);
    Params p;
    p.set("launch", std::string("env"));
    p.set("check", true);
    p.set("plan_source", std::string(source));
    g::CudaNcclExecutor ex(p);
    ExecuteInput in;
    in.problem = c.problem;
    in.grid = c.grid;
    in.assignment = &c.assignment;
    in.plan = &c.plan;
    in.seed = 1;
    const ExecutionReport rep = ex.execute(in);
    if (rank == 0) std::printf("%s", rep.text.c_str());
    return rep.passed ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 2;
  }
}

}  // namespace

int main() {
  const int n = std::min(visible_devices(), 4);
  if (n < 2) {
    std::printf("%d CUDA device(s): the NCCL test needs 2: skipped\n", n);
    return 77;
  }
  int failures = 0;
  int run = 0;
  for (int stages : {1, 2})
    for (const char* source : {"solve_everywhere", "broadcast"}) {
      const std::string file =
          (std::filesystem::temp_directory_path() / fmt::format("cpsched_nccl_id_{}", getpid())).string();
      const std::string run_id = fmt::format("{}-{}", getpid(), run++);
      std::vector<pid_t> kids;
      for (int r = 0; r < n; ++r) {
        const pid_t pid = fork();
        if (pid == 0) {
          std::fflush(stdout);
          _exit(child(r, n, stages, source, file, run_id));
        }
        kids.push_back(pid);
      }
      bool ok = true;
      for (pid_t k : kids) {
        int status = 0;
        waitpid(k, &status, 0);
        ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      }
      std::printf("%s NCCL executor: %d GPUs, %d stage(s), plan %s\n", ok ? "ok  " : "FAIL", n, stages, source);
      failures += ok ? 0 : 1;
    }
  return failures == 0 ? 0 : 1;
}
