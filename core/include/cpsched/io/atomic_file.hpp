#pragma once
// Atomic file output: the content goes to a temporary file in the target's
// folder, which is flushed, fsync'd, checked and then renamed over the target.
// Readers see the previous file or the complete new one, never a torn one; on
// any failure (a write error, a full disk, an exception from the writer,
// bad_alloc) the temporary is removed, the previous file is left intact and a
// cpsched::Error names the path and the system's reason.
//
// A target that exists and is not a regular file (/dev/null, a FIFO), or is
// under /dev or /proc (/dev/stdout), cannot be replaced by a rename: it is
// written in place, still checked.
// A symbolic link is followed: the file it points to is replaced, the link kept.
#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cpsched {

// Calls `write` with a stream on the temporary file, then commits it. An
// exception from `write` is rethrown after the temporary is removed.
void write_file_atomic(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);

// Whole-content form.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

// All or nothing for the outputs of one command: while a batch is alive on
// this thread, write_file_atomic writes each file's temporary completely
// (flushed, fsync'd, closed) but does not rename it; commit() renames them
// all, and a batch destroyed without commit() (an error, an exception, a
// failed check) removes them, leaving every target as it was. A target
// written in place (a device or FIFO: /dev/stdout, /dev/full) cannot wait:
// it is written when asked, so name such targets last. Writing one target
// twice in a batch is an error. Batches nest (the inner one commits into
// nothing: it renames its own files).
class AtomicFileBatch {
 public:
  AtomicFileBatch();
  ~AtomicFileBatch();
  AtomicFileBatch(const AtomicFileBatch&) = delete;
  AtomicFileBatch& operator=(const AtomicFileBatch&) = delete;
  // Files this batch may not write (a command's inputs): such a write throws
  // cpsched::Error naming both.
  void protect(const std::vector<std::pair<std::filesystem::path, std::string>>& inputs);
  void commit();

 private:
  friend void write_file_atomic(const std::filesystem::path&, const std::function<void(std::ostream&)>&);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  AtomicFileBatch* outer_;
};

// Refuses, before anything is computed, outputs that would replace an input
// or each other: throws cpsched::Error naming both when an output names the
// same file as an input (through any spelling: links, "./", "..") or as an
// earlier output. Character devices (/dev/null, /dev/stdout) may be named
// more than once. Each pair is (path, what it is: "--svg", "the config").
void check_output_paths(const std::vector<std::pair<std::filesystem::path, std::string>>& outputs,
                        const std::vector<std::pair<std::filesystem::path, std::string>>& inputs);

// Removes the temporaries of writes still in progress. Async-signal-safe: a
// SIGINT/SIGTERM handler calls it before the process dies, so an interrupted
// command leaves neither a torn target nor a stray temporary.
void remove_pending_atomic_files() noexcept;

}  // namespace cpsched
