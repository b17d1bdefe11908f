// Configuration: parsing, located errors (file:line:column: key.path), all
// errors at once, `--set` overrides, and plugin selections.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "cpsched/config.hpp"
#include "cpsched/error.hpp"
#include "cpsched/registry.hpp"

using namespace cpsched;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

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
  CHECK(cfg.cost_model.name == "area");
  CHECK(cfg.executor.name == "sim");
  REQUIRE(cfg.executor.given.count("mode") == 1);
  CHECK(std::get<std::string>(cfg.executor.given.at("mode").first) == "timing");
  CHECK(cfg.stages == 1);
  CHECK(cfg.cache_size == 64);
  const Problem p = make_problem(cfg);
  CHECK(p.cp_size() == 8);
  CHECK(p.seqlen() == 65536);
  CHECK(p.mask.slices().size() > 1);
}

TEST_CASE("a complete config: every section read, plugin parameters typed from YAML scalars") {
  const Config cfg = parse_config(kSmall, "cfgdir/small.yaml");
  CHECK(cfg.cp_size == 4);
  CHECK(cfg.seqlen() == 64);
  CHECK(cfg.heads.dtype_bytes == 2);
  CHECK_FALSE(cfg.grid.flatten_head_groups);
  CHECK(cfg.grid.blocks_per_rank == 2);
  CHECK(cfg.mask.lengths == std::vector<Token>{30, 20, 14});
  CHECK(cfg.solver.name == "test_params");
  CHECK(cfg.solver.name_loc.str() == "cfgdir/small.yaml:8:9");
  const auto& g = cfg.solver.given;
  REQUIRE(g.size() == 5);
  CHECK(std::get<bool>(g.at("flag").first) == true);
  CHECK(std::get<std::int64_t>(g.at("count").first) == 5);
  CHECK(std::get<std::int64_t>(g.at("ratio").first) == 2);
  CHECK(std::get<std::string>(g.at("label").first) == "7");  // quoted: a string
  CHECK(std::get<std::string>(g.at("mode").first) == "two words");
  CHECK(g.at("count").second.str() == "cfgdir/small.yaml:10:38");
  CHECK(cfg.solver.given_params().get_int("count") == 5);
  CHECK(cfg.stages == 2);
  CHECK(cfg.cache_size == 8);
  REQUIRE(cfg.plugin_paths.size() == 2);
  CHECK(cfg.plugin_paths[0] == std::filesystem::path("cfgdir/extra/plugins"));
  CHECK(cfg.plugin_paths[1] == std::filesystem::path("/abs/plugins"));
  CHECK(contains(cfg.compare_yaml, "binary_greedy"));
  CHECK(cfg.compare_loc.str() == "cfgdir/small.yaml:18:10");
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
  CHECK(cfg.cost_model.name == "area");
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
      "plan: {stages: 0}\n"
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
  CHECK(has_line(msg, "t.yaml:7:16: plan.stages: must be >= 1, got 0"));
  CHECK(has_line(msg, "t.yaml:8:9: solver: missing required key 'name'"));
}

TEST_CASE("an unknown key lists the known keys of its level") {
  CHECK(parse_error("problem:\n  cp_sise: 8\n") ==
        "t.yaml:2:3: problem.cp_sise: unknown key 'cp_sise'; known keys: cp_size, seqlen_per_rank, heads, grid, mask");
  CHECK(parse_error("solvers: {name: usp}\n") ==
        "t.yaml:1:1: solvers: unknown key 'solvers'; known keys: problem, solver, cost_model, plan, executor, "
        "plugin_paths, compare");
  CHECK(contains(parse_error("problem: {mask: {kind: causal, sead: 1}}\n"),
                 "t.yaml:1:32: problem.mask.sead: unknown key 'sead'; known keys: kind, lengths, histogram, seed,"));
}

TEST_CASE("wrong shapes and duplicate keys") {
  CHECK(parse_error("problem: 8\n") ==
        "t.yaml:1:10: problem: expected a map with keys cp_size, seqlen_per_rank, heads, grid, mask, got '8'");
  CHECK(parse_error("plan: {stages: 1}\nplan: {stages: 2}\n") ==
        "t.yaml:2:1: plan: duplicate key 'plan' (first given at t.yaml:1:1)");
  CHECK(contains(parse_error("- 1\n- 2\n"), "t.yaml:1:1: expected a map with keys problem, solver"));
  CHECK(parse_error("solver: {name: usp, params: {usp: {degree: [1, 2]}}}\n") ==
        "t.yaml:1:44: solver.params.usp.degree: expected a scalar (bool, integer, real or string), got a sequence");
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
  CHECK(cfg.stages == 3);
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
  CHECK(contains(missing, "some/dir/t.yaml:1:52: problem.mask.histogram: some/dir/data/nope.csv: cannot open"));
}

TEST_CASE("grid blocks must hold at least one token; a folder is not a config") {
  CHECK(parse_error("problem: {seqlen_per_rank: 4, grid: {blocks_per_rank: 5}}\n") ==
        "t.yaml:1:55: problem.grid.blocks_per_rank: 5 blocks per rank would be empty: a rank hosts only "
        "seqlen_per_rank = 4 tokens");
  CHECK_NOTHROW(parse_config("problem: {seqlen_per_rank: 4, grid: {blocks_per_rank: 4}}\n", "t.yaml"));
  CHECK(contains(error_of([] { load_config(source_dir() / "configs"); }), "is a folder"));
  CHECK(contains(error_of([] { load_config(source_dir() / "configs" / "nope.yaml"); }), "nope.yaml: cannot open"));
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
  const Config cfg = parse_config(kSmall, "small.yaml");
  const Params p = resolve_selection(reg, int(PluginKind::solver), cfg.solver);
  CHECK(p.get_bool("flag") == true);
  CHECK(p.get_int("count") == 5);
  CHECK(p.get_real("ratio") == 2.0);  // an integer where a real is declared
  CHECK(p.get_string("label") == "7");
  CHECK(p.get_int("offset") == -2);   // default

  const Config bad = parse_config(
      "solver:\n  name: test_params\n  params:\n    test_params: {cuont: 5, flag: 3}\n", "bad.yaml");
  const std::string msg = error_of([&] { resolve_selection(reg, int(PluginKind::solver), bad.solver); });
  CHECK(msg.rfind("bad.yaml:4:", 0) == 0);
  CHECK(contains(msg, "bad.yaml:4:26: solver.params.test_params.cuont: "));
  CHECK(contains(msg, "count (int, default 3)"));
  CHECK(contains(msg, "bad.yaml:4:35: solver.params.test_params.flag: "));

  const Config unknown = parse_config("solver: {name: tset_params}\n", "u.yaml");
  const std::string m2 = error_of([&] { resolve_selection(reg, int(PluginKind::solver), unknown.solver); });
  CHECK(m2.rfind("u.yaml:1:16: solver.name: ", 0) == 0);
  CHECK(contains(m2, "test_params"));
  const Config over = parse_config("", "o.yaml", {"solver.name=nope"});
  CHECK(error_of([&] { resolve_selection(reg, int(PluginKind::solver), over.solver); })
            .rfind("--set solver.name: solver.name: ", 0) == 0);
}
