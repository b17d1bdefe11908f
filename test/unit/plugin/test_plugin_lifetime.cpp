// Plugin lifetimes through the Session API: a plan kept after its
// Session, and with it the Registry and every plugin library, are gone must
// still be usable and releasable. Grids made inside a plugin (balanced_bytes
// re-grids, static dispatches) are the objects at risk.
#include <dlfcn.h>
#include <elf.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "cpsched/plan/builder.hpp"
#include "cpsched/session/session.hpp"
#include "cpsched/base/error.hpp"

namespace fs = std::filesystem;
using namespace cpsched;

namespace {

const fs::path kPluginDir = CPSCHED_PLUGIN_BUILD_DIR;
const fs::path kTestPluginDir = CPSCHED_TEST_PLUGIN_DIR;

const std::vector<std::string> kSolvers = {"owner", "usp", "static", "binary_greedy", "balanced_bytes", "ilp"};

// The copy of `solver` built without STB_GNU_UNIQUE symbols (test/plugins), so
// that dlclose unmaps it: a release after the unload then really crashes.
fs::path unloadable_copy(const std::string& solver) {
  return kTestPluginDir / "lifetime" / solver / ("libcpsched_test_life_" + solver + ".so");
}

bool is_mapped(const fs::path& file) {
  void* h = ::dlopen(file.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h != nullptr) ::dlclose(h);
  return h != nullptr;
}

struct Case {
  std::string what;
  GridOptions grid;
  Heads heads;
  int cp_size;
  RangeMask mask;
};

// usp needs flattened head groups; the one-cell case makes balanced_bytes
// re-grid with finer blocks (a Problem made inside the plugin).
std::vector<Case> cases_for(const std::string& solver) {
  std::vector<Case> cases;
  cases.push_back({"causal over 256 tokens on 4 ranks", {true, 2}, Heads{8, 4, 16, 2}, 4,
                   RangeMask(256, {Slice{{0, 256}, {0, 256}, MaskType::causal}})});
  if (solver != "usp") {
    cases.push_back({"one full cell carrying all the load", {false, 1}, Heads{4, 2, 8, 2}, 2,
                     RangeMask(64, {Slice{{32, 64}, {0, 32}, MaskType::full}})});
  }
  return cases;
}

// What a plan holds, copied out so it can be compared after the Session is gone.
struct Kept {
  std::shared_ptr<const Assignment> assignment;
  std::shared_ptr<const Plan> plan;
  std::vector<Rank> rank;
  std::int64_t tasks = 0;
  std::int64_t blocks = 0;
  bool own_grid = false;  // the solver returned a grid other than the input's
  bool feasible = false;
};

// Solves `c` with `solver` in a Session whose Registry holds only `files`
// (and the built-in cost models), then destroys the Session and the Registry.
Kept solve_and_drop(const std::string& solver, const std::vector<fs::path>& files, const Case& c) {
  Kept k;
  auto reg = std::make_shared<Registry>();
  for (const fs::path& f : files) reg->load(f);
  SessionOptions o;
  o.layout = Layout::planned;  // static (and balanced_bytes' static members) may dispatch
  o.cp_size = c.cp_size;
  o.heads = c.heads;
  o.grid = c.grid;
  o.solver = solver;
  o.cache_size = 4;
  {
    Session s(o, std::move(reg));
    const SolveResult& r = s.solve(c.mask);
    k.assignment = r.assignment;
    k.plan = r.plan;
    k.rank = r.assignment->rank;
    k.feasible = r.feasible;
    k.tasks = r.assignment->grid->num_tasks();
    k.blocks = r.assignment->grid->sharding().num_blocks();
    const Sharding asked = Sharding::sequential(c.mask.seqlen(), c.cp_size, c.grid.blocks_per_rank);
    const Sharding& got = r.assignment->grid->sharding();
    k.own_grid = got.blocks != asked.blocks || got.host != asked.host;
  }
  return k;
}

// The kept assignment is intact and releasing it (and the plan) is safe.
void use_and_release(Kept& k) {
  REQUIRE(k.assignment);
  k.assignment->validate();
  CHECK(k.assignment->grid->num_tasks() == k.tasks);
  CHECK(k.assignment->grid->sharding().num_blocks() == k.blocks);
  CHECK(k.assignment->rank == k.rank);
  // The problem can escape the grid and outlive it.
  std::shared_ptr<const Problem> problem = k.assignment->grid->problem_ptr();
  const Metrics m = compute_metrics(*k.assignment);
  CHECK(m.imbalance >= 1.0);
  k.plan.reset();
  k.assignment.reset();
  CHECK(problem->cp_size() > 0);
  problem.reset();
}

}  // namespace

