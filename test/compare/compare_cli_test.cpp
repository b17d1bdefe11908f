// `cpsched compare` as a user runs it, in child processes: the report folder
// lock (a second run into the same folder refuses, naming it), atomic report
// files (a write that fails leaves the previous file and exits non-zero), and
// the errors of the hardware axis keys.
#include <doctest/doctest.h>

#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;

namespace {

// A small sweep (well under a second) of the quick config.
const std::vector<std::string> kSmall = {"--set", "compare.masks=[causal_document]", "--set", "compare.cp_sizes=[2, 4]",
                                         "--set", "compare.packs=1",  "--set", "compare.heads=[{q: 16, kv: 4}]",
                                         "--set", "compare.stages=[1]", "--set", "compare.repeats=1"};

std::vector<std::string> compare_args(const fs::path& out, const std::vector<std::string>& extra = kSmall) {
  std::vector<std::string> a = {CPSCHED_EXE, "compare", COMPARE_QUICK_CONFIG, "--out", out.string()};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

struct Child {
  pid_t pid = -1;
  int out_fd = -1;  // the child's stdout, when piped
  int err_fd = -1;  // the child's stderr, when piped
};

// fork + exec; stdout and stderr piped (or to /dev/null). `file_limit`:
// RLIMIT_FSIZE of the child in bytes (0: unchanged), with SIGXFSZ ignored so
// that a write past it fails with EFBIG like a full disk instead of killing.
Child spawn(const std::vector<std::string>& args, bool pipe_out, long file_limit = 0) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (pipe_out) REQUIRE(::pipe(out) == 0);
  REQUIRE(::pipe(err) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(pipe_out ? out[1] : null, 1);
    ::dup2(err[1], 2);
    if (file_limit > 0) {
      ::signal(SIGXFSZ, SIG_IGN);
      const rlimit lim{static_cast<rlim_t>(file_limit), static_cast<rlim_t>(file_limit)};
      ::setrlimit(RLIMIT_FSIZE, &lim);
    }
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  Child c;
  c.pid = pid;
  if (pipe_out) {
    ::close(out[1]);
    c.out_fd = out[0];
  }
  ::close(err[1]);
  c.err_fd = err[0];
  return c;
}

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) s.append(buf, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(fd);
  return s;
}

// Reads up to and including the first newline.
std::string read_line(int fd) {
  std::string s;
  char c = 0;
  while (::read(fd, &c, 1) == 1) {
    s += c;
    if (c == '\n') break;
  }
  return s;
}

int wait_exit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct Result {
  int rc = -1;
  std::string err;
};

Result run(const std::vector<std::string>& args, long file_limit = 0) {
  Child c = spawn(args, false, file_limit);
  Result r;
  r.err = read_all(c.err_fd);
  r.rc = wait_exit(c.pid);
  return r;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> t;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) t.push_back(e.path().filename().string());
  return t;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::path(COMPARE_TEST_DIR) / name;
  fs::remove_all(d);
  return d;
}

}  // namespace

