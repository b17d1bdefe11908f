#pragma once
// The report folder of `cpsched compare` is written under an exclusive lock,
// so that two runs never interleave their files; each file is written with
// cpsched::write_file_atomic, so a failed run leaves the previous one intact.
#include <filesystem>

namespace cpsched::cli {

// An exclusive, non-blocking flock on DIR/.cpsched-compare.lock, held while the
// object lives (and released by the kernel if the process dies). Throws
// cpsched::Error naming the folder when another process holds it.
class ReportFolderLock {
 public:
  explicit ReportFolderLock(const std::filesystem::path& dir);
  ~ReportFolderLock();
  ReportFolderLock(const ReportFolderLock&) = delete;
  ReportFolderLock& operator=(const ReportFolderLock&) = delete;

  static constexpr const char* kFileName = ".cpsched-compare.lock";

 private:
  int fd_ = -1;
};

}  // namespace cpsched::cli
