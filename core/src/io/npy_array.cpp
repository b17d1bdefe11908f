// load_index_npy (npy_array.hpp). The header's dictionary is parsed with
// xtensor's .npy reader; the magic, header length, dtype, sizes and data are
// checked and read here, so that every failure names the file and what is
// wrong (xtensor would read a truncated file's missing bytes as garbage and
// allocate whatever size a header claims before reading).
#include "cpsched/io/npy_array.hpp"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#ifndef CPSCHED_NO_XTENSOR
// GCC 12's -Wmaybe-uninitialized misfires inside <regex> (which xnpy.hpp
// uses) under optimisation with sanitizers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <xtensor/xnpy.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

#include "cpsched/base/error.hpp"

namespace cpsched {

#ifndef CPSCHED_NO_XTENSOR
namespace {

std::string shape_string(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string index_string(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shape_string(idx);
}

// "int32", "big-endian float64", "bool", ... for a typestring like "<i4".
std::string describe_dtype(const std::string& t) {
  if (t.size() < 3) return "unknown";
  std::string kind;
  switch (t[1]) {
    case 'i': kind = "int"; break;
    case 'u': kind = "uint"; break;
    case 'f': kind = "float"; break;
    case 'c': kind = "complex"; break;
    case 'b': return "bool";
    case 'U': return "unicode string";
    case 'S': return "byte string";
    case 'O': return "Python object";
    default: return "unknown";
  }
  int bytes = 0;
  for (std::size_t i = 2; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i) bytes = bytes * 10 + (t[i] - '0');
  const std::string name = kind + std::to_string(bytes * 8);
  return t[0] == '>' ? "big-endian " + name : name;
}

// The 'descr' value of a header dictionary, without quotes; empty when absent.
std::string find_descr(const std::string& header) {
  const auto key = header.find("'descr'");
  if (key == std::string::npos) return {};
  const auto a = header.find('\'', header.find(':', key) + 1);
  if (a == std::string::npos) return {};
  const auto b = header.find('\'', a + 1);
  return b == std::string::npos ? std::string() : header.substr(a + 1, b - a - 1);
}

std::uint32_t le(const unsigned char* p, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace
#endif

bool npy_supported() {
#ifdef CPSCHED_NO_XTENSOR
  return false;
#else
  return true;
#endif
}

IndexArray load_index_npy(const std::filesystem::path& path) {
  const std::string src = path.string();
#ifdef CPSCHED_NO_XTENSOR
  throw Error(src + ": cpsched was built without xtensor-dev, so it cannot read .npy files (tools/install_deps.sh "
                    "installs it; then re-run cmake)");
#else
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error(src + ": no such file");
  if (std::filesystem::is_directory(path, ec)) throw Error(src + ": is a directory, not an .npy file");
  const std::uintmax_t file_size = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (!in || ec) throw Error(src + ": cannot open the file for reading");

  // Magic "\x93NUMPY", version, header length (2 bytes in v1, 4 in v2/v3).
  unsigned char pre[12] = {};
  in.read(reinterpret_cast<char*>(pre), 8);
  if (in.gcount() < 8 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    throw Error(src + ": not an .npy file (it does not start with \\x93NUMPY)");
  const int major = pre[6];
  if (major < 1 || major > 3) throw Error(fmt::format("{}: .npy format version {}.{} is not supported (1 to 3 are)", src, major, pre[7]));
  const int len_bytes = major == 1 ? 2 : 4;
  in.read(reinterpret_cast<char*>(pre + 8), len_bytes);
  if (in.gcount() < len_bytes) throw Error(src + ": truncated .npy header");
  const std::uint64_t header_len = le(pre + 8, len_bytes);
  const std::uint64_t offset = 8 + static_cast<std::uint64_t>(len_bytes) + header_len;
  if (offset > file_size)
    throw Error(fmt::format("{}: truncated .npy header ({} bytes announced, the file has {} bytes)", src, header_len, file_size));
  std::string header(static_cast<std::size_t>(header_len), '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  if (static_cast<std::uint64_t>(in.gcount()) != header_len) throw Error(src + ": truncated .npy header");

  const std::string descr = find_descr(header);
  if (descr.empty()) throw Error(src + ": not an .npy file (its header has no 'descr')");
  const bool is32 = descr == "<i4", is64 = descr == "<i8";
  if (!is32 && !is64)
    throw Error(fmt::format("{}: dtype '{}' ({}) is not accepted; index arrays are int32 or int64, little-endian ('<i4' "
                            "or '<i8')",
                            src, descr, describe_dtype(descr)));
  std::string dummy_descr;
  bool fortran = false;
  std::vector<std::size_t> dims;
  try {
    if (header.empty() || header.back() != '\n') throw std::runtime_error("invalid header");
    xt::detail::parse_header(header, dummy_descr, &fortran, dims);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: not an .npy file (bad header: {})", src, e.what()));
  }
  std::vector<std::int64_t> shape;
  std::uint64_t count = 1;
  for (std::size_t d : dims) {
    if (d > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()) ||
        (d > 0 && count > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / 8 / d))
      throw Error(fmt::format("{}: shape dimension {} is too large", src, d));
    shape.push_back(static_cast<std::int64_t>(d));
    count *= d;
  }
  if (shape.empty() || shape.size() > 3)
    throw Error(fmt::format("{}: shape {} has {} dimensions; index arrays have 1 to 3", src, shape_string(shape), shape.size()));
  if (fortran && shape.size() > 1)
    throw Error(src + ": Fortran order is not accepted; save the array in C order (numpy.ascontiguousarray)");
  const std::uint64_t word = is32 ? 4 : 8;
  const std::uint64_t need = count * word;
  if (file_size - offset < need)
    throw Error(fmt::format("{}: truncated: shape {} of {} needs {} bytes of data, the file has {}", src,
                            shape_string(shape), is32 ? "int32" : "int64", need, file_size - offset));

  static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");
  auto buf = std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(count));
  auto short_read = [&] { return Error(src + ": truncated: the file ended while reading its data"); };
  if (is32) {
    in.read(reinterpret_cast<char*>(buf->data()), static_cast<std::streamsize>(need));
    if (static_cast<std::uint64_t>(in.gcount()) != need) throw short_read();
  } else {
    // Narrow in chunks: no second full-size buffer.
    std::vector<std::int64_t> chunk(std::size_t{1} << 20);
    for (std::uint64_t at = 0; at < count;) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk.size(), count - at);
      in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(n * 8));
      if (static_cast<std::uint64_t>(in.gcount()) != n * 8) throw short_read();
      for (std::uint64_t x = 0; x < n; ++x) {
        const std::int64_t v = chunk[x];
        if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
          throw Error(fmt::format("{}: entry {} = {} does not fit int32", src,
                                  index_string(static_cast<std::int64_t>(at + x), shape), v));
        (*buf)[at + x] = static_cast<std::int32_t>(v);
      }
      at += n;
    }
  }
  return IndexArray::own(std::move(buf), std::move(shape), src);
#endif
}

}  // namespace cpsched
