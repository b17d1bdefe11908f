#pragma once
// Input files and folders, opened safely: every path cpsched reads (configs,
// hardware profiles, document-length histograms, .npy index arrays, plugin
// and compare folders) must be a regular file or a folder. A FIFO, socket or
// device would block in open() or read without end, so a file is opened with
// O_NONBLOCK (open never waits for a FIFO's writer) and checked with fstat
// on the descriptor it reads (no check-then-open race), and every read is
// bounded by a size the caller states.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace cpsched {

class InputFile {
 public:
  // Opens `path` for reading; throws cpsched::Error "<path>: ..." naming
  // `what` ("configuration file", ".npy file", ...) when it does not exist,
  // is a folder, is not a regular file (FIFO, socket, device) or cannot be
  // opened.
  InputFile(const std::filesystem::path& path, std::string_view what);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  std::uint64_t size() const { return size_; }  // at open time
  const std::string& name() const { return name_; }
  // Reads up to n bytes (fewer only at the end of the file); throws on an I/O error.
  std::size_t read(void* buf, std::size_t n);
  // Reads exactly n bytes, else throws "<path>: truncated ..." naming `what_part`.
  void read_exact(void* buf, std::size_t n, std::string_view what_part);

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::string name_;
};

// The whole content of a regular file of at most `max_bytes` bytes; throws
// cpsched::Error naming the file and `what` otherwise (also when it grows past
// the bound while being read).
std::string read_input_file(const std::filesystem::path& path, std::uint64_t max_bytes, std::string_view what);

// Throws cpsched::Error "<path>: no such folder" / "not a folder" naming `what`.
void check_input_folder(const std::filesystem::path& path, std::string_view what);

// A description of what `path` is when it is not a regular file ("a FIFO",
// "a folder", "a socket", "a character device", ...), or an empty string
// for a regular file or a path that does not exist.
std::string non_regular_kind(const std::filesystem::path& path);

}  // namespace cpsched
