// Configuration: parsing, located errors (file:line:column: key.path), all
// errors at once, `--set` overrides, and plugin selections.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include "cpsched/config/config.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/plugin/registry.hpp"
#include "npy_files.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;

namespace {


std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config(yaml, "t.yaml", overrides); });
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::size_t b = 0;
  for (;;) {
    const std::size_t e = s.find('\n', b);
    out.push_back(s.substr(b, e - b));
    if (e == std::string::npos) return out;
    b = e + 1;
  }
}

bool has_line(const std::string& msg, const std::string& line) {
  const auto ls = lines_of(msg);
  return std::find(ls.begin(), ls.end(), line) != ls.end();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::filesystem::path source_dir() { return CPSCHED_SOURCE_DIR; }

// A small, complete config with explicit documents (S = 4 * 16 = 64).
const char* kSmall = R"(problem:
  cp_size: 4
  seqlen_per_rank: 16
  heads: {q: 8, kv: 2, dim: 64, dtype: fp16}
  grid: {flatten_head_groups: false, blocks_per_rank: 2}
  mask: {kind: causal_document, lengths: [30, 20, 14]}
solver:
  name: test_params
  params:
    test_params: {flag: true, count: 5, ratio: 2, label: "7", mode: two words}
    other_solver: {anything: [1, 2]}
cost_model: {name: area}
plan: {stages: 2, cache_size: 8}
executor:
  name: sim
  params: {sim: {mode: numeric}}
plugin_paths: [extra/plugins, /abs/plugins]
compare: {solvers: [usp, binary_greedy], cp_sizes: [8, 16]}
)";

// kSmall as the file <tmp>/cfgdir/small.yaml, its plugin folders created
// (plugin_paths must name folders that exist): {yaml, source path, abs folder}.
struct SmallConfig {
  std::string yaml, source;
  std::filesystem::path abs;
};
SmallConfig small_config() {
  const std::filesystem::path root = test::process_temp_dir("cpsched_cfg_small");
  std::filesystem::create_directories(root / "cfgdir" / "extra" / "plugins");
  std::filesystem::create_directories(root / "abs" / "plugins");
  SmallConfig c{kSmall, (root / "cfgdir" / "small.yaml").string(), root / "abs" / "plugins"};
  c.yaml.replace(c.yaml.find("/abs/plugins"), 12, c.abs.string());
  return c;
}

}  // namespace

TEST_CASE("the quickstart config parses and makes the standard problem") {
  const Config cfg = load_config(source_dir() / "configs" / "quickstart.yaml");
  CHECK(cfg.cp_size == 8);
  CHECK(cfg.seqlen_per_rank == 8192);
  CHECK(cfg.seqlen() == 65536);
  CHECK(cfg.heads.q == 64);
  CHECK(cfg.heads.kv == 8);
  CHECK(cfg.heads.dim == 128);
  CHECK(cfg.heads.dtype_bytes == 2);
  CHECK(cfg.grid.flatten_head_groups);
  CHECK(cfg.grid.blocks_per_rank == 1);
  CHECK(cfg.mask.kind == MaskKind::causal_document);
  CHECK(cfg.mask.histogram.bins.size() == 14);
  CHECK(cfg.mask.seed == 42);
  CHECK(cfg.mask.pack == 0);
  CHECK(cfg.cost_model.name == "time");
  CHECK(cfg.hardware == "h100_8x_nvlink");
  CHECK(cfg.plan.stages == 0);  // auto: the solver chooses
  CHECK(cfg.executor.name == "sim");
  REQUIRE(cfg.executor.given.count("mode") == 1);
  CHECK(std::get<std::string>(cfg.executor.given.at("mode").first) == "timing");
  CHECK(cfg.cache_size == 64);
  const Problem p = make_problem(cfg);
  CHECK(p.cp_size() == 8);
  CHECK(p.seqlen() == 65536);
  CHECK(p.mask.slices().size() > 1);
}

