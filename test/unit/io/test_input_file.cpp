// Input paths (docs/hardening.md, "The rules the code keeps"): a FIFO given as an .npy file hung forever in open.
// Every input (config, hardware profile, histogram, .npy, plugin folder) is
// a regular file (or folder), opened without blocking and read with a bound;
// a FIFO, device or folder is an error naming the path, at once.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "cpsched/base/error.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/io/input_file.hpp"
#include "cpsched/io/npy_array.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/hardware/profile.hpp"
#include "npy_files.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

fs::path dir() {
  static const fs::path d = test::process_temp_dir("cpsched_input_file");
  return d;
}

// A FIFO nobody writes to: opening it for reading the usual way blocks forever.
fs::path fifo(const std::string& name) {
  const fs::path p = dir() / name;
  fs::remove(p);
  REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
  return p;
}

// The error of f, which must come at once (not after a hang).
std::string quick_error(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of(f);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  return e;
}

}  // namespace

TEST_CASE("a FIFO is refused by every reader, at once and naming the path") {
  const fs::path npy = fifo("x.npy");
  CHECK(quick_error([&] { load_index_npy(npy); }) ==
        npy.string() + ": not a regular file (it is a FIFO); a .npy file must be a regular file");
  const fs::path yaml = fifo("c.yaml");
  CHECK(contains(quick_error([&] { load_config(yaml); }), yaml.string() + ": not a regular file (it is a FIFO)"));
  const fs::path csv = fifo("h.csv");
  CHECK(contains(quick_error([&] { DocHistogram::load_csv(csv); }), csv.string() + ": not a regular file (it is a FIFO)"));
  const fs::path hw = fifo("hw.yaml");
  CHECK(contains(quick_error([&] { load_hardware_profile(hw); }), hw.string() + ": not a regular file (it is a FIFO)"));
  // Through a config: the mask's key names the file.
  const fs::path cfg = dir() / "fifo_mask.yaml";
  std::ofstream(cfg) << "problem:\n  cp_size: 2\n  seqlen_per_rank: 8\n  heads: {q: 2, kv: 1, dim: 8}\n"
                        "  mask: {kind: topk, indices: x.npy}\n";
  const std::string e = quick_error([&] { load_config(cfg); });
  CHECK(contains(e, "problem.mask.indices: " + npy.string() + ": not a regular file (it is a FIFO)"));
  const fs::path cfg2 = dir() / "fifo_hist.yaml";
  std::ofstream(cfg2) << "problem:\n  cp_size: 2\n  seqlen_per_rank: 8\n  heads: {q: 2, kv: 1, dim: 8}\n"
                         "  mask: {kind: causal_document, histogram: h.csv}\n";
  CHECK(contains(quick_error([&] { load_config(cfg2); }), "problem.mask.histogram: " + csv.string() + ": not a regular file"));
}

TEST_CASE("folders and devices are refused as files; missing files named") {
  CHECK(error_of([] { load_index_npy(dir()); }) == dir().string() + ": is a folder, not a .npy file");
  if (fs::exists("/dev/null"))
    CHECK(error_of([] { load_index_npy("/dev/null"); }) ==
          "/dev/null: not a regular file (it is a character device); a .npy file must be a regular file");
  CHECK(error_of([] { load_config(dir() / "none.yaml"); }) == (dir() / "none.yaml").string() + ": no such file");
  CHECK(contains(error_of([] { check_input_folder(dir() / "nothere", "plugin folder"); }), "no such folder"));
  const fs::path file = dir() / "plain.txt";
  std::ofstream(file) << "x";
  CHECK(contains(error_of([&] { check_input_folder(file, "plugin folder"); }), "is a file, not a folder"));
  CHECK_NOTHROW(check_input_folder(dir(), "plugin folder"));
}

TEST_CASE("read_input_file reads a regular file whole, within its bound") {
  const fs::path f = dir() / "ten.txt";
  std::ofstream(f) << "0123456789";
  CHECK(read_input_file(f, 10, "text") == "0123456789");
  CHECK(contains(error_of([&] { read_input_file(f, 9, "text"); }), "ten.txt: the text has 10 bytes (at most 9)"));
  const fs::path empty = dir() / "empty.txt";
  std::ofstream{empty};
  CHECK(read_input_file(empty, 10, "text").empty());
  // Larger than one read chunk.
  const fs::path big = dir() / "big.txt";
  std::ofstream(big) << std::string(200000, 'z');
  CHECK(read_input_file(big, 1 << 20, "text").size() == 200000);
}

TEST_CASE("a config's plugin folders must exist") {
  const std::string yaml = "problem: {cp_size: 2, seqlen_per_rank: 8, heads: {q: 2, kv: 1, dim: 8}, mask: {kind: causal}}\n"
                           "plugin_paths: [" + dir().string() + ", " + (dir() / "missing").string() + "]\n";
  const std::string e = error_of([&] { parse_config(yaml, "p.yaml"); });
  CHECK(contains(e, "p.yaml:2:"));
  CHECK(contains(e, "plugin_paths[1]: " + (dir() / "missing").string() + ": no such folder"));
}
