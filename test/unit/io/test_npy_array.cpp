// load_index_npy: int32 / int64 round trips and every error (the file named,
// what is wrong said). Files are written by hand into a temporary folder.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/io/npy_array.hpp"
#include "npy_files.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  static const fs::path dir = test::process_temp_dir("cpsched_npy_test");
  return dir;
}

// A .npy file in the test's folder.
fs::path write_npy(const std::string& name, const std::string& descr, bool fortran, const std::string& shape,
                   const void* data, std::size_t bytes, int version = 1) {
  const fs::path p = temp_dir() / name;
  test::write_npy(p, descr, fortran, shape, data, bytes, version);
  return p;
}

}  // namespace

TEST_CASE("load_index_npy: int32 and int64 round trips") {
  if (!npy_supported()) return;  // built without xtensor-dev: load_index_npy says so (checked below)
  std::vector<std::int32_t> a(2 * 3 * 4);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::int32_t>(i) - 1;
  const fs::path p32 = write_npy("a32.npy", "<i4", false, "(2, 3, 4)", a.data(), a.size() * 4);
  const IndexArray x = load_index_npy(p32);
  CHECK(x.shape == std::vector<std::int64_t>{2, 3, 4});
  CHECK(std::vector<std::int32_t>(x.span().begin(), x.span().end()) == a);
  CHECK(x.source == p32.string());
  CHECK(x.owner != nullptr);

  std::vector<std::int64_t> b{0, -1, 5, 2147483647, -7};
  const fs::path p64 = write_npy("a64.npy", "<i8", false, "(5,)", b.data(), b.size() * 8, 2);
  const IndexArray y = load_index_npy(p64);
  CHECK(y.shape == std::vector<std::int64_t>{5});
  CHECK(std::vector<std::int32_t>(y.span().begin(), y.span().end()) == std::vector<std::int32_t>{0, -1, 5, 2147483647, -7});
  // 1-D arrays are the same in either order.
  CHECK(load_index_npy(write_npy("f1.npy", "<i8", true, "(5,)", b.data(), b.size() * 8)).size() == 5);
  b[3] = std::int64_t{1} << 33;
  const fs::path big = write_npy("big.npy", "<i8", false, "(1, 5)", b.data(), b.size() * 8);
  CHECK(error_of([&] { load_index_npy(big); }) == big.string() + ": entry [0, 3] = 8589934592 does not fit int32");
}

TEST_CASE("load_index_npy: errors name the file and the fault") {
  if (!npy_supported()) {
    CHECK(error_of([] { load_index_npy("x.npy"); }).find("built without xtensor-dev") != std::string::npos);
    return;
  }
  std::vector<std::int32_t> a(12, 1);
  const fs::path missing = temp_dir() / "missing.npy";
  CHECK(error_of([&] { load_index_npy(missing); }) == missing.string() + ": no such file");

  const fs::path text = temp_dir() / "text.npy";
  std::ofstream(text) << "hello, not numpy";
  CHECK(error_of([&] { load_index_npy(text); }) == text.string() + ": not an .npy file (it does not start with \\x93NUMPY)");

  const fs::path f4 = write_npy("f4.npy", "<f4", false, "(12,)", a.data(), 48);
  CHECK(error_of([&] { load_index_npy(f4); }) ==
        f4.string() + ": dtype '<f4' (float32) is not accepted; index arrays are int32 or int64, little-endian ('<i4' or '<i8')");
  const fs::path be = write_npy("be.npy", ">i4", false, "(12,)", a.data(), 48);
  CHECK(error_of([&] { load_index_npy(be); }) ==
        be.string() + ": dtype '>i4' (big-endian int32) is not accepted; index arrays are int32 or int64, little-endian ('<i4' or '<i8')");
  const fs::path u2 = write_npy("u2.npy", "<u2", false, "(12,)", a.data(), 24);
  CHECK(error_of([&] { load_index_npy(u2); }).find("dtype '<u2' (uint16) is not accepted") != std::string::npos);

  const fs::path fo = write_npy("fortran.npy", "<i4", true, "(3, 4)", a.data(), 48);
  CHECK(error_of([&] { load_index_npy(fo); }) ==
        fo.string() + ": Fortran order is not accepted; save the array in C order (numpy.ascontiguousarray)");

  const fs::path tr = write_npy("trunc.npy", "<i4", false, "(4, 4)", a.data(), 48);
  CHECK(error_of([&] { load_index_npy(tr); }) ==
        tr.string() + ": truncated: shape [4, 4] of int32 needs 64 bytes of data, the file has 48");

  const fs::path r0 = write_npy("scalar.npy", "<i4", false, "()", a.data(), 4);
  CHECK(error_of([&] { load_index_npy(r0); }) == r0.string() + ": shape [] has 0 dimensions; index arrays have 1 to 3");
  const fs::path r4 = write_npy("rank4.npy", "<i4", false, "(1, 2, 2, 3)", a.data(), 48);
  CHECK(error_of([&] { load_index_npy(r4); }) == r4.string() + ": shape [1, 2, 2, 3] has 4 dimensions; index arrays have 1 to 3");

  // A header cut short: the announced length runs past the end of the file.
  const fs::path hdr = temp_dir() / "hdr.npy";
  {
    std::ofstream out(hdr, std::ios::binary);
    out.write("\x93NUMPY\x01\x00\x76\x00{'descr'", 17);
  }
  CHECK(error_of([&] { load_index_npy(hdr); }) ==
        hdr.string() + ": truncated .npy header (118 bytes announced, the file has 17 bytes)");
}

