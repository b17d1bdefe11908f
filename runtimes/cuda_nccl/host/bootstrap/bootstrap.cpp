#include "bootstrap.hpp"

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <thread>
#include <unistd.h>

#include "cpsched/base/error.hpp"

namespace cpsched::gpu {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

class SingleBootstrap final : public Bootstrap {
 public:
  SingleBootstrap() { info_.how = "single"; }
  const LaunchInfo& info() const override { return info_; }
  void broadcast(std::vector<std::uint8_t>&) override {}

 private:
  LaunchInfo info_;
};

int env_int(const EnvLookup& env, const std::string& name) {
  const auto v = env(name);
  if (!v) throw Error(fmt::format("cuda_nccl env launch: {} is not set", name));
  int x = 0;
  const auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
  if (ec != std::errc() || p != v->data() + v->size() || x < 0)
    throw Error(fmt::format("cuda_nccl env launch: {}={} is not a non-negative integer", name, *v));
  return x;
}

// File layout: "cpsched-bootstrap/1\n<run id>#<generation>\n<size>\n" then
// the bytes. The generation counts the broadcasts of this process, so a
// reader never takes the file of an earlier broadcast of the same run.
constexpr const char* kHeader = "cpsched-bootstrap/1";

class FileBootstrap final : public Bootstrap {
 public:
  FileBootstrap(const EnvLookup& env, FileOptions opt) : opt_(opt) {
    info_.rank = env_int(env, "RANK");
    info_.world = env_int(env, "WORLD_SIZE");
    info_.local_rank = env("LOCAL_RANK") ? env_int(env, "LOCAL_RANK") : info_.rank;
    info_.how = "env";
    if (info_.world < 1 || info_.rank >= info_.world)
      throw Error(fmt::format("cuda_nccl env launch: RANK={} outside WORLD_SIZE={}", info_.rank, info_.world));
    const auto path = env("CPSCHED_NCCL_ID_FILE");
    if (!path || path->empty())
      throw Error("cuda_nccl env launch: CPSCHED_NCCL_ID_FILE is not set (a path every rank can read; rank 0 "
                  "writes the NCCL unique id there)");
    path_ = *path;
    if (auto id = env("CPSCHED_RUN_ID")) run_id_ = *id;
    else if (auto tid = env("TORCHELASTIC_RUN_ID")) run_id_ = *tid;
  }
  const LaunchInfo& info() const override { return info_; }

  void broadcast(std::vector<std::uint8_t>& bytes) override {
    if (info_.world == 1) return;
    ++generation_;
    if (info_.rank == 0) write(bytes);
    else bytes = read();
  }

  void done() override {
    if (info_.rank == 0 && info_.world > 1) {
      std::error_code ec;
      std::filesystem::remove(path_, ec);
    }
  }

 private:
  void write(const std::vector<std::uint8_t>& bytes) {
    const std::string tmp = fmt::format("{}.tmp.{}", path_, ::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (!f) throw Error(fmt::format("cuda_nccl env launch: cannot write {}", tmp));
      f << kHeader << '\n' << tag() << '\n' << bytes.size() << '\n';
      f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      if (!f) throw Error(fmt::format("cuda_nccl env launch: cannot write {}", tmp));
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path_, ec);
    if (ec) throw Error(fmt::format("cuda_nccl env launch: cannot rename {} to {}: {}", tmp, path_, ec.message()));
  }

  // True and the payload when the file is complete and of this run.
  bool try_read(std::vector<std::uint8_t>& out) const {
    std::ifstream f(path_, std::ios::binary);
    if (!f) return false;
    std::string header, run, size_line;
    if (!std::getline(f, header) || header != kHeader || !std::getline(f, run) || !std::getline(f, size_line))
      return false;
    if (run != tag()) return false;
    std::size_t n = 0;
    const auto [p, ec] = std::from_chars(size_line.data(), size_line.data() + size_line.size(), n);
    if (ec != std::errc() || p != size_line.data() + size_line.size()) return false;
    out.assign(n, 0);
    f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n));
    return static_cast<std::size_t>(f.gcount()) == n;
  }

  std::vector<std::uint8_t> read() const {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::uint8_t> out;
    while (!try_read(out)) {
      if (std::chrono::steady_clock::now() - t0 > opt_.timeout)
        throw Error(fmt::format("cuda_nccl env launch: rank {} waited {} s for {} (written by rank 0{})", info_.rank,
                                std::chrono::duration_cast<std::chrono::seconds>(opt_.timeout).count(), path_,
                                run_id_.empty() ? "" : fmt::format(" with run id {}", run_id_)));
      std::this_thread::sleep_for(opt_.poll);
    }
    return out;
  }

  std::string tag() const { return fmt::format("{}#{}", run_id_, generation_); }

  LaunchInfo info_;
  FileOptions opt_;
  std::string path_;
  std::string run_id_;
  int generation_ = 0;
};

bool started_by_mpirun(const EnvLookup& env) {
  return env("OMPI_COMM_WORLD_SIZE") || env("PMI_SIZE") || env("PMIX_RANK") || env("MPI_LOCALNRANKS");
}

}  // namespace

std::unique_ptr<Bootstrap> make_single_bootstrap() { return std::make_unique<SingleBootstrap>(); }

std::unique_ptr<Bootstrap> make_env_bootstrap(const EnvLookup& env, FileOptions opt) {
  return std::make_unique<FileBootstrap>(env, opt);
}

std::string resolve_launch(const std::string& launch, const EnvLookup& env) {
  if (launch == "mpi" || launch == "env" || launch == "single") return launch;
  if (launch != "auto")
    throw Error(fmt::format("cuda_nccl: launch '{}' is not one of auto, mpi, env, single", launch));
  if (started_by_mpirun(env) && mpi_available()) return "mpi";
  if (env("RANK") && env("WORLD_SIZE")) return "env";
  return "single";
}

std::unique_ptr<Bootstrap> make_bootstrap(const std::string& launch, const EnvLookup& env) {
  const std::string how = resolve_launch(launch, env);
  if (how == "mpi") return make_mpi_bootstrap();
  if (how == "env") return make_env_bootstrap(env);
  return make_single_bootstrap();
}

}  // namespace cpsched::gpu