TEST_CASE("a complete config: every section read, plugin parameters typed from YAML scalars") {
  const SmallConfig sc = small_config();
  const Config cfg = parse_config(sc.yaml, sc.source);
  CHECK(cfg.cp_size == 4);
  CHECK(cfg.seqlen() == 64);
  CHECK(cfg.heads.dtype_bytes == 2);
  CHECK_FALSE(cfg.grid.flatten_head_groups);
  CHECK(cfg.grid.blocks_per_rank == 2);
  CHECK(cfg.mask.lengths == std::vector<Token>{30, 20, 14});
  CHECK(cfg.solver.name == "test_params");
  CHECK(cfg.solver.name_loc.str() == sc.source + ":8:9");
  const auto& g = cfg.solver.given;
  REQUIRE(g.size() == 5);
  CHECK(std::get<bool>(g.at("flag").first) == true);
  CHECK(std::get<std::int64_t>(g.at("count").first) == 5);
  CHECK(std::get<std::int64_t>(g.at("ratio").first) == 2);
  CHECK(std::get<std::string>(g.at("label").first) == "7");  // quoted: a string
  CHECK(std::get<std::string>(g.at("mode").first) == "two words");
  CHECK(g.at("count").second.str() == sc.source + ":10:38");
  CHECK(cfg.solver.given_params().get_int("count") == 5);
  CHECK(cfg.plan.stages == 2);
  CHECK(cfg.cache_size == 8);
  REQUIRE(cfg.plugin_paths.size() == 2);
  CHECK(cfg.plugin_paths[0] == std::filesystem::path(sc.source).parent_path() / "extra/plugins");
  CHECK(cfg.plugin_paths[1] == sc.abs);
  CHECK(contains(cfg.compare_yaml, "binary_greedy"));
  CHECK(cfg.compare_loc.str() == sc.source + ":18:10");
  const Problem p = make_problem(cfg);
  CHECK(p.sharding.num_blocks() == 8);
  CHECK(p.mask.area() == 30 * 31 / 2 + 20 * 21 / 2 + 14 * 15 / 2);
}

TEST_CASE("missing sections keep the defaults") {
  const Config cfg = parse_config("problem: {cp_size: 2}\n", "t.yaml");
  CHECK(cfg.cp_size == 2);
  CHECK(cfg.seqlen_per_rank == 8192);
  CHECK(cfg.mask.kind == MaskKind::causal);
  CHECK(cfg.solver.name == "balanced_bytes");
  CHECK(cfg.cost_model.name == "area");  // the seed's model unless a config names one
  CHECK(cfg.hardware.empty());
  CHECK(cfg.plan.stages == 1);
  CHECK(parse_config("problem: {}\nplan: {stages: auto}\n", "a.yaml").plan.stages == 0);
  CHECK(cfg.executor.name == "sim");
  CHECK(cfg.compare_yaml.empty());
  CHECK(make_problem(cfg).mask.slices().size() == 1);
}

TEST_CASE("errors carry file:line:column (1-based) and the key path") {
  const std::string msg = parse_error(
      "problem:\n"
      "  cp_size: 0\n"
      "  heads: {q: 64, kv: 6}\n");
  CHECK(has_line(msg, "t.yaml:2:12: problem.cp_size: must be >= 1, got 0"));
  CHECK(has_line(msg, "t.yaml:3:22: problem.heads.kv: q = 64 query heads are not a multiple of kv = 6 key/value heads"));
}

TEST_CASE("every error of a file is reported at once, one per line") {
  const std::string msg = parse_error(
      "problem:\n"
      "  cp_size: many\n"
      "  seqlen_per_rank: -5\n"
      "  grid: {flatten_head_groups: maybe}\n"
      "  heads: {dtype: bf17, dim: \"128\"}\n"
      "  mask: {kind: causal_documents, seed: -1}\n"
      "plan: {stages: -1}\n"
      "solver: {params: {}}\n");
  const auto ls = lines_of(msg);
  CHECK(ls.size() == 9);
  CHECK(ls.front().rfind("t.yaml:2:12: ", 0) == 0);  // in file order
  CHECK(ls.back().rfind("t.yaml:8:9: ", 0) == 0);
  CHECK(has_line(msg, "t.yaml:2:12: problem.cp_size: expected an integer, got 'many'"));
  CHECK(has_line(msg, "t.yaml:3:20: problem.seqlen_per_rank: must be >= 1, got -5"));
  CHECK(has_line(msg, "t.yaml:4:31: problem.grid.flatten_head_groups: expected true or false, got 'maybe'"));
  CHECK(has_line(msg, "t.yaml:5:18: problem.heads.dtype: unknown dtype 'bf17'; known: bf16, fp16, fp32, fp8"));
  CHECK(has_line(msg, "t.yaml:5:29: problem.heads.dim: expected an integer, got the quoted string \"128\""));
  CHECK(contains(msg, "t.yaml:6:16: problem.mask.kind: unknown mask kind 'causal_documents'; known: full, causal,"));
  CHECK(has_line(msg, "t.yaml:6:40: problem.mask.seed: must be >= 0, got -1"));
  CHECK(has_line(msg, "t.yaml:7:16: plan.stages: must be >= 0, got -1"));
  CHECK(has_line(msg, "t.yaml:8:9: solver: missing required key 'name'"));
}

