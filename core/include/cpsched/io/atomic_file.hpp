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
#include <ostream>
#include <string_view>

namespace cpsched {

// Calls `write` with a stream on the temporary file, then commits it. An
// exception from `write` is rethrown after the temporary is removed.
void write_file_atomic(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);

// Whole-content form.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

// Removes the temporaries of writes still in progress. Async-signal-safe: a
// SIGINT/SIGTERM handler calls it before the process dies, so an interrupted
// command leaves neither a torn target nor a stray temporary.
void remove_pending_atomic_files() noexcept;

}  // namespace cpsched
