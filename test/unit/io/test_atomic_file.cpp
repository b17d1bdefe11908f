#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "cpsched/io/atomic_file.hpp"
#include "cpsched/base/error.hpp"
#include "test_helpers.hpp"

namespace fs = std::filesystem;
using namespace cpsched;
using test::error_of;

namespace {

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() / ("cpsched_atomic_" + std::to_string(::getpid()) + "_" +
                                       std::to_string(reinterpret_cast<std::uintptr_t>(this)));
    fs::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// Everything in the folder but `keep`: the temporaries a write must not leave behind.
std::size_t others(const fs::path& dir, const fs::path& keep) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != keep.filename()) ++n;
  return n;
}

}  // namespace

TEST_CASE("write_file_atomic writes a new file and replaces an old one whole") {
  TempDir t;
  const fs::path p = t.dir / "plan.json";
  write_file_atomic(p, std::string_view("first"));
  CHECK(slurp(p) == "first");
  write_file_atomic(p, [](std::ostream& os) {
    for (int i = 0; i < 100000; ++i) os << i << ',';  // several buffer lengths
  });
  std::ostringstream expect;
  for (int i = 0; i < 100000; ++i) expect << i << ',';
  CHECK(slurp(p) == expect.str());
  CHECK(others(t.dir, p) == 0);
  // One piece larger than the buffer goes straight to the file.
  const std::string big(1 << 20, 'x');
  write_file_atomic(p, big);
  CHECK(slurp(p) == big);
  write_file_atomic(p, std::string_view());
  CHECK(fs::file_size(p) == 0);
}

TEST_CASE("a failing writer leaves the previous file intact and no temporary") {
  TempDir t;
  const fs::path p = t.dir / "out.svg";
  write_file_atomic(p, std::string_view("previous"));
  CHECK_THROWS_AS(write_file_atomic(p,
                                    [](std::ostream& os) {
                                      os << "partial";
                                      throw Error("solver failed");
                                    }),
                  Error);
  CHECK_THROWS_AS(write_file_atomic(p,
                                    [](std::ostream& os) {
                                      os << "partial";
                                      throw std::bad_alloc();
                                    }),
                  std::bad_alloc);
  // A writer that breaks its stream is a failure too.
  CHECK_THROWS_AS(write_file_atomic(p, [](std::ostream& os) { os.setstate(std::ios::failbit); }), Error);
  CHECK(slurp(p) == "previous");
  CHECK(others(t.dir, p) == 0);
}

TEST_CASE("write errors name the path and the system's reason") {
  TempDir t;
  const fs::path missing = t.dir / "no_such_folder" / "t.svg";
  try {
    write_file_atomic(missing, std::string_view("x"));
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find(missing.string()) != std::string::npos);
    CHECK(m.find("No such file or directory") != std::string::npos);
  }
  CHECK_THROWS_WITH_AS(write_file_atomic(t.dir, std::string_view("x")), doctest::Contains("Is a directory"), Error);
  CHECK_THROWS_AS(write_file_atomic(fs::path(), std::string_view("x")), Error);
  // Disk full: /dev/full fails every write with ENOSPC (written in place: not a regular file).
  if (fs::exists("/dev/full")) {
    CHECK_THROWS_WITH_AS(write_file_atomic("/dev/full", std::string_view("x")),
                         doctest::Contains("No space left on device"), Error);
  }
  // A read-only folder (root ignores permissions: skip there).
  if (::geteuid() != 0) {
    const fs::path ro = t.dir / "ro";
    fs::create_directory(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    CHECK_THROWS_WITH_AS(write_file_atomic(ro / "x", std::string_view("x")), doctest::Contains("Permission denied"),
                         Error);
    fs::permissions(ro, fs::perms::owner_all);
  }
}

TEST_CASE("special files are written in place, links are followed, permissions kept") {
  TempDir t;
  write_file_atomic("/dev/null", std::string_view("discarded"));
  const fs::path real = t.dir / "real.json";
  const fs::path link = t.dir / "link.json";
  write_file_atomic(real, std::string_view("old"));
  fs::permissions(real, fs::perms::owner_read | fs::perms::owner_write);
  fs::create_symlink("real.json", link);
  write_file_atomic(link, std::string_view("new"));
  CHECK(fs::is_symlink(link));
  CHECK(slurp(real) == "new");
  CHECK((fs::status(real).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));
  // A link loop is an error, not a recursion.
  fs::create_symlink("loop_b", t.dir / "loop_a");
  fs::create_symlink("loop_a", t.dir / "loop_b");
  CHECK_THROWS_AS(write_file_atomic(t.dir / "loop_a", std::string_view("x")), Error);
}