TEST_CASE("an unknown key lists the known keys of its level") {
  CHECK(parse_error("problem:\n  cp_sise: 8\n") ==
        "t.yaml:2:3: problem.cp_sise: unknown key 'cp_sise'; known keys: cp_size, seqlen_per_rank, heads, grid, mask, layout, host_ranges");
  CHECK(parse_error("problem: {}\nsolvers: {name: usp}\n") ==
        "t.yaml:2:1: solvers: unknown key 'solvers'; known keys: problem, solver, cost_model, plan, executor, "
        "plugin_paths, compare, hardware, memory_budget");
  CHECK(contains(parse_error("problem: {mask: {kind: causal, sead: 1}}\n"),
                 "t.yaml:1:32: problem.mask.sead: unknown key 'sead'; known keys: kind, lengths, histogram, seed,"));
}

TEST_CASE("wrong shapes and duplicate keys") {
  CHECK(parse_error("problem: 8\n") ==
        "t.yaml:1:10: problem: expected a map with keys cp_size, seqlen_per_rank, heads, grid, mask, layout, host_ranges, got '8'");
  CHECK(parse_error("plan: {stages: 1}\nplan: {stages: 2}\nproblem: {}\n") ==
        "t.yaml:2:1: plan: duplicate key 'plan' (first given at t.yaml:1:1)");
  CHECK(contains(parse_error("- 1\n- 2\n"), "t.yaml:1:1: expected a map with keys problem, solver"));
  CHECK(parse_error("solver: {name: usp, params: {usp: {degree: [1, 2]}}}\nproblem: {}\n") ==
        "t.yaml:1:44: solver.params.usp.degree: expected a scalar (bool, integer, real or string), got a sequence");
  // A parameter straight under `params` (not in its plugin's block) is an error, not ignored.
  CHECK(parse_error("solver: {name: balanced_bytes, params: {max_blocks_per_rank: 1}}\nproblem: {}\n") ==
        "t.yaml:1:62: solver.params.max_blocks_per_rank: expected the parameter block of a plugin named "
        "'max_blocks_per_rank', got '1' (parameters go one level down: "
        "solver.params.balanced_bytes.max_blocks_per_rank)");
}

TEST_CASE("malformed YAML names file:line:column") {
  const std::string msg = parse_error("problem:\n  cp_size: 8\n  heads: {q: 64, kv: 8\nsolver: {name: usp}\n");
  CHECK(msg.rfind("t.yaml:", 0) == 0);
  CHECK(contains(msg, "YAML syntax error"));
  CHECK(contains(parse_error("a: 1\n  b: 2\n"), "t.yaml:2:4: YAML syntax error"));
}

TEST_CASE("--set replaces a scalar, creates missing paths, and swaps whole sections") {
  const Config base = load_config(source_dir() / "configs" / "quickstart.yaml");
  CHECK_FALSE(base.mask.histogram.bins.empty());
  const Config cfg = load_config(source_dir() / "configs" / "quickstart.yaml",
                                 {"problem.cp_size=16", "problem.mask={kind: causal, seed: 1}",
                                  "solver.params.binary_greedy.threads=4", "plan.stages=3"});
  CHECK(cfg.cp_size == 16);
  CHECK(cfg.mask.kind == MaskKind::causal);
  CHECK(cfg.mask.seed == 1);
  CHECK(cfg.mask.histogram.bins.empty());  // the whole mask section was replaced
  CHECK(cfg.plan.stages == 3);
  CHECK(contains(cfg.effective_yaml, "kind: causal"));
  CHECK(contains(cfg.effective_yaml, "threads: 4"));
  CHECK_FALSE(contains(cfg.effective_yaml, "doc_length_distribution"));
  // Later overrides win; paths that do not exist yet are created.
  const Config c2 = parse_config("", "t.yaml", {"problem.cp_size=2", "problem.cp_size=3", "executor.name=cuda"});
  CHECK(c2.cp_size == 3);
  CHECK(c2.executor.name == "cuda");
  CHECK(c2.executor.name_loc.str() == "--set executor.name");
}

