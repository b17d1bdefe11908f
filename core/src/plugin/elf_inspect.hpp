#pragma once
// Internal: what the registry checks about a plugin file before and after
// dlopen, so that a damaged or foreign file is an error naming it, never a
// crash, and no unrelated library's initialisers run.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace cpsched::detail {

// Before dlopen, with bounded reads of the file (never mapped): a regular
// file; an ELF shared object of the host's class, byte order and machine;
// program headers, loadable segments and section headers inside the file;
// `symbol` defined in its dynamic symbol table. Throws cpsched::Error
// "<where>: <fault>".
void inspect_plugin_file(const std::filesystem::path& file, const std::string& where,
                         std::string_view symbol);

// The address ranges one loaded library occupies (its PT_LOAD segments as
// mapped), so that pointers it hands out can be checked before they are read.
class LoadedImage {
 public:
  // `handle`: what dlopen returned for the library. Empty when unknown.
  static LoadedImage of(void* handle);

  // Bytes readable from `p` to the end of the segment holding it (0: p is
  // outside the library).
  std::size_t room(const void* p) const;
  bool holds(const void* p, std::size_t n) const { return room(p) >= n; }
  // `p` lies in an executable segment of the library.
  bool holds_code(const void* p) const;
  bool empty() const { return spans_.empty(); }

 private:
  struct Span {
    std::uintptr_t begin = 0, end = 0;
    bool read = false, exec = false;
  };
  std::vector<Span> spans_;
};

}  // namespace cpsched::detail
