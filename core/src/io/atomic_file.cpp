#include "cpsched/io/atomic_file.hpp"

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fmt/format.h>
#include <random>
#include <streambuf>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>
#include <vector>

#include "cpsched/base/error.hpp"

namespace cpsched {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const fs::path& path, int err, std::string_view what = {}) {
  throw Error(fmt::format("cannot write '{}': {}{}", path.string(), what, std::system_category().message(err)));
}

// Temporaries of writes in progress, for the signal handler. Fixed storage:
// the handler may not allocate or lock. A write that finds no free slot still
// works; only its cleanup on a signal is lost.
struct PendingSlot {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 holds a path
  char path[4096];
};
std::array<PendingSlot, 16> g_pending;

int register_pending(const std::string& path) {
  if (path.size() >= sizeof(PendingSlot::path)) return -1;
  for (std::size_t i = 0; i < g_pending.size(); ++i) {
    int expected = 0;
    if (g_pending[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_pending[i].path, path.c_str(), path.size() + 1);
      g_pending[i].state.store(2);
      return static_cast<int>(i);
    }
  }
  return -1;
}

void unregister_pending(int slot) {
  if (slot >= 0) g_pending[static_cast<std::size_t>(slot)].state.store(0);
}

// A stream buffer over a file descriptor that keeps the first errno, so the
// error names the real cause (ENOSPC, EIO, ...) instead of "stream failed".
class FdBuf : public std::streambuf {
 public:
  explicit FdBuf(int fd) : fd_(fd), buf_(1 << 16) { setp(buf_.data(), buf_.data() + buf_.size()); }
  int error() const { return err_; }

 protected:
  int_type overflow(int_type ch) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override { return drain() ? 0 : -1; }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n <= 0) return 0;  // an empty write may come with a null pointer (memcpy's UB)
    const std::streamsize room = epptr() - pptr();
    if (n <= room) {
      std::memcpy(pptr(), s, static_cast<std::size_t>(n));
      pbump(static_cast<int>(n));
      return n;
    }
    // Large pieces bypass the buffer once it is drained.
    if (!drain()) return 0;
    if (n < static_cast<std::streamsize>(buf_.size())) {
      std::memcpy(pptr(), s, static_cast<std::size_t>(n));
      pbump(static_cast<int>(n));
      return n;
    }
    return write_all(s, static_cast<std::size_t>(n)) ? n : 0;
  }

 private:
  bool drain() {
    const std::size_t n = static_cast<std::size_t>(pptr() - pbase());
    const bool ok = write_all(pbase(), n);
    setp(buf_.data(), buf_.data() + buf_.size());
    return ok;
  }
  bool write_all(const char* p, std::size_t n) {
    if (err_ != 0) return false;
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        err_ = errno;
        return false;
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }

  int fd_;
  std::vector<char> buf_;
  int err_ = 0;
};

// Runs the writer on fd and flushes; throws naming `shown` on a write error.
void write_to_fd(int fd, const fs::path& shown, const std::function<void(std::ostream&)>& write) {
  FdBuf buf(fd);
  std::ostream os(&buf);
  write(os);
  os.flush();
  if (buf.error() != 0) fail(shown, buf.error());
  if (!os) fail(shown, EIO, "the writer's stream failed: ");
}

void write_in_place(const fs::path& path, const std::function<void(std::ostream&)>& write) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) fail(path, errno);
  try {
    write_to_fd(fd, path, write);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail(path, errno);
}

std::string temp_name(const fs::path& target) {
  static std::atomic<unsigned> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}() ^ static_cast<std::uint64_t>(::getpid())};
  // The name stays within NAME_MAX (255) for any target name.
  return fmt::format(".{}.tmp.{}.{}.{:08x}", target.filename().string().substr(0, 200), ::getpid(),
                     counter.fetch_add(1), static_cast<std::uint32_t>(rng()));
}

}  // namespace

void write_file_atomic(const fs::path& requested, const std::function<void(std::ostream&)>& write) {
  if (requested.empty()) throw Error("cannot write a file with an empty name");
  fs::path path = requested;
  struct stat st{};
  bool existed = false;
  if (::stat(requested.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail(requested, EISDIR);
    // /dev/stdout, /dev/null, a FIFO: opened by the name given (the kernel resolves /proc's links).
    // So is /dev/stdout redirected to a file: replacing that file would detach it from the shell's stream.
    const std::string name = requested.string();
    if (!S_ISREG(st.st_mode) || name.starts_with("/dev/") || name.starts_with("/proc/"))
      return write_in_place(requested, write);
    existed = true;
    // Replace the file a symbolic link points to, keeping the link.
    std::error_code ec;
    path = fs::canonical(requested, ec);
    if (ec) fail(requested, ec.value());
  } else if (errno == ENOENT) {
    // A dangling link names the file to create; follow at most 40 links, as the kernel does.
    for (int hops = 0;; ++hops) {
      std::error_code ec;
      if (!fs::is_symlink(fs::symlink_status(path, ec))) break;
      if (hops == 40) fail(requested, ELOOP);
      fs::path t = fs::read_symlink(path, ec);
      if (ec) fail(requested, ec.value(), "reading the symbolic link: ");
      path = t.is_relative() ? path.parent_path() / t : t;
    }
  } else {
    fail(requested, errno);  // ELOOP, EACCES, ENOTDIR, ...
  }

  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  fs::path tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = dir / temp_name(path);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100)) fail(requested, errno);
  }
  const int slot = register_pending(tmp.string());
  auto discard = [&] {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    unregister_pending(slot);
  };
  try {
    // Keep the permissions of the file being replaced (a new file gets 0666 less the umask).
    if (existed && ::fchmod(fd, st.st_mode & 07777) != 0) fail(requested, errno, "setting permissions: ");
    write_to_fd(fd, requested, write);
    if (::fsync(fd) != 0) fail(requested, errno, "fsync: ");
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) fail(requested, errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail(requested, errno, "rename: ");
  } catch (...) {
    discard();
    throw;
  }
  unregister_pending(slot);
  // Make the rename itself durable; a folder that cannot be synced is not an error.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const fs::path& path, std::string_view content) {
  write_file_atomic(path, [content](std::ostream& os) {
    os.write(content.data(), static_cast<std::streamsize>(content.size()));
  });
}

void remove_pending_atomic_files() noexcept {
  for (auto& s : g_pending)
    if (s.state.load() == 2) ::unlink(s.path);
}

}  // namespace cpsched
