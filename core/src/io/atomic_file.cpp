#include "cpsched/io/atomic_file.hpp"

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fmt/format.h>
#include <optional>
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
std::array<PendingSlot, 256> g_pending;

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

// A temporary written, flushed and closed, waiting for its rename.
struct Staged {
  fs::path requested;  // as the caller named it (messages)
  fs::path target;     // the file to replace (links followed)
  fs::path tmp;
  int slot = -1;
};

void sync_dir(const fs::path& dir) {
  // Make a rename durable; a folder that cannot be synced is not an error.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

fs::path dir_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

// Writes `write` into a new temporary beside the target; returns it staged,
// or nothing when the target is written in place (devices, FIFOs).
std::optional<Staged> stage(const fs::path& requested, const std::function<void(std::ostream&)>& write) {
  if (requested.empty()) throw Error("cannot write a file with an empty name");
  fs::path path = requested;
  struct stat st{};
  bool existed = false;
  if (::stat(requested.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail(requested, EISDIR);
    // /dev/stdout, /dev/null, a FIFO: opened by the name given (the kernel resolves /proc's links).
    // So is /dev/stdout redirected to a file: replacing that file would detach it from the shell's stream.
    const std::string name = requested.string();
    if (!S_ISREG(st.st_mode) || name.starts_with("/dev/") || name.starts_with("/proc/")) {
      write_in_place(requested, write);
      return std::nullopt;
    }
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

  const fs::path dir = dir_of(path);
  fs::path tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = dir / temp_name(path);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100)) fail(requested, errno);
  }
  const int slot = register_pending(tmp.string());
  try {
    // Keep the permissions of the file being replaced (a new file gets 0666 less the umask).
    if (existed && ::fchmod(fd, st.st_mode & 07777) != 0) fail(requested, errno, "setting permissions: ");
    write_to_fd(fd, requested, write);
    if (::fsync(fd) != 0) fail(requested, errno, "fsync: ");
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) fail(requested, errno);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    unregister_pending(slot);
    throw;
  }
  return Staged{requested, path, tmp, slot};
}

void discard(const Staged& s) noexcept {
  ::unlink(s.tmp.c_str());
  unregister_pending(s.slot);
}

void commit_staged(const Staged& s) {
  if (::rename(s.tmp.c_str(), s.target.c_str()) != 0) {
    const int err = errno;
    discard(s);
    fail(s.requested, err, "rename: ");
  }
  unregister_pending(s.slot);
  sync_dir(dir_of(s.target));
}

// The batch this thread writes into (AtomicFileBatch), if any.
thread_local AtomicFileBatch* t_batch = nullptr;

// The file a path names, for comparing outputs with inputs and each other:
// the same inode when it exists, else its absolute normal form.
struct FileId {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  fs::path normal;
  bool device = false;  // a character device (/dev/null, /dev/stdout): may be named twice
};

FileId file_id(const fs::path& p) {
  FileId id;
  std::error_code ec;
  id.normal = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) id.normal = fs::absolute(p, ec).lexically_normal();
  struct stat st{};
  if (::stat(p.c_str(), &st) == 0) {
    id.exists = true;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
    id.device = S_ISCHR(st.st_mode);
  }
  return id;
}

bool same_file(const FileId& a, const FileId& b) {
  if (a.exists && b.exists) return a.dev == b.dev && a.ino == b.ino;
  return a.normal == b.normal;
}

}  // namespace

struct AtomicFileBatch::Impl {
  std::vector<Staged> staged;
  std::vector<std::pair<FileId, fs::path>> targets;  // every output of the batch, in-place ones too
  std::vector<std::pair<FileId, std::pair<fs::path, std::string>>> inputs;  // protect()
  bool committed = false;
};

void AtomicFileBatch::protect(const std::vector<std::pair<fs::path, std::string>>& inputs) {
  for (const auto& in : inputs) impl_->inputs.emplace_back(file_id(in.first), in);
}

AtomicFileBatch::AtomicFileBatch() : impl_(std::make_unique<Impl>()), outer_(t_batch) { t_batch = this; }

AtomicFileBatch::~AtomicFileBatch() {
  if (!impl_->committed)
    for (const Staged& s : impl_->staged) discard(s);
  t_batch = outer_;
}

void AtomicFileBatch::commit() {
  if (impl_->committed) return;
  impl_->committed = true;
  t_batch = outer_;
  // Every temporary is complete and synced: the renames cannot run out of
  // space. A rename that fails (the folder vanished) stops here; the
  // temporaries after it are removed, the files before it already replaced.
  for (std::size_t i = 0; i < impl_->staged.size(); ++i) {
    try {
      commit_staged(impl_->staged[i]);
    } catch (...) {
      for (std::size_t j = i + 1; j < impl_->staged.size(); ++j) discard(impl_->staged[j]);
      throw;
    }
  }
}

void check_output_paths(const std::vector<std::pair<fs::path, std::string>>& outputs,
                        const std::vector<std::pair<fs::path, std::string>>& inputs) {
  std::vector<std::pair<FileId, const std::pair<fs::path, std::string>*>> seen;
  std::vector<FileId> in_ids;
  for (const auto& in : inputs) in_ids.push_back(file_id(in.first));
  for (const auto& out : outputs) {
    if (out.first.empty()) throw Error(fmt::format("{}: an empty file name", out.second));
    const FileId id = file_id(out.first);
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (same_file(id, in_ids[i]) && !id.device)
        throw Error(fmt::format("{} '{}' is the {} ('{}'): an output never replaces an input; choose another file",
                                out.second, out.first.string(), inputs[i].second, inputs[i].first.string()));
    for (const auto& [other, o] : seen)
      if (same_file(id, other) && !id.device)
        throw Error(fmt::format("{} '{}' and {} '{}' name the same file: each output needs its own", o->second,
                                o->first.string(), out.second, out.first.string()));
    seen.emplace_back(id, &out);
  }
}

void write_file_atomic(const fs::path& requested, const std::function<void(std::ostream&)>& write) {
  AtomicFileBatch* batch = t_batch;
  if (batch != nullptr) {
    // One target once per batch: a second write would silently replace the first.
    const FileId id = file_id(requested);
    for (const auto& [other, name] : batch->impl_->targets)
      if (same_file(id, other) && !id.device)
        throw Error(fmt::format("cannot write '{}': '{}' is written by the same command already", requested.string(),
                                name.string()));
    for (const auto& [other, in] : batch->impl_->inputs)
      if (same_file(id, other) && !id.device)
        throw Error(fmt::format("cannot write '{}': it is the {} ('{}'), an input of this command", requested.string(),
                                in.second, in.first.string()));
    batch->impl_->targets.emplace_back(id, requested);
    if (auto s = stage(requested, write)) batch->impl_->staged.push_back(std::move(*s));
    return;
  }
  if (auto s = stage(requested, write)) commit_staged(*s);
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
