#pragma once
// .npy files for the tests of index-mask ingestion, written byte by byte
// (version 1.0 or 2.0 header, padded to 64 bytes) into a folder of this
// test process.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace cpsched::test {

// temp/<tag>_<pid>, created on first use.
inline std::filesystem::path process_temp_dir(const std::string& tag) {
  std::filesystem::path d = std::filesystem::temp_directory_path() / (tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

inline void write_npy(const std::filesystem::path& p, const std::string& descr, bool fortran, const std::string& shape,
                      const void* data, std::size_t bytes, int version = 1) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                     ", 'shape': " + shape + ", }";
  const std::size_t pre = version == 1 ? 10 : 12;
  while ((pre + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::ofstream out(p, std::ios::binary);
  out.write("\x93NUMPY", 6);
  const char ver[2] = {static_cast<char>(version), 0};
  out.write(ver, 2);
  const auto len = static_cast<std::uint32_t>(dict.size());
  const char len_le[4] = {static_cast<char>(len & 0xff), static_cast<char>((len >> 8) & 0xff),
                          static_cast<char>((len >> 16) & 0xff), static_cast<char>((len >> 24) & 0xff)};
  out.write(len_le, version == 1 ? 2 : 4);
  out << dict;
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

// An int32 C-order array of the given shape ("(4, 2, 2)").
inline void write_npy_i4(const std::filesystem::path& p, const std::vector<std::int32_t>& v, const std::string& shape) {
  write_npy(p, "<i4", false, shape, v.data(), v.size() * 4);
}

}  // namespace cpsched::test