TEST_CASE("errors in an overridden node name the --set as their source") {
  const std::string msg = parse_error("problem:\n  cp_size: 8\n",
                                      {"problem.cp_size=abc", "problem.mask={kind: nope, seed: 1}"});
  CHECK(has_line(msg, "--set problem.cp_size: problem.cp_size: expected an integer, got 'abc'"));
  CHECK(contains(msg, "--set problem.mask: problem.mask.kind: unknown mask kind 'nope'"));
  CHECK(lines_of(msg).size() == 2);
  // An element of a list the --set gave (it was located at "base.yaml:1:2", the file it did not come from).
  const std::string list = parse_error("problem:\n  cp_size: 2\n  seqlen_per_rank: 64\n",
                                       {"problem.mask={kind: block_topk, indices: x.npy}", "problem.mask.block_size=[0, 64]"});
  CHECK(contains(list, "--set problem.mask.block_size: problem.mask.block_size[0]: "));
  CHECK(!contains(list, "t.yaml:1:2"));
}

TEST_CASE("bad --set syntax is reported, all overrides at once") {
  const std::string msg = parse_error("problem:\n  cp_size: 8\n",
                                      {"problem.cp_size", "a..b=1", "problem.cp_size.x=1", "plan.stages=[1, 2",
                                       "=5"});
  CHECK(has_line(msg, "--set 'problem.cp_size': expected key.path=value (e.g. --set solver.name=usp)"));
  CHECK(contains(msg, "--set 'a..b=1': bad key path 'a..b'"));
  CHECK(has_line(msg, "--set problem.cp_size.x: cannot set it: 'problem.cp_size' is '8', not a map"));
  CHECK(contains(msg, "--set plan.stages: the value is not valid YAML"));
  CHECK(contains(msg, "--set '=5': bad key path ''"));
  CHECK(lines_of(msg).size() == 5);
}

TEST_CASE("document lengths must add up to cp_size * seqlen_per_rank; the error states both numbers") {
  const std::string msg = parse_error(
      "problem:\n"
      "  cp_size: 2\n"
      "  seqlen_per_rank: 8\n"
      "  mask: {kind: full_document, lengths: [5, 5]}\n");
  CHECK(msg == "t.yaml:4:40: problem.mask.lengths: document lengths add up to 10 tokens, but cp_size * "
               "seqlen_per_rank = 2 * 8 = 16");
  // Kinds without documents ignore the lengths.
  CHECK_NOTHROW(parse_config("problem: {cp_size: 2, seqlen_per_rank: 8, mask: {kind: causal, lengths: [5]}}\n",
                             "t.yaml"));
  CHECK(contains(parse_error("problem: {mask: {kind: causal_document, lengths: [0, 8]}}\n"),
                 "problem.mask.lengths[0]: must be >= 1, got 0"));
}

TEST_CASE("make_problem errors carry the location of problem.mask") {
  Config cfg = parse_config("problem:\n  cp_size: 2\n  seqlen_per_rank: 8\n  mask: {kind: causal_document}\n",
                            "t.yaml");
  cfg.mask.lengths = {3, 4};
  const std::string msg = error_of([&] { make_problem(cfg); });
  CHECK(msg.rfind("t.yaml:4:9: problem.mask: ", 0) == 0);
  CHECK(contains(msg, "7"));
  CHECK(contains(msg, "16"));
}

