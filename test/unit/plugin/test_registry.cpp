// The plugin registry (docs/design.md#plugins): discovery, load-time checks, parameter
// resolution, the exception fence and the lifetime of plugin libraries.
#include <dlfcn.h>
#include <elf.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "cpsched/session/session.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/plugin/abi.hpp"
#include "cpsched/plugin/registry.hpp"

namespace fs = std::filesystem;
using namespace cpsched;

namespace {

const AreaCostModel kArea;

const fs::path kPluginDir = CPSCHED_PLUGIN_BUILD_DIR;
const fs::path kTestPluginDir = CPSCHED_TEST_PLUGIN_DIR;

fs::path real_plugin(const std::string& name) { return kPluginDir / ("libcpsched_" + name + ".so"); }
// Test plugins live one per folder; the folder is named after the case.
fs::path test_plugin(const std::string& folder, const std::string& name) {
  return kTestPluginDir / folder / ("libcpsched_test_" + name + ".so");
}
fs::path test_plugin(const std::string& name) { return test_plugin(name, name); }

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The message of the Error that loading `file` into `reg` throws.
std::string load_error(Registry& reg, const fs::path& file) {
  try {
    reg.load(file);
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("loading " << file << " did not throw");
  return {};
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("no cpsched::Error thrown");
  return {};
}

// Causal mask over 64 tokens on 4 ranks, one head group: 10 tasks.
std::shared_ptr<const TaskGrid> tiny_grid() {
  RangeMask mask(64, {Slice{{0, 64}, {0, 64}, MaskType::causal}});
  auto problem = std::make_shared<const Problem>(Problem::make(mask, 4, Heads{2, 1, 8, 2}));
  return std::make_shared<const TaskGrid>(problem);
}

// Is `file` mapped in this process right now? (Does not load it.)
bool is_mapped(const fs::path& file) {
  void* h = ::dlopen(file.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h != nullptr) ::dlclose(h);
  return h != nullptr;
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("the build's plugin folder is found next to the program and holds owner; area and time are built in") {
  CHECK(Registry::default_plugin_dir() == fs::weakly_canonical(kPluginDir));
  Registry reg;
  reg.scan(Registry::default_plugin_dir());
  // Other plugins of the build share the folder; their faults are theirs
  // (the install test demands that every installed plugin loads).
  for (const PluginProblem& p : reg.problems()) {
    const std::string f = p.file.filename().string();
    if (f == "libcpsched_owner.so") FAIL_CHECK(p.message);
  }
  const PluginInfo& area = reg.find(PluginKind::cost_model, "area");
  CHECK(area.built_in);
  CHECK(area.params.empty());
  const PluginInfo& time = reg.find(PluginKind::cost_model, "time");
  CHECK(time.built_in);
  REQUIRE(time.params.size() == 1);
  CHECK(time.params[0].name == "hardware");
  const PluginInfo& owner = reg.find(PluginKind::solver, "owner");
  CHECK(owner.kind == PluginKind::solver);
  CHECK_FALSE(owner.doc.empty());
}

TEST_CASE("owner runs every task on its q block's host") {
  Registry reg;
  reg.load(real_plugin("owner"));
  const auto grid = tiny_grid();
  auto cost = reg.make_cost_model("area", {});
  auto solver = reg.make_solver("owner", {});
  const Solution a_sol = solver->solve(SolveInput(grid, *cost));
  const Assignment& a = a_sol.assignment;
  a.validate();
  CHECK(a.grid == grid);
  CHECK(a_sol.feasible);
  CHECK(a_sol.note.empty());
  REQUIRE(a.rank.size() == static_cast<std::size_t>(grid->num_tasks()));
  for (TaskId t = 0; t < grid->num_tasks(); ++t) CHECK(a.rank[t] == grid->q_host(t));
}

TEST_CASE("area, built in, prices compute as area and transfer as tokens x heads") {
  Registry reg;
  const PluginInfo& info = reg.find(PluginKind::cost_model, "area");
  CHECK(info.built_in);
  CHECK(info.file.empty());
  auto cost = reg.make_cost_model("area", {});
  const auto grid = tiny_grid();
  for (TaskId t = 0; t < grid->num_tasks(); ++t) {
    CHECK(cost->compute(*grid, t) == static_cast<double>(grid->area(t)));
  }
  CHECK(cost->transfer(*grid, RowKind::kv, 100, 3, 0, 1) == 300.0);
  CHECK(cost->transfer(*grid, RowKind::qo, 7, 2, 3, 0) == 14.0);
}

TEST_CASE("each broken plugin is rejected with a message naming its file and its fault") {
  struct Case {
    std::string name;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"bad_abi", {"ABI version 42", "host's 1"}},
      {"bad_signature",
       {"build signature 'gcc-0;libstdc++-cxx11abi0;cpsched-0.0.0'", CPSCHED_BUILD_SIGNATURE}},
      {"small_descriptor", {"descriptor size", "smaller"}},
      {"bad_kind", {"unknown plugin kind 7"}},
      {"bad_name", {"invalid plugin name 'no spaces allowed'"}},
      {"bad_param_type", {"parameter 'mystery' has unknown type 9"}},
      {"bad_default", {"parameter 'count' declares type int but its default 'abc' is not an int"}},
      {"duplicate_param", {"parameter 'count' is declared twice"}},
      {"no_descriptor", {"exports no 'cpsched_plugin_descriptor'"}},
      {"long_doc", {"plugin 'faulty'", "doc is longer than 4096 bytes"}},
      {"huge_num_params", {"declares 1073741824 parameters, more than the 1024"}},
      {"heap_doc", {"doc points outside the plugin's loaded image"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const fs::path file = test_plugin(c.name);
    REQUIRE(fs::exists(file));
    Registry reg;
    const std::string msg = load_error(reg, file);
    CAPTURE(msg);
    CHECK(contains(msg, fs::weakly_canonical(file).string()));
    for (const std::string& part : c.parts) CHECK(contains(msg, part));
    CHECK(reg.plugins().size() == 2);  // the built-in cost models only
  }
}

TEST_CASE("a second plugin of the same kind and name is rejected, naming both files") {
  Registry reg;
  reg.load(real_plugin("owner"));
  const fs::path dup = test_plugin("duplicate_owner");
  const std::string msg = load_error(reg, dup);
  CHECK(contains(msg, fs::weakly_canonical(dup).string()));
  CHECK(contains(msg, fs::weakly_canonical(real_plugin("owner")).string()));
  CHECK(contains(msg, "solver name 'owner' is already taken"));
  // The first one still answers to the name.
  CHECK(reg.find(PluginKind::solver, "owner").file == fs::weakly_canonical(real_plugin("owner")));
  CHECK(reg.plugins().size() == 3);  // with the two built-ins
}

TEST_CASE("a plugin file that claims a built-in's name (a stale `area` of an older build) is refused, naming it") {
  Registry reg;
  const fs::path stale = test_plugin("stale_area");
  const std::string msg = load_error(reg, stale);
  CHECK(contains(msg, fs::weakly_canonical(stale).string()));
  CHECK(contains(msg, "cost_model name 'area' is already taken by a built-in"));
  CHECK(reg.find(PluginKind::cost_model, "area").built_in);
}

TEST_CASE("loading the same file twice, even by another path, registers it once") {
  Registry reg;
  const PluginInfo& first = reg.load(real_plugin("owner"));
  const std::string name = first.name;
  const PluginInfo& again = reg.load(kPluginDir / ".." / "plugins" / "libcpsched_owner.so");
  CHECK(again.name == name);
  CHECK(reg.plugins().size() == 3);  // with the two built-ins
  CHECK(reg.problems().empty());
}

TEST_CASE("a file with a plugin's name that is not a shared object is an error naming it") {
  const fs::path dir = fs::path(CPSCHED_BINARY_DIR) / "test" / "registry_scratch";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path file = dir / "libcpsched_garbage.so";
  std::ofstream(file) << std::string(256, 'x');  // long enough for an ELF header
  std::ofstream(dir / "libcpsched_empty.so").flush();
  // Not named like a plugin: scan leaves it alone.
  std::ofstream(dir / "libgarbage.so") << std::string(256, 'x');
  std::ofstream(dir / "cpsched_garbage.so.txt") << std::string(256, 'x');
  Registry reg;
  const std::string msg = load_error(reg, file);
  CAPTURE(msg);
  CHECK(contains(msg, fs::weakly_canonical(file).string()));
  CHECK(contains(msg, "invalid ELF header"));
  CHECK(contains(load_error(reg, dir / "libcpsched_empty.so"), "only 0 bytes"));
  reg.scan(dir);
  REQUIRE(reg.problems().size() == 2);
  CHECK(reg.problems()[0].file == dir / "libcpsched_empty.so");
  CHECK(reg.problems()[1].file == file);
  fs::remove_all(dir);
}

namespace {

// A scratch folder holding `name`: the bytes of `from`, cut to `keep` bytes
// and with `patch` applied (offset, byte).
fs::path damaged_copy(const std::string& folder, const std::string& name, const fs::path& from, std::size_t keep,
                      std::vector<std::pair<std::size_t, unsigned char>> patch = {}) {
  const fs::path dir = fs::path(CPSCHED_BINARY_DIR) / "test" / "registry_scratch" / folder;
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream in(from, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 4096);
  if (keep < bytes.size()) bytes.resize(keep);
  for (const auto& [at, b] : patch) bytes.at(at) = static_cast<char>(b);
  const fs::path file = dir / name;
  std::ofstream(file, std::ios::binary) << bytes;
  return file;
}

}  // namespace

TEST_CASE("a truncated copy of a real plugin is an error naming it, not a crash") {
  // The first 4 KiB of a real plugin: a valid ELF header whose segments lie
  // beyond the end of the file. dlopen would map them and die of SIGBUS.
  const fs::path file = damaged_copy("truncated", "libcpsched_owner.so", real_plugin("owner"), 4096);
  Registry reg;
  const std::string msg = load_error(reg, file);
  CAPTURE(msg);
  CHECK(contains(msg, fs::weakly_canonical(file).string()));
  CHECK(contains(msg, "is truncated or damaged"));
  CHECK(contains(msg, "beyond its size of 4096 bytes"));
  // A scan reports it and goes on; asking for the plugin it should have
  // provided gives that file's fault first.
  reg.scan(file.parent_path());
  reg.scan(kTestPluginDir / "good");
  REQUIRE(reg.problems().size() == 1);
  CHECK(reg.problems()[0].file == file);
  CHECK(reg.find(PluginKind::solver, "test_params").name == "test_params");
  const std::string missing = error_of([&] { reg.find(PluginKind::solver, "owner"); });
  CAPTURE(missing);
  CHECK(missing.rfind("solver plugin 'owner' did not load: plugin file '" + fs::weakly_canonical(file).string(), 0) == 0);
  CHECK(contains(missing, "no solver plugin named 'owner'"));
  fs::remove_all(file.parent_path());
}

TEST_CASE("a Session whose solver's file is damaged fails with that file's fault") {
  const fs::path file = damaged_copy("named", "libcpsched_owner.so", real_plugin("owner"), 4096);
  auto reg = std::make_shared<Registry>();
  reg->scan(file.parent_path());
  SessionOptions o;
  o.solver = "owner";
  const std::string msg = error_of([&] { Session s(o, reg); });
  CAPTURE(msg);
  CHECK(msg.rfind("solver plugin 'owner' did not load: plugin file '" + fs::weakly_canonical(file).string(), 0) == 0);
  CHECK(contains(msg, "is truncated or damaged"));
  fs::remove_all(file.parent_path());
}

TEST_CASE("an ELF file of another class or machine is rejected before it is loaded") {
  const fs::path wrong_class =
      damaged_copy("wrong_class", "libcpsched_owner.so", real_plugin("owner"), SIZE_MAX, {{EI_CLASS, ELFCLASS32}});
  Registry reg;
  std::string msg = load_error(reg, wrong_class);
  CAPTURE(msg);
  CHECK(contains(msg, "is a 32-bit ELF file; this host loads 64-bit plugins"));
  // e_machine is the 16-bit field at byte 18: 0xBEEF is no machine we run on.
  const fs::path wrong_machine =
      damaged_copy("wrong_machine", "libcpsched_owner.so", real_plugin("owner"), SIZE_MAX, {{18, 0xEF}, {19, 0xBE}});
  msg = load_error(reg, wrong_machine);
  CHECK(contains(msg, "is built for ELF machine 48879"));
  CHECK_FALSE(is_mapped(wrong_machine));
  fs::remove_all(wrong_class.parent_path());
  fs::remove_all(wrong_machine.parent_path());
}

TEST_CASE("a shared object without a descriptor is rejected before its initialisers run") {
  ::unsetenv("CPSCHED_TEST_NO_DESCRIPTOR_INITIALISED");
  const fs::path file = test_plugin("no_descriptor");
  Registry reg;
  CHECK(contains(load_error(reg, file), "exports no 'cpsched_plugin_descriptor'"));
  CHECK(std::getenv("CPSCHED_TEST_NO_DESCRIPTOR_INITIALISED") == nullptr);
  CHECK_FALSE(is_mapped(fs::weakly_canonical(file)));
}

TEST_CASE("a FIFO with a plugin's name is reported, not waited on") {
  const fs::path dir = fs::path(CPSCHED_BINARY_DIR) / "test" / "registry_scratch" / "fifo";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path fifo = dir / "libcpsched_fifo.so";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  Registry reg;
  reg.scan(dir);
  REQUIRE(reg.problems().size() == 1);
  CHECK(contains(reg.problems()[0].message, "not a regular file"));
  fs::remove_all(dir);
}

TEST_CASE("a PluginInfo reference stays valid while more plugins load") {
  Registry reg;
  const PluginInfo& owner = reg.load(real_plugin("owner"));
  for (const char* folder : {"good", "throwing_factory"}) reg.scan(kTestPluginDir / folder);
  CHECK(owner.name == "owner");
  CHECK(&reg.find(PluginKind::solver, "owner") == &owner);
  CHECK(reg.plugins().size() == 6);  // the two built-in cost models, owner and three test plugins
}

TEST_CASE("a missing file is an error naming it") {
  Registry reg;
  const std::string msg = load_error(reg, kTestPluginDir / "nowhere" / "libnothing.so");
  CHECK(contains(msg, "libnothing.so"));
  CHECK(contains(msg, "no such file"));
}

TEST_CASE("scan keeps the good plugins and records every failure as a problem") {
  Registry reg;
  reg.scan(kPluginDir);
  const std::vector<std::string> broken = {"bad_abi",   "bad_signature",  "small_descriptor",
                                           "bad_kind",  "bad_name",       "bad_param_type",
                                           "bad_default", "duplicate_param", "no_descriptor",
                                           "long_doc",  "huge_num_params", "heap_doc",
                                           "duplicate_owner"};
  for (const std::string& b : broken) reg.scan(kTestPluginDir / b);
  reg.scan(kTestPluginDir / "good");
  reg.scan(kTestPluginDir / "no_such_folder");

  REQUIRE(reg.problems().size() == broken.size() + 1);
  for (std::size_t i = 0; i < broken.size(); ++i) {
    const PluginProblem& p = reg.problems()[i];
    CAPTURE(p.message);
    CHECK(p.file == kTestPluginDir / broken[i] / ("libcpsched_test_" + broken[i] + ".so"));
    CHECK(contains(p.message, fs::weakly_canonical(p.file).string()));
  }
  CHECK(contains(reg.problems().back().message, "no_such_folder"));
  CHECK(reg.find(PluginKind::solver, "test_params").params.size() == 8);
  CHECK(reg.find(PluginKind::executor, "test_echo").kind == PluginKind::executor);
  CHECK(reg.find(PluginKind::solver, "owner").file == fs::weakly_canonical(real_plugin("owner")));
}

TEST_CASE("find lists the known plugins of the kind and the rejected files") {
  Registry reg;
  reg.load(real_plugin("owner"));
  reg.scan(kTestPluginDir / "bad_abi");
  const std::string msg = error_of([&] { reg.find(PluginKind::solver, "nope"); });
  CHECK(contains(msg, "no solver plugin named 'nope'"));
  CHECK(contains(msg, "known solver plugins: owner"));
  CHECK(contains(msg, "ABI version 42"));
  CHECK(contains(error_of([&] { reg.find(PluginKind::cost_model, "owner"); }),
                 "known cost_model plugins: area, time"));
}

TEST_CASE("the parameter schema is read with types, defaults and docs") {
  Registry reg;
  const PluginInfo& info = reg.load(test_plugin("good", "params"));
  CHECK(info.name == "test_params");
  REQUIRE(info.params.size() == 8);
  const auto& p = info.params;
  CHECK(p[0].name == "flag");
  CHECK(p[0].type == ParamType::boolean);
  CHECK(p[0].default_value == ParamValue{false});
  CHECK(p[1].default_value == ParamValue{true});
  CHECK(p[2].type == ParamType::integer);
  CHECK(p[2].default_value == ParamValue{std::int64_t{3}});
  CHECK(p[3].default_value == ParamValue{std::int64_t{-2}});
  CHECK(p[4].type == ParamType::real);
  CHECK(p[4].default_value == ParamValue{0.5});
  CHECK(p[5].default_value == ParamValue{1000.0});
  CHECK(p[6].type == ParamType::string);
  CHECK(p[6].default_value == ParamValue{std::string("hello")});
  CHECK(p[7].default_value == ParamValue{std::string("two words")});
  CHECK(p[4].doc == "a real");
}

TEST_CASE("resolve_params overlays the given values on the defaults and checks them") {
  Registry reg;
  const PluginInfo& info = reg.load(test_plugin("good", "params"));

  SUBCASE("defaults") {
    const Params r = reg.resolve_params(info, {});
    CHECK(r.values().size() == 8);
    CHECK(r.get_bool("flag") == false);
    CHECK(r.get_int("count") == 3);
    CHECK(r.get_real("scale") == 1000.0);
    CHECK(r.get_string("mode") == "two words");
  }
  SUBCASE("overrides, an integer accepted for a real") {
    Params given;
    given.set("count", std::int64_t{5});
    given.set("ratio", std::int64_t{2});
    given.set("label", std::string("x"));
    given.set("flag", true);
    const Params r = reg.resolve_params(info, given);
    CHECK(r.get_int("count") == 5);
    CHECK(r.values().at("ratio") == ParamValue{2.0});
    CHECK(r.get_string("label") == "x");
    CHECK(r.get_bool("flag"));
    CHECK(r.get_int("offset") == -2);
  }
  SUBCASE("an unknown parameter lists the known ones with types and defaults") {
    Params given;
    given.set("nope", 1.0);
    const std::string msg = error_of([&] { reg.resolve_params(info, given); });
    CHECK(contains(msg, "solver 'test_params' has no parameter 'nope'"));
    CHECK(contains(msg, "flag (bool, default false)"));
    CHECK(contains(msg, "count (int, default 3)"));
    CHECK(contains(msg, "ratio (real, default 0.5)"));
    CHECK(contains(msg, "scale (real, default 1000.0)"));
    CHECK(contains(msg, "label (string, default \"hello\")"));
  }
  SUBCASE("a wrong type names the parameter, the expected type and the value") {
    Params given;
    given.set("ratio", std::string("fast"));
    std::string msg = error_of([&] { reg.resolve_params(info, given); });
    CHECK(contains(msg, "parameter 'ratio' of solver 'test_params' expects real, got string \"fast\""));
    given = Params{};
    given.set("count", 2.5);
    msg = error_of([&] { reg.resolve_params(info, given); });
    CHECK(contains(msg, "parameter 'count' of solver 'test_params' expects int, got real 2.5"));
    given = Params{};
    given.set("flag", std::int64_t{1});
    msg = error_of([&] { reg.resolve_params(info, given); });
    CHECK(contains(msg, "parameter 'flag' of solver 'test_params' expects bool, got int 1"));
  }
  SUBCASE("a plugin without parameters says so") {
    const PluginInfo& owner = reg.load(real_plugin("owner"));
    Params given;
    given.set("mu", 1.1);
    CHECK(contains(error_of([&] { reg.resolve_params(owner, given); }), "takes no parameters"));
  }
}

TEST_CASE("the factory receives the resolved parameters") {
  Registry reg;
  reg.load(test_plugin("good", "params"));
  const auto grid = tiny_grid();
  const int P = grid->cp_size();

  auto defaults = reg.make_solver("test_params", {});
  const Solution a_sol = defaults->solve(SolveInput(grid, kArea));
  const Assignment& a = a_sol.assignment;
  CHECK(a_sol.note ==
        "flag=false verbose=true count=3 offset=-2 ratio=0.5 scale=1000.0 label=hello mode=two words");
  for (TaskId t = 0; t < grid->num_tasks(); ++t) CHECK(a.rank[t] == ((t * 3 - 2) % P + P) % P);

  Params given;
  given.set("count", std::int64_t{1});
  given.set("offset", std::int64_t{0});
  given.set("ratio", std::int64_t{4});
  auto custom = reg.make_solver("test_params", given);
  const Solution b_sol = custom->solve(SolveInput(grid, kArea));
  const Assignment& b = b_sol.assignment;
  CHECK(contains(b_sol.note, "count=1 offset=0 ratio=4.0"));
  for (TaskId t = 0; t < grid->num_tasks(); ++t) CHECK(b.rank[t] == t % P);

  // make_* checks what it is given like resolve_params does.
  Params bad;
  bad.set("nope", true);
  CHECK(contains(error_of([&] { reg.make_solver("test_params", bad); }), "no parameter 'nope'"));
}

TEST_CASE("exceptions stop at the plugin boundary and come back as cpsched::Error") {
  Registry reg;
  SUBCASE("a throwing factory") {
    const PluginInfo& info = reg.load(test_plugin("throwing_factory"));
    const std::string file = info.file.string();
    const std::string msg = error_of([&] { reg.make_solver("throwing_factory", {}); });
    CHECK(msg == "plugin 'throwing_factory' (" + file +
                     "): refusing to start: test of the exception fence");
  }
  SUBCASE("a throwing solve") {
    reg.load(test_plugin("good", "params"));
    Params given;
    given.set("label", std::string("fail"));
    auto solver = reg.make_solver("test_params", given);
    const auto grid = tiny_grid();
    const std::string msg = error_of([&] { solver->solve(SolveInput(grid, kArea)); });
    CHECK(contains(msg, "plugin 'test_params' ("));
    CHECK(contains(msg, "asked to fail by label=fail"));
  }
  SUBCASE("a throwing execute") {
    reg.load(test_plugin("good", "echo"));
    Params given;
    given.set("fail", true);
    auto exec = reg.make_executor("test_echo", given);
    ExecuteInput in;
    in.grid = tiny_grid();
    CHECK(contains(error_of([&] { exec->execute(in); }), "asked to fail by fail=true"));
  }
}

TEST_CASE("an executor plugin runs through its host-side handle") {
  Registry reg;
  reg.load(test_plugin("good", "echo"));
  Params given;
  given.set("text", std::string("hi"));
  auto exec = reg.make_executor("test_echo", given);
  ExecuteInput in;
  in.grid = tiny_grid();
  const ExecutionReport r = exec->execute(in);
  CHECK(r.text == "hi");
  REQUIRE(r.figures.entries().size() == 1);
  CHECK(r.figures.entries()[0].first == "tasks");
  CHECK(r.figures.entries()[0].second == static_cast<double>(in.grid->num_tasks()));
}

TEST_CASE("an object keeps its plugin library loaded after the registry is gone") {
  const fs::path file = fs::weakly_canonical(test_plugin("good", "params"));
  REQUIRE_FALSE(is_mapped(file));
  std::unique_ptr<Solver> solver;
  {
    Registry reg;
    reg.load(file);
    Params given;
    given.set("count", std::int64_t{1});
    given.set("offset", std::int64_t{1});
    solver = reg.make_solver("test_params", given);
  }
  CHECK(is_mapped(file));
  const auto grid = tiny_grid();
  const Solution a_sol = solver->solve(SolveInput(grid, kArea));
  const Assignment& a = a_sol.assignment;
  for (TaskId t = 0; t < grid->num_tasks(); ++t) CHECK(a.rank[t] == (t + 1) % grid->cp_size());
  solver.reset();
  // The last holder gone, the library is unloaded (test_params is built
  // without STB_GNU_UNIQUE symbols, so dlclose can unmap it).
  CHECK_FALSE(is_mapped(file));
}

TEST_CASE("a rejected plugin file is unloaded again") {
  const fs::path file = fs::weakly_canonical(test_plugin("bad_default"));
  Registry reg;
  load_error(reg, file);
  CHECK_FALSE(is_mapped(file));
}

TEST_CASE("CPSCHED_PLUGIN_PATH names plugin folders, colon separated") {
  {
    ScopedEnv env("CPSCHED_PLUGIN_PATH", "");
    CHECK(Registry::env_plugin_dirs().empty());
  }
  const fs::path good = kTestPluginDir / "good";
  const fs::path fault = kTestPluginDir / "bad_kind";
  ScopedEnv env("CPSCHED_PLUGIN_PATH", good.string() + "::" + fault.string() + ":");
  const std::vector<fs::path> dirs = Registry::env_plugin_dirs();
  REQUIRE(dirs.size() == 2);
  CHECK(dirs[0] == good);
  CHECK(dirs[1] == fault);
  Registry reg;
  for (const fs::path& d : dirs) reg.scan(d);
  CHECK(reg.find(PluginKind::solver, "test_params").file.parent_path() == fs::weakly_canonical(good));
  REQUIRE(reg.problems().size() == 1);
  CHECK(contains(reg.problems()[0].message, "unknown plugin kind 7"));
}