TEST_CASE("an interrupted write: the signal handler's cleanup removes the temporary, the target is untouched") {
  TempDir t;
  const fs::path p = t.dir / "plan.json";
  write_file_atomic(p, std::string_view("previous"));
  CHECK_THROWS_AS(write_file_atomic(p,
                                    [&](std::ostream& os) {
                                      os << std::string(1 << 20, 'x');
                                      os.flush();
                                      CHECK(others(t.dir, p) == 1);  // the temporary, beside the target
                                      // What SIGINT / SIGTERM run before the process dies.
                                      remove_pending_atomic_files();
                                      CHECK(others(t.dir, p) == 0);
                                      throw Error("interrupted");
                                    }),
                  Error);
  CHECK(slurp(p) == "previous");
  // Finished writes are no longer pending: the cleanup leaves their files alone.
  write_file_atomic(p, std::string_view("next"));
  remove_pending_atomic_files();
  CHECK(slurp(p) == "next");
}

TEST_CASE("a target name of 255 characters still gets a temporary within the name limit") {
  TempDir t;
  const fs::path p = t.dir / std::string(255, 'n');
  write_file_atomic(p, std::string_view("long"));
  CHECK(slurp(p) == "long");
  CHECK(others(t.dir, p) == 0);
}

TEST_CASE("a batch writes all or nothing (plan -o P.json --svg /dev/full replaced P.json)") {
  TempDir t;
  const fs::path a = t.dir / "a.json", b = t.dir / "b.svg";
  write_file_atomic(a, std::string_view("old a"));
  write_file_atomic(b, std::string_view("old b"));
  SUBCASE("committed: every file replaced, no temporary left") {
    AtomicFileBatch batch;
    write_file_atomic(a, std::string_view("new a"));
    write_file_atomic(b, std::string_view("new b"));
    CHECK(slurp(a) == "old a");  // nothing replaced before commit
    batch.commit();
    CHECK(slurp(a) == "new a");
    CHECK(slurp(b) == "new b");
    CHECK(others(t.dir, a) == 1);  // b only
  }
  SUBCASE("a later output fails: the earlier one is left as it was") {
    {
      AtomicFileBatch batch;
      write_file_atomic(a, std::string_view("new a"));
      CHECK_THROWS_AS(write_file_atomic(t.dir / "missing" / "b.svg", std::string_view("x")), Error);
      if (fs::exists("/dev/full")) CHECK_THROWS_AS(write_file_atomic("/dev/full", std::string_view("x")), Error);
      // no commit: the batch is dropped
    }
    CHECK(slurp(a) == "old a");
    CHECK(others(t.dir, a) == 1);
  }
  SUBCASE("the same target twice in one batch is an error, not a silent overwrite") {
    AtomicFileBatch batch;
    write_file_atomic(a, std::string_view("1"));
    CHECK(error_of([&] { write_file_atomic(t.dir / "." / "a.json", std::string_view("2")); }).find(
              "is written by the same command already") != std::string::npos);
  }
  SUBCASE("a protected input is never written") {
    AtomicFileBatch batch;
    batch.protect({{a, "config"}});
    CHECK(error_of([&] { write_file_atomic(a, std::string_view("x")); }).find("it is the config") != std::string::npos);
  }
}

TEST_CASE("check_output_paths: an output equal to an input or to another output is refused") {
  TempDir t;
  const fs::path cfg = t.dir / "c.yaml", out = t.dir / "p.json";
  write_file_atomic(cfg, std::string_view("problem: {}"));
  CHECK(error_of([&] { check_output_paths({{cfg, "--output"}}, {{cfg, "config"}}); }) ==
        "--output '" + cfg.string() + "' is the config ('" + cfg.string() +
            "'): an output never replaces an input; choose another file");
  // Another spelling, or a link, of the same file.
  CHECK_THROWS_AS(check_output_paths({{t.dir / "sub" / ".." / "c.yaml", "--svg"}}, {{cfg, "config"}}), Error);
  fs::create_symlink(cfg, t.dir / "link.yaml");
  CHECK_THROWS_AS(check_output_paths({{t.dir / "link.yaml", "--svg"}}, {{cfg, "config"}}), Error);
  // Two outputs, one file (neither exists yet).
  CHECK(error_of([&] { check_output_paths({{out, "--output"}, {out, "--svg"}}, {}); }) ==
        "--output '" + out.string() + "' and --svg '" + out.string() + "' name the same file: each output needs its own");
  CHECK_NOTHROW(check_output_paths({{out, "--output"}, {t.dir / "p.svg", "--svg"}}, {{cfg, "config"}}));
  // Character devices may be named twice (both outputs thrown away).
  if (fs::exists("/dev/null")) CHECK_NOTHROW(check_output_paths({{"/dev/null", "--output"}, {"/dev/null", "--svg"}}, {}));
}