TEST_CASE("mask sections: every kind's parameters, slices, histograms") {
  const Config sw = parse_config(
      "problem: {cp_size: 1, seqlen_per_rank: 64, mask: {kind: sliding_window, window: [8, 2], lengths: [40, 24]}}\n",
      "t.yaml");
  CHECK(sw.mask.window_left == 8);
  CHECK(sw.mask.window_right == 2);
  const Config other = parse_config(
      "problem:\n  mask: {kind: share_question, question_fraction: 0.5, num_answers: 3, prefix_fraction: 1,\n"
      "         block_size: 64, pack: 3, seed: 7}\n",
      "t.yaml");
  CHECK(other.mask.question_fraction == 0.5);
  CHECK(other.mask.num_answers == 3);
  CHECK(other.mask.prefix_fraction == 1.0);
  CHECK(other.mask.block_size == 64);
  CHECK(other.mask.pack == 3);
  CHECK(other.mask.seed == 7);

  const Config sl = parse_config(
      "problem:\n  cp_size: 2\n  seqlen_per_rank: 8\n  mask:\n    kind: slices\n    slices:\n"
      "      - {q: [0, 8], k: [0, 8], type: causal}\n      - {q: [8, 16], k: [0, 16], type: full}\n",
      "t.yaml");
  REQUIRE(sl.mask.slices.size() == 2);
  CHECK(sl.mask.slices[1] == Slice{{8, 16}, {0, 16}, MaskType::full});

  // Overlapping slices are caught when the mask is built, located at problem.mask.
  const std::string overlap = parse_error(
      "problem:\n  cp_size: 2\n  seqlen_per_rank: 8\n  mask:\n    kind: slices\n    slices:\n"
      "      - {q: [0, 8], k: [0, 8], type: causal}\n      - {q: [4, 16], k: [0, 16], type: full}\n");
  CHECK(overlap.rfind("t.yaml:5:5: problem.mask: ", 0) == 0);
  CHECK(contains(parse_error("problem: {mask: {kind: slices}}\n"), "kind 'slices' needs the key 'slices'"));
  CHECK(contains(parse_error("problem: {mask: {kind: slices, slices: [{q: [0, 8], k: [8, 8], type: diag}]}}\n"),
                 "problem.mask.slices[0].k: empty range [8, 8)"));
  CHECK(contains(parse_error("problem: {mask: {kind: sliding_window, window: [8]}}\n"),
                 "problem.mask.window: expected [left, right], got a sequence"));
  CHECK(contains(parse_error("problem: {mask: {kind: prefix_lm, prefix_fraction: 1.5}}\n"),
                 "problem.mask.prefix_fraction: must be in [0.0, 1.0], got 1.5"));

  // Inline histogram bins, and a histogram file relative to the config's folder.
  const Config inl = parse_config(
      "problem: {cp_size: 2, seqlen_per_rank: 64, mask: {kind: causal_document, histogram: [[1, 9, 3], [10, 30, 1]]}}\n",
      "t.yaml");
  REQUIRE(inl.mask.histogram.bins.size() == 2);
  CHECK(inl.mask.histogram.bins[1].hi == 30);
  CHECK(contains(parse_error("problem: {mask: {kind: causal_document, histogram: [[9, 1, 3]]}}\n"),
                 "t.yaml:1:52: problem.mask.histogram: histogram bin 0 [9, 1]: needs 0 <= lo <= hi"));
  const std::string missing = error_of([] {
    parse_config("problem: {mask: {kind: causal_document, histogram: data/nope.csv}}\n", "some/dir/t.yaml");
  });
  CHECK(contains(missing, "some/dir/t.yaml:1:52: problem.mask.histogram: some/dir/data/nope.csv: no such file"));
}

TEST_CASE("grid blocks must hold at least one token; a folder is not a config") {
  CHECK(parse_error("problem: {seqlen_per_rank: 4, grid: {blocks_per_rank: 5}}\n") ==
        "t.yaml:1:55: problem.grid.blocks_per_rank: 5 blocks per rank would be empty: a rank hosts only "
        "seqlen_per_rank = 4 tokens");
  CHECK_NOTHROW(parse_config("problem: {seqlen_per_rank: 4, grid: {blocks_per_rank: 4}}\n", "t.yaml"));
  CHECK(contains(error_of([] { load_config(source_dir() / "configs"); }), "is a folder"));
  CHECK(contains(error_of([] { load_config(source_dir() / "configs" / "nope.yaml"); }), "nope.yaml: no such file"));
}

TEST_CASE("P = 0 and heads that do not divide") {
  CHECK(parse_error("problem: {cp_size: 0}\n") == "t.yaml:1:20: problem.cp_size: must be >= 1, got 0");
  CHECK(contains(parse_error("problem: {heads: {q: 12}}\n"),
                 "t.yaml:1:22: problem.heads.q: q = 12 query heads are not a multiple of kv = 8 key/value heads"));
  CHECK(contains(parse_error("problem: {heads: {q: 8, kv: 0}}\n"), "problem.heads.kv: must be >= 1, got 0"));
}