TEST_CASE("a second compare into a folder another compare is writing refuses, naming the folder") {
  const fs::path dir = fresh_dir("lock_report");
  // The first run prints its header once it holds the lock; it is stopped
  // there so that the second surely overlaps it.
  Child first = spawn(compare_args(dir), true);
  const std::string header = read_line(first.out_fd);
  REQUIRE_MESSAGE(header.rfind("compare ", 0) == 0, "first run printed: " << header);
  REQUIRE(::kill(first.pid, SIGSTOP) == 0);
  {
    // The lock is really held: this process cannot take it either.
    const int fd = ::open((dir / ".cpsched-compare.lock").c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    CHECK(::flock(fd, LOCK_EX | LOCK_NB) != 0);
    ::close(fd);
  }

  const Result second = run(compare_args(dir));
  CHECK(second.rc == 1);
  CHECK_MESSAGE(second.err.find(dir.string() + ": another `cpsched compare` is writing this report folder") !=
                    std::string::npos,
                second.err);
  CHECK(second.err.find(".cpsched-compare.lock") != std::string::npos);

  REQUIRE(::kill(first.pid, SIGCONT) == 0);
  read_all(first.out_fd);
  const std::string first_err = read_all(first.err_fd);
  CHECK_MESSAGE(wait_exit(first.pid) == 0, first_err);
  CHECK(fs::is_regular_file(dir / "results.csv"));
  CHECK(fs::is_regular_file(dir / "index.html"));

  // Released on exit: the next run goes through.
  const Result third = run(compare_args(dir));
  CHECK_MESSAGE(third.rc == 0, third.err);
  CHECK(temporaries(dir).empty());
}

TEST_CASE("a report file that cannot be written leaves the previous one and exits non-zero") {
  const fs::path dir = fresh_dir("atomic_report");
  const Result ok = run(compare_args(dir));
  REQUIRE_MESSAGE(ok.rc == 0, ok.err);
  const std::string csv = read_text(dir / "results.csv");
  const std::string md = read_text(dir / "results.md");
  REQUIRE(csv.size() > 2048);

  // Files may not grow past 2 KiB: writing results.csv fails half-way (EFBIG).
  const Result failed = run(compare_args(dir), 2048);
  CHECK(failed.rc == 1);
  CHECK_MESSAGE(failed.err.find((dir / "results.csv").string()) != std::string::npos, failed.err);
  CHECK(read_text(dir / "results.csv") == csv);  // byte for byte the previous report
  CHECK(read_text(dir / "results.md") == md);
  CHECK(temporaries(dir).empty());
}

TEST_CASE("hardware axis keys: one of compare.hardware and compare.timing.hardware, known profiles") {
  const fs::path dir = fresh_dir("hardware_errors");
  std::vector<std::string> both = kSmall;
  both.insert(both.end(), {"--set", "compare.timing={executor: sim, hardware: h100_8x_nvlink}"});
  Result r = run(compare_args(dir, both));
  CHECK(r.rc == 1);
  CHECK_MESSAGE(r.err.find("compare.hardware and compare.timing.hardware both give the hardware") != std::string::npos,
                r.err);

  std::vector<std::string> unknown = kSmall;
  unknown.insert(unknown.end(), {"--set", "compare.hardware=[h100_8x_nvlink, no_such_gpu]"});
  r = run(compare_args(dir, unknown));
  CHECK(r.rc == 1);
  CHECK_MESSAGE(r.err.find("--set compare.hardware: compare.hardware: unknown hardware profile 'no_such_gpu'") !=
                    std::string::npos,
                r.err);

  std::vector<std::string> twice = kSmall;
  twice.insert(twice.end(), {"--set", "compare.hardware=[cluster_8gpu_ib, cluster_8gpu_ib]"});
  r = run(compare_args(dir, twice));
  CHECK(r.rc == 1);
  CHECK_MESSAGE(r.err.find("'cluster_8gpu_ib' is listed twice") != std::string::npos, r.err);

  // Nothing would use the profiles: timing off and the `area` cost model.
  std::vector<std::string> unused = kSmall;
  unused.insert(unused.end(), {"--set", "compare.timing=none"});
  r = run(compare_args(dir, unused));
  CHECK(r.rc == 1);
  CHECK_MESSAGE(r.err.find("compare.hardware: has no effect: compare.timing is none") != std::string::npos, r.err);

  // A profile file: a relative path is relative to the config's folder (this
  // test runs elsewhere); rows carry it as given, chart names its stem.
  std::vector<std::string> path = kSmall;
  path.insert(path.end(), {"--set", "compare.hardware=[h100_8x_nvlink, hardware/cluster_8gpu_ib.yaml]"});
  REQUIRE(!fs::exists(fs::current_path() / "hardware/cluster_8gpu_ib.yaml"));
  r = run(compare_args(dir, path));
  CHECK_MESSAGE(r.rc == 0, r.err);
  CHECK(read_text(dir / "results.csv").find(",hardware/cluster_8gpu_ib.yaml,") != std::string::npos);
  CHECK(fs::is_regular_file(dir / "causal_document_step_time_cluster_8gpu_ib.svg"));

  // The one-profile form still works, a single name stands for a list of
  // one, and without either the config's top-level `hardware:` is the axis.
  for (const std::string& set : {std::string("compare.timing={executor: sim, hardware: cluster_8gpu_ib}"),
                                 std::string("compare.hardware=cluster_8gpu_ib"), std::string("hardware=cluster_8gpu_ib")}) {
    CAPTURE(set);
    std::vector<std::string> one = kSmall;
    one.insert(one.end(), {"--set", "compare.hardware=null", "--set", set});
    r = run(compare_args(dir, one));
    CHECK_MESSAGE(r.rc == 0, r.err);
    const std::string csv = read_text(dir / "results.csv");
    CHECK(csv.find(",cluster_8gpu_ib,") != std::string::npos);
    CHECK(csv.find(",h100_8x_nvlink,") == std::string::npos);
  }
}

namespace {

// step_ms of every row of a report's results.csv, keyed by its first 10
// columns (row kind, mask, P, heads, stages, hardware, solver, pack).
std::map<std::string, std::string> steps(const fs::path& dir) {
  std::istringstream in(read_text(dir / "results.csv"));
  std::string line;
  std::getline(in, line);
  std::vector<std::string> head;
  for (std::istringstream h(line); std::getline(h, line, ',');) head.push_back(line);
  const auto col = static_cast<std::size_t>(std::find(head.begin(), head.end(), "step_ms") - head.begin());
  REQUIRE(col < head.size());
  std::map<std::string, std::string> out;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    for (std::istringstream l(line); std::getline(l, line, ',');) f.push_back(line);
    if (f.size() <= col) continue;
    std::string key;
    for (std::size_t i = 0; i < 10; ++i) key += f[i] + ",";
    out[key] = f[col];
  }
  return out;
}

}  // namespace

TEST_CASE("plan.relay reaches the compared plans: relays on change the step of a placement spanning two nodes") {
  // P = 16 on 8-GPU nodes: owner's plan sends blocks to several ranks of the
  // other node, which relays turn into one NIC crossing each.
  const std::vector<std::string> sets = {"--set", "compare.solvers=[owner]",        "--set", "compare.masks=[causal]",
                                         "--set", "compare.cp_sizes=[16]",          "--set", "compare.heads=[{q: 16, kv: 4}]",
                                         "--set", "compare.stages=[1]",             "--set", "compare.repeats=1",
                                         "--set", "compare.hardware=[cluster_8gpu_ib]"};
  const fs::path off = fresh_dir("relay_off"), on = fresh_dir("relay_on");
  std::vector<std::string> with = sets;
  with.insert(with.end(), {"--set", "plan.relay=on"});
  const Result a = run(compare_args(off, sets)), b = run(compare_args(on, with));
  REQUIRE_MESSAGE(a.rc == 0, a.err);
  REQUIRE_MESSAGE(b.rc == 0, b.err);
  const auto x = steps(off), y = steps(on);
  REQUIRE(x.size() == 2);  // the pack's row and the mean's
  for (const auto& [key, step] : x) {
    CAPTURE(key);
    REQUIRE(y.count(key) == 1);
    CHECK(std::stod(y.at(key)) < 0.9 * std::stod(step));
  }
}
