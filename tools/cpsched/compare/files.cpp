#include "compare/files.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include "cpsched/base/error.hpp"

namespace cpsched::cli {

namespace fs = std::filesystem;

ReportFolderLock::ReportFolderLock(const fs::path& dir) {
  const fs::path lock = dir / kFileName;
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(fmt::format("{}: cannot open the report folder's lock {}: {}", dir.string(), lock.string(),
                            std::strerror(errno)));
  int rc = 0;
  while ((rc = ::flock(fd_, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw Error(fmt::format("{}: another `cpsched compare` is writing this report folder (it holds {}); wait for "
                              "it to finish or give another --out",
                              dir.string(), lock.string()));
    throw Error(fmt::format("{}: cannot lock {}: {}", dir.string(), lock.string(), std::strerror(err)));
  }
}

ReportFolderLock::~ReportFolderLock() {
  // The file stays: unlinking it would let a later run lock a fresh inode of
  // the same name while this one is still held through an open descriptor.
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace cpsched::cli
