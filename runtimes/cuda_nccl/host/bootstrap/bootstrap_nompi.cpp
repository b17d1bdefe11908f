// The MPI launch in a build without MPI: only the env and single launches exist.
#include "bootstrap.hpp"
#include "cpsched/base/error.hpp"

namespace cpsched::gpu {

bool mpi_available() { return false; }

std::unique_ptr<Bootstrap> make_mpi_bootstrap() {
  throw Error("cuda_nccl: launch 'mpi' needs a build with MPI (CMake did not find it); use the env launch "
              "(RANK, WORLD_SIZE, LOCAL_RANK, CPSCHED_NCCL_ID_FILE)");
}

}  // namespace cpsched::gpu