TEST_CASE("a plan outlives its Session and every plugin, for every solver") {
  int tried = 0;
  for (const std::string& solver : kSolvers) {
    const fs::path real = kPluginDir / ("libcpsched_" + solver + ".so");
    if (!fs::exists(real)) {
      MESSAGE("solver '" << solver << "' is not built; skipped");
      continue;
    }
    for (const Case& c : cases_for(solver)) {
      CAPTURE(solver);
      CAPTURE(c.what);
      Kept k = solve_and_drop(solver, {real}, c);
      use_and_release(k);
      ++tried;
    }
  }
  CHECK(tried >= 9);
}

TEST_CASE("a plugin library stays mapped while a grid it made is alive, and no longer") {
  bool saw_own_grid = false;
  for (const std::string& solver : kSolvers) {
    const fs::path copy = fs::weakly_canonical(unloadable_copy(solver));
    if (!fs::exists(copy)) continue;
    for (const Case& c : cases_for(solver)) {
      CAPTURE(solver);
      CAPTURE(c.what);
      REQUIRE_FALSE(is_mapped(copy));
      Kept k = solve_and_drop(solver, {copy}, c);
      saw_own_grid = saw_own_grid || k.own_grid;
      // Before the fix, releasing a plugin-made grid here jumped into the
      // unmapped library (SIGSEGV).
      use_and_release(k);
      // Whether core wrapped the plugin's grid or re-made it, nothing holds
      // the library once the plan is gone.
      CHECK_FALSE(is_mapped(copy));
    }
  }
  CHECK(saw_own_grid);
}

TEST_CASE("a grid a plugin made against the input's problem keeps its library loaded") {
  const fs::path copy = fs::weakly_canonical(unloadable_copy("static"));
  REQUIRE(fs::exists(copy));
  const Case c = cases_for("static").front();
  Kept k = solve_and_drop("static", {copy}, c);
  REQUIRE(k.own_grid);  // static dispatches its own blocks
  CHECK(is_mapped(copy));
  use_and_release(k);
  CHECK_FALSE(is_mapped(copy));
}

TEST_CASE("a grid with a problem the plugin made is re-made by core, equal to the plugin's") {
  const fs::path copy = fs::weakly_canonical(unloadable_copy("balanced_bytes"));
  if (!fs::exists(copy)) return;
  const Case c = cases_for("balanced_bytes").back();
  Kept k = solve_and_drop("balanced_bytes", {copy}, c);
  REQUIRE(k.own_grid);  // finer blocks than asked for
  CHECK(k.assignment->grid->problem().grid.blocks_per_rank > 1);
  // Nothing of the plugin is held: its library is already gone.
  CHECK_FALSE(is_mapped(copy));
  CHECK(k.feasible);
  use_and_release(k);
}

namespace {

// Whether the ELF shared object has a PT_TLS segment (thread-local storage).
bool has_tls(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  Elf64_Ehdr eh{};
  in.read(reinterpret_cast<char*>(&eh), sizeof eh);
  REQUIRE(in.good());
  REQUIRE(eh.e_ident[EI_CLASS] == ELFCLASS64);
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    in.seekg(static_cast<std::streamoff>(eh.e_phoff + static_cast<std::uint64_t>(i) * eh.e_phentsize));
    in.read(reinterpret_cast<char*>(&ph), sizeof ph);
    REQUIRE(in.good());
    if (ph.p_type == PT_TLS) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("no bundled plugin has thread-local storage") {
  // A plugin's TLS blocks stay in every thread that touched them after the
  // plugin is unloaded: LeakSanitizer then scans freed memory and crashes
  // (binary_greedy's thread pool once kept its nesting depth there), and
  // glibc keeps such a library mapped when it has TLS destructors.
  int seen = 0;
  for (const auto& e : fs::directory_iterator(kPluginDir)) {
    if (e.path().extension() != ".so") continue;
    CAPTURE(e.path().string());
    CHECK_FALSE(has_tls(e.path()));
    ++seen;
  }
  CHECK(seen >= 6);
}
