#pragma once
// How the processes of a run find each other before NCCL exists: rank, world
// size, the local rank (which GPU), and a broadcast of a few bytes from rank 0
// (the NCCL unique id).
//
// Launches:
//  * mpi    `mpirun -np P cpsched run ...`: rank and size from MPI_COMM_WORLD,
//           the local rank from a shared-memory split, MPI_Bcast (needs a
//           build with MPI; bootstrap_mpi.cpp).
//  * env    the PyTorch launcher convention: RANK, WORLD_SIZE, LOCAL_RANK
//           (default: RANK) and CPSCHED_NCCL_ID_FILE, a path on a file system
//           every rank sees. Rank 0 writes the bytes there (atomically, by
//           rename); the others poll until the file appears. When
//           CPSCHED_RUN_ID (or torchrun's TORCHELASTIC_RUN_ID) is set it is
//           written with the bytes and readers wait for a file with their own
//           run id, so a stale file of an earlier run is never used.
//  * single one process, rank 0 of 1.
//  * auto   mpi when the process was started by mpirun (OMPI_/PMI_/PMIX_
//           variables) and MPI is built in; else env when RANK and WORLD_SIZE
//           are set; else single.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpsched/problem/problem.hpp"

namespace cpsched::gpu {

struct LaunchInfo {
  Rank rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string how;  // "mpi", "env" or "single"
};

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual const LaunchInfo& info() const = 0;
  // Rank 0's `bytes` to every rank (`bytes` is input on rank 0, output elsewhere).
  virtual void broadcast(std::vector<std::uint8_t>& bytes) = 0;
  // Called once every rank has what the broadcast delivered (e.g. after NCCL
  // init): rank 0 removes a rendezvous file.
  virtual void done() {}
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

struct FileOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds poll{std::chrono::milliseconds(20)};
};

std::unique_ptr<Bootstrap> make_single_bootstrap();
// Throws cpsched::Error naming the missing or malformed variable.
std::unique_ptr<Bootstrap> make_env_bootstrap(const EnvLookup& env, FileOptions opt = {});
// Throws when the build has no MPI.
std::unique_ptr<Bootstrap> make_mpi_bootstrap();
bool mpi_available();

// `launch`: auto, mpi, env or single (the executor parameter).
std::unique_ptr<Bootstrap> make_bootstrap(const std::string& launch, const EnvLookup& env);
// Which launch `auto` picks under `env`.
std::string resolve_launch(const std::string& launch, const EnvLookup& env);

}  // namespace cpsched::gpu
