// Fuzz target: the .npy reader (cpsched::load_index_npy) on any bytes.
//
// Input: the whole file. It is written to a scratch file of this process and
// loaded. A bad file must end in cpsched::Error (naming the file); anything
// else (a crash, a sanitizer report, another exception, an allocation the
// file's size does not back) is a finding. A file that loads must hold what
// its header says: 1 to 3 dimensions whose product is the element count,
// every element read from the file (int64 narrowed only when it fits).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "cpsched/base/error.hpp"
#include "cpsched/io/npy_array.hpp"
#include "fuzz_input.hpp"

namespace {

const std::filesystem::path& scratch() {
  static const std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("cpsched_fuzz_npy_" + std::to_string(::getpid()) + ".npy");
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  {
    std::ofstream out(scratch(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const cpsched::IndexArray a = cpsched::load_index_npy(scratch());
    if (a.shape.empty() || a.shape.size() > 3) cpsched::fuzz::broken();
    std::int64_t n = 1;
    for (std::int64_t d : a.shape) {
      if (d < 0) cpsched::fuzz::broken();
      n *= d;
    }
    if (n != a.size() || a.source != scratch().string()) cpsched::fuzz::broken();
    // The data came from the file: at least 4 bytes per element after the header.
    if (static_cast<std::uint64_t>(n) * 4 > size) cpsched::fuzz::broken();
    volatile std::int64_t sum = 0;
    for (std::int32_t v : a.span()) sum = sum + v;  // every element readable
  } catch (const cpsched::Error& e) {
    // What a bad file must give; it names the file.
    if (std::string(e.what()).rfind(scratch().string(), 0) != 0) cpsched::fuzz::broken();
  }
  return 0;
}