TEST_CASE("resolve_selection: plugin names and parameters checked against the registry, errors located") {
  const std::filesystem::path good = std::filesystem::path(CPSCHED_TEST_PLUGIN_DIR) / "good";
  REQUIRE_MESSAGE(std::filesystem::exists(good), "build the test plugins first (target cpsched_test_params)");
  Registry reg;
  reg.scan(good);
  const SmallConfig sc = small_config();
  const Config cfg = parse_config(sc.yaml, sc.source);
  const Params p = resolve_selection(reg, int(PluginKind::solver), cfg.solver);
  CHECK(p.get_bool("flag") == true);
  CHECK(p.get_int("count") == 5);
  CHECK(p.get_real("ratio") == 2.0);  // an integer where a real is declared
  CHECK(p.get_string("label") == "7");
  CHECK(p.get_int("offset") == -2);   // default

  const Config bad = parse_config(
      "solver:\n  name: test_params\n  params:\n    test_params: {cuont: 5, flag: 3}\nproblem: {}\n", "bad.yaml");
  const std::string msg = error_of([&] { resolve_selection(reg, int(PluginKind::solver), bad.solver); });
  CHECK(msg.rfind("bad.yaml:4:", 0) == 0);
  CHECK(contains(msg, "bad.yaml:4:26: solver.params.test_params.cuont: "));
  CHECK(contains(msg, "count (int, default 3)"));
  CHECK(contains(msg, "bad.yaml:4:35: solver.params.test_params.flag: "));

  const Config unknown = parse_config("solver: {name: tset_params}\nproblem: {}\n", "u.yaml");
  const std::string m2 = error_of([&] { resolve_selection(reg, int(PluginKind::solver), unknown.solver); });
  CHECK(m2.rfind("u.yaml:1:16: solver.name: ", 0) == 0);
  CHECK(contains(m2, "test_params"));
  const Config over = parse_config("", "o.yaml", {"solver.name=nope", "problem.cp_size=2"});
  CHECK(error_of([&] { resolve_selection(reg, int(PluginKind::solver), over.solver); })
            .rfind("--set solver.name: solver.name: ", 0) == 0);
}

// ---- hardening (docs/hardening.md) and the top-level `hardware:` key (docs/design.md, "Cost models and step time") ----

