#include "cpsched/io/input_file.hpp"

#include <cerrno>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>

#include "cpsched/base/error.hpp"

namespace cpsched {

namespace {

std::string kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISREG(m)) return {};
  return "not a regular file";
}

std::string sys(int err) { return std::system_category().message(err); }

}  // namespace

std::string non_regular_kind(const std::filesystem::path& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return {};
  return kind_of(st.st_mode);
}

InputFile::InputFile(const std::filesystem::path& path, std::string_view what) : name_(path.string()) {
  if (name_.empty()) throw Error(fmt::format("an empty path names no {}", what));
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT) throw Error(fmt::format("{}: no such file", name_));
    throw Error(fmt::format("{}: cannot open the {}: {}", name_, what, sys(err)));
  }
  struct stat st{};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw Error(fmt::format("{}: cannot read the {}: {}", name_, what, sys(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    if (S_ISDIR(st.st_mode)) throw Error(fmt::format("{}: is a folder, not a {}", name_, what));
    throw Error(fmt::format("{}: not a regular file (it is {}); a {} must be a regular file", name_,
                            kind_of(st.st_mode), what));
  }
  // Regular files never block; reads below are plain.
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = static_cast<std::uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::size_t InputFile::read(void* buf, std::size_t n) {
  auto* p = static_cast<char*>(buf);
  std::size_t got = 0;
  while (got < n) {
    // At most 1 GiB per call (Linux caps a read near 2 GiB).
    const std::size_t want = std::min<std::size_t>(n - got, std::size_t{1} << 30);
    const ssize_t r = ::read(fd_, p + got, want);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("{}: read error: {}", name_, sys(errno)));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

void InputFile::read_exact(void* buf, std::size_t n, std::string_view what_part) {
  const std::size_t got = read(buf, n);
  if (got != n)
    throw Error(fmt::format("{}: truncated: the file ended while reading {} ({} of {} bytes)", name_, what_part, got,
                            n));
}

std::string read_input_file(const std::filesystem::path& path, std::uint64_t max_bytes, std::string_view what) {
  InputFile f(path, what);
  if (f.size() > max_bytes)
    throw Error(fmt::format("{}: the {} has {} bytes (at most {})", f.name(), what, f.size(), max_bytes));
  // Read to the end, at most one byte past the bound: a file that grew
  // meanwhile is refused, not cut.
  std::string text;
  text.reserve(static_cast<std::size_t>(f.size()));
  char chunk[1 << 16];
  for (;;) {
    const std::size_t got = f.read(chunk, sizeof chunk);
    text.append(chunk, got);
    if (text.size() > max_bytes)
      throw Error(fmt::format("{}: the {} is larger than {} bytes", f.name(), what, max_bytes));
    if (got < sizeof chunk) break;
  }
  return text;
}

void check_input_folder(const std::filesystem::path& path, std::string_view what) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) throw Error(fmt::format("{}: no such folder (a {})", path.string(), what));
    throw Error(fmt::format("{}: cannot use it as a {}: {}", path.string(), what, sys(err)));
  }
  if (!S_ISDIR(st.st_mode))
    throw Error(fmt::format("{}: is {}, not a folder; a {} must be a folder", path.string(),
                            S_ISREG(st.st_mode) ? std::string("a file") : kind_of(st.st_mode), what));
}

}  // namespace cpsched