TEST_CASE("load_index_npy: the header is NumPy's dict literal, strictly") {
  std::vector<std::int32_t> a(16 * 1024, 0);
  // ("a", 1, 16) was read as shape 0; (1024.0, 1, 16) was accepted.
  const fs::path str = write_npy("shape_str.npy", "<i4", false, "(\"a\", 1, 16)", a.data(), a.size() * 4);
  CHECK(error_of([&] { load_index_npy(str); }).rfind(
            str.string() + ": not an .npy file (bad header: 'shape': dimensions are non-negative integers, got '\"a\", 1, 16)",
            0) == 0);
  const fs::path flt = write_npy("shape_float.npy", "<i4", false, "(1024.0, 1, 16)", a.data(), a.size() * 4);
  CHECK(error_of([&] { load_index_npy(flt); }).find("'shape': dimensions are non-negative integers, got '1024.0, 1") !=
        std::string::npos);
  const fs::path neg = write_npy("shape_neg.npy", "<i4", false, "(-4, 4)", a.data(), 64);
  CHECK(error_of([&] { load_index_npy(neg); }).find("dimensions are non-negative integers") != std::string::npos);
  const fs::path nocomma = write_npy("shape_nocomma.npy", "<i4", false, "(16)", a.data(), 64);
  CHECK(error_of([&] { load_index_npy(nocomma); }).find("a one-dimensional shape is written (n,)") != std::string::npos);
  // The data must fill the file exactly: a wrong shape in the header is not read as a prefix.
  const fs::path longer = write_npy("longer.npy", "<i4", false, "(4, 4)", a.data(), 80);
  CHECK(error_of([&] { load_index_npy(longer); }) ==
        longer.string() + ": shape [4, 4] of int32 needs 64 bytes of data, but the file has 80 (a wrong shape in the "
                          "header?)");
  // Keys: each once, nothing else.
  const fs::path extra = temp_dir() / "extra_key.npy";
  {
    std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), 'x': 1, }";
    while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
    dict += '\n';
    std::ofstream out(extra, std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    const char len[2] = {static_cast<char>(dict.size()), 0};
    out.write(len, 2);
    out << dict;
    out.write(reinterpret_cast<const char*>(a.data()), 16);
  }
  CHECK(error_of([&] { load_index_npy(extra); }).find("unknown key 'x'") != std::string::npos);
  // Still read: any spacing, keys in any order, a trailing comma, the tuple's own trailing comma.
  const fs::path ok = temp_dir() / "spacing.npy";
  {
    std::string dict = "{ \"shape\" : ( 2 ,4 , ) ,'fortran_order':False,'descr':'<i4'}";
    while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
    dict += '\n';
    std::ofstream out(ok, std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    const char len[2] = {static_cast<char>(dict.size()), 0};
    out.write(len, 2);
    out << dict;
    out.write(reinterpret_cast<const char*>(a.data()), 32);
  }
  CHECK(load_index_npy(ok).shape == std::vector<std::int64_t>{2, 4});
}
