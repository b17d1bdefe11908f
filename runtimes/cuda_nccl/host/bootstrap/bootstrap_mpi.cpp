// The MPI launch, built only when CMake finds MPI (else bootstrap_nompi.cpp).
#include <dlfcn.h>
#include <fmt/format.h>
#include <mpi.h>

#include "bootstrap.hpp"
#include "cpsched/base/error.hpp"

namespace cpsched::gpu {

namespace {

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, msg, &n);
    throw Error(fmt::format("cuda_nccl mpi launch: {} failed: {}", what, std::string(msg, static_cast<std::size_t>(n))));
  }
}

class MpiBootstrap final : public Bootstrap {
 public:
  MpiBootstrap() {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) throw Error("cuda_nccl mpi launch: MPI was already finalized in this process");
    if (!inited) {
      // This code lives in a plugin loaded with RTLD_LOCAL; some MPI builds
      // load components that need libmpi's symbols globally visible.
      Dl_info dl{};
      if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &dl) != 0 && dl.dli_fname != nullptr)
        dlopen(dl.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
      owns_ = true;
    }
    int rank = 0, size = 1;
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
    MPI_Comm node;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
          "MPI_Comm_split_type");
    int local = 0;
    check(MPI_Comm_rank(node, &local), "MPI_Comm_rank(node)");
    MPI_Comm_free(&node);
    info_ = LaunchInfo{rank, size, local, "mpi"};
  }
  ~MpiBootstrap() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }
  const LaunchInfo& info() const override { return info_; }
  void broadcast(std::vector<std::uint8_t>& bytes) override {
    auto n = static_cast<unsigned long long>(bytes.size());
    check(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD), "MPI_Bcast(size)");
    bytes.resize(static_cast<std::size_t>(n));
    if (n > 0) check(MPI_Bcast(bytes.data(), static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
  }

 private:
  LaunchInfo info_;
  bool owns_ = false;
};

}  // namespace

bool mpi_available() { return true; }
std::unique_ptr<Bootstrap> make_mpi_bootstrap() { return std::make_unique<MpiBootstrap>(); }

}  // namespace cpsched::gpu