namespace {

struct TempDir {
  std::filesystem::path dir;
  explicit TempDir(const std::string& name) {
    dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::filesystem::path write(const std::string& file, const std::string& text) const {
    std::ofstream(dir / file) << text;
    return dir / file;
  }
};

std::string repeat_key(const std::string& part, std::size_t n) {
  std::string k;
  for (std::size_t i = 0; i < n; ++i) k += (i ? "." : "") + part;
  return k;
}

}  // namespace

TEST_CASE("--set key paths are bounded and processed without recursion") {
  // 20,000 parts overflowed the stack when paths were set recursively.
  const std::string huge = parse_error("problem: {}\n", {repeat_key("a", 20000) + "=1"});
  CHECK(contains(huge, "--set 'a.a.a."));
  CHECK(contains(huge, "the key path is too long (at most 1024 characters)"));
  CHECK(lines_of(huge).size() == 1);
  const std::string parts = parse_error("problem: {}\n", {repeat_key("b", 65) + "=1"});
  CHECK(contains(parts, "the key path has 65 parts (at most 64)"));
  // 64 parts are fine to set: the unknown key is then reported at the top level.
  const std::string deep = parse_error("problem: {}\n", {repeat_key("c", 64) + "=1"});
  CHECK(contains(deep, "c: unknown key 'c'; known keys: problem"));
  // Setting through a scalar names the part that is not a map.
  CHECK(contains(parse_error("problem: {cp_size: 2}\n", {"problem.cp_size.a.b=1"}),
                 "cannot set it: 'problem.cp_size' is '2', not a map"));
}

TEST_CASE("--set on a YAML-aliased node leaves the alias's other uses unchanged") {
  const std::string yaml =
      "problem: {cp_size: &c 4, seqlen_per_rank: *c}\n"
      "solver:\n"
      "  name: binary_greedy\n"
      "  params:\n"
      "    binary_greedy: &p {mu: 1.5, threads: 2}\n"
      "    balanced_bytes: *p\n";
  // Without --set the aliases hold as written.
  const Config plain = parse_config(yaml, "a.yaml");
  CHECK(plain.cp_size == 4);
  CHECK(plain.seqlen_per_rank == 4);
  // An aliased scalar.
  const Config c1 = parse_config(yaml, "a.yaml", {"problem.cp_size=2"});
  CHECK(c1.cp_size == 2);
  CHECK(c1.seqlen_per_rank == 4);
  // A key inside an aliased map: only this use changes.
  const Config c2 = parse_config(yaml, "a.yaml", {"solver.params.balanced_bytes.mu=2.5"});
  CHECK(std::get<double>(c2.solver.given.at("mu").first) == 1.5);
  CHECK(std::get<std::int64_t>(c2.solver.given.at("threads").first) == 2);
  const Config c3 =
      parse_config(yaml, "a.yaml", {"solver.params.balanced_bytes.mu=2.5", "solver.name=balanced_bytes"});
  CHECK(std::get<double>(c3.solver.given.at("mu").first) == 2.5);
  CHECK(std::get<std::int64_t>(c3.solver.given.at("threads").first) == 2);
  // The whole aliased node replaced, and the other way round.
  const Config c4 = parse_config(yaml, "a.yaml", {"solver.params.binary_greedy={mu: 3.0}"});
  CHECK(std::get<double>(c4.solver.given.at("mu").first) == 3.0);
  CHECK(c4.solver.given.count("threads") == 0);
  const Config c5 = parse_config(yaml, "a.yaml", {"solver.params.binary_greedy={mu: 3.0}", "solver.name=balanced_bytes"});
  CHECK(std::get<double>(c5.solver.given.at("mu").first) == 1.5);
  // Aliases brought by a --set value are protected the same way.
  const Config c6 = parse_config("problem: {}\n", "a.yaml",
                                 {"problem={cp_size: &q 3, seqlen_per_rank: *q}", "problem.seqlen_per_rank=5"});
  CHECK(c6.cp_size == 3);
  CHECK(c6.seqlen_per_rank == 5);
  // Errors in the file keep their line and column.
  CHECK(contains(parse_error(yaml + "plan: {stages: -2}\n", {"problem.cp_size=2"}), "t.yaml:7:16: plan.stages"));
}

TEST_CASE("an empty config, or one without a problem, is an error unless --set gives the problem") {
  CHECK(contains(parse_error(""), "t.yaml: the configuration is empty"));
  CHECK(contains(parse_error("# only a comment\n"), "t.yaml: the configuration is empty"));
  CHECK(contains(parse_error("solver: {name: usp}\n"), "t.yaml: the configuration has no 'problem' section"));
  CHECK(contains(parse_error("problem:\nsolver: {name: usp}\n"), "no 'problem' section"));
  CHECK(contains(parse_error("", {"solver.name=usp"}), "the configuration has no 'problem' section"));
  CHECK(parse_config("", "t.yaml", {"problem.cp_size=2"}).cp_size == 2);
  CHECK(parse_config("problem:\n", "t.yaml", {"problem.cp_size=2"}).cp_size == 2);
  TempDir t("cpsched_cfg_empty");
  const auto empty = t.write("empty.yaml", "");
  CHECK(contains(error_of([&] { load_config(empty); }), "empty.yaml: the configuration is empty"));
  CHECK(load_config(empty, {"problem={cp_size: 2}"}).cp_size == 2);
}

TEST_CASE("a config must be a regular file of bounded size") {
  if (std::filesystem::exists("/dev/zero")) {
    const std::string msg = error_of([] { load_config("/dev/zero"); });
    CHECK(contains(msg, "/dev/zero: not a regular file"));
  }
  TempDir t("cpsched_cfg_big");
  const auto big = t.dir / "big.yaml";
  std::ofstream(big) << "problem: {}\n";
  std::filesystem::resize_file(big, (16u << 20) + 1);  // sparse: cheap
  CHECK(contains(error_of([&] { load_config(big); }), "big.yaml: the configuration file has 16777217 bytes (at most 16777216)"));
}

TEST_CASE("hardware: a top-level profile for the cost model and the executor") {
  const Config none = parse_config("problem: {cp_size: 2}\n", "t.yaml");
  CHECK(none.hardware.empty());
  CHECK(none.executor.inherited.empty());

  const Config cfg = parse_config("problem: {cp_size: 2}\nhardware: cluster_8gpu_ib\n", "t.yaml");
  CHECK(cfg.hardware == "cluster_8gpu_ib");
  CHECK(cfg.hardware_loc.str() == "t.yaml:2:11");
  for (const PluginSelection* sel : {&cfg.cost_model, &cfg.executor}) {
    REQUIRE(sel->inherited.count("hardware") == 1);
    CHECK(std::get<std::string>(sel->inherited.at("hardware").first) == "cluster_8gpu_ib");
  }
  CHECK(cfg.solver.inherited.empty());
  CHECK(contains(cfg.effective_yaml, "hardware: cluster_8gpu_ib"));  // --print-config shows it

  // Bad values are located errors found by the reader (so `check` reports them).
  CHECK(contains(parse_error("problem: {}\nhardware: nope\n"),
                 "t.yaml:2:11: hardware: unknown hardware profile 'nope' (bundled: cluster_8gpu_ib"));
  CHECK(contains(parse_error("problem: {}\nhardware: [a]\n"), "t.yaml:2:11: hardware: expected a string"));
  CHECK(contains(parse_error("problem: {}\n", {"hardware=nope.yaml"}), "--set hardware: hardware: "));
  if (std::filesystem::exists("/dev/zero"))
    CHECK(contains(parse_error("problem: {}\n", {"hardware=/dev/zero"}), "hardware: /dev/zero: not a regular file"));

  // A path is relative to the config's folder, like every path in a config.
  TempDir t("cpsched_cfg_hw");
  std::filesystem::create_directories(t.dir / "profiles");
  std::filesystem::copy_file(source_dir() / "configs" / "hardware" / "cluster_8gpu_ib.yaml",
                             t.dir / "profiles" / "mine.yaml");
  const auto file = t.write("c.yaml", "problem: {cp_size: 2}\nhardware: profiles/mine.yaml\n");
  const Config rel = load_config(file);
  CHECK(rel.hardware == (t.dir / "profiles" / "mine.yaml").string());
  CHECK(contains(error_of([&] { load_config(t.write("d.yaml", "problem: {}\nhardware: profiles/none.yaml\n")); }),
                 "d.yaml:2:11: hardware: "));
}

TEST_CASE("hardware: resolve_selection sets it where the plugin declares it and its block does not") {
  Registry reg;
  reg.scan(CPSCHED_PLUGIN_BUILD_DIR);
  const PluginInfo& sim = reg.find(PluginKind::executor, "sim");
  REQUIRE(std::any_of(sim.params.begin(), sim.params.end(), [](const ParamSpec& s) { return s.name == "hardware"; }));
  const auto q = source_dir() / "configs" / "quickstart.yaml";

  // Without the key: the executor's default.
  const Params def = resolve_selection(reg, int(PluginKind::executor), load_config(q).executor);
  const Config cfg = load_config(q, {"hardware=cluster_8gpu_ib"});
  const Params ex = resolve_selection(reg, int(PluginKind::executor), cfg.executor);
  CHECK(ex.get_string("hardware") == "cluster_8gpu_ib");
  CHECK(def.get_string("hardware") != "cluster_8gpu_ib");
  CHECK(ex.get_string("mode") == "timing");  // the block's other values stay

  // A cost model without a `hardware` parameter (area) is not given one, and no error.
  const Params area = resolve_selection(
      reg, int(PluginKind::cost_model), load_config(q, {"hardware=cluster_8gpu_ib", "cost_model.name=area"}).cost_model);
  CHECK_FALSE(area.has("hardware"));
  // Every cost model that declares it inherits it (the time model, where built).
  for (const PluginInfo& p : reg.plugins()) {
    if (p.kind != PluginKind::cost_model) continue;
    if (std::none_of(p.params.begin(), p.params.end(), [](const ParamSpec& s) { return s.name == "hardware"; }))
      continue;
    const Config c = load_config(q, {"hardware=cluster_8gpu_ib", "cost_model.name=" + p.name});
    CHECK(resolve_selection(reg, int(PluginKind::cost_model), c.cost_model).get_string("hardware") ==
          "cluster_8gpu_ib");
  }

  // The plugin's own block is more specific and wins.
  const Config both = load_config(q, {"hardware=cluster_8gpu_ib", "executor.params.sim.hardware=h200_8x_nvlink"});
  CHECK(resolve_selection(reg, int(PluginKind::executor), both.executor).get_string("hardware") == "h200_8x_nvlink");
}
