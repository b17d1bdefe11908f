// Plan JSON (docs/plan_format.md) and SVG pictures.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "brute_force.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/io/plan_json.hpp"
#include "cpsched/io/plan_svg.hpp"
#include "plan_fixtures.hpp"

using namespace cpsched;
using nlohmann::json;

namespace {

struct Fixture {
  Assignment a;
  Plan plan;
  Metrics m;
  Fixture() {
    std::mt19937_64 rng(17);
    auto g = test::make_grid(test::random_document_mask(50, rng), 3, {6, 3, 8, 2});
    a = test::random_assignment(g, rng);
    plan = build_plan(a, 2);
    m = compute_metrics(a);
  }
};

std::vector<Token> pair(const json& j) { return {j.at(0).get<Token>(), j.at(1).get<Token>()}; }

}  // namespace

TEST_CASE("plan JSON holds problem, solver, tasks, metrics and every rank's CalcMeta and CommMeta") {
  Fixture f;
  PlanExport e;
  e.assignment = &f.a;
  e.metrics = &f.m;
  e.plan = &f.plan;
  e.solver = "random";
  e.solver_params = Params({{"seed", std::int64_t{17}}});
  e.solve_ms = 1.5;
  const json doc = json::parse(plan_json(e, 1));
  CHECK(doc["format"] == "cpsched-plan/1");
  const json& pr = doc["problem"];
  CHECK(pr["seqlen"] == 50);
  CHECK(pr["cp_size"] == 3);
  CHECK(pr["head_groups"] == 3);
  CHECK(pr["host_ranges"].size() == 3);
  CHECK(pair(pr["host_ranges"][0][0]) == std::vector<Token>{0, 17});  // uneven: 50 = 17 + 17 + 16
  CHECK(pr["mask"].size() == f.a.grid->problem().mask.slices().size());
  CHECK(doc["solver"]["name"] == "random");
  CHECK(doc["solver"]["params"]["seed"] == 17);
  CHECK(doc["tasks"].size() == static_cast<std::size_t>(f.a.grid->num_tasks()));
  CHECK(doc["tasks"][0]["rank"] == f.a.rank[0]);
  CHECK(doc["metrics"]["fwd"]["total_send"] == f.m.fwd.total_send);
  CHECK(doc["metrics"]["bwd"]["send"].get<std::vector<Bytes>>() == f.m.bwd.send);
  CHECK(doc["stages"] == 2);
  REQUIRE(doc["ranks"].size() == 3);
  for (std::size_t r = 0; r < 3; ++r) {
    for (const char* pass : {"fwd", "bwd"}) {
      const PassPlan& pp = std::string(pass) == "fwd" ? f.plan.ranks[r].fwd : f.plan.ranks[r].bwd;
      const json& jp = doc["ranks"][r][pass];
      const json& local = jp["calc"]["local_attn_args"];
      REQUIRE(local.size() == pp.calc.local_attn_args.size());
      for (std::size_t i = 0; i < local.size(); ++i) {
        const AttnArg& x = pp.calc.local_attn_args[i];
        CHECK(pair(local[i]["q"]) == std::vector<Token>{x.q.begin, x.q.end});
        CHECK(pair(local[i]["k"]) == std::vector<Token>{x.k.begin, x.k.end});
        CHECK(local[i]["type"] == std::string(to_string(x.type)));
        CHECK(local[i]["group"] == x.group);
      }
      REQUIRE(jp["calc"]["remote_attn_args"].size() == 2);
      REQUIRE(jp["comm"]["stages"].size() == 2);
      for (std::size_t s = 0; s < 2; ++s) {
        const StageComm& sc = pp.comm.stages[s];
        const json& js = jp["comm"]["stages"][s];
        CHECK(js["num_remote_qo_tokens"] == sc.num_remote_qo_tokens);
        CHECK(js["kv_recv_offset"] == sc.kv_recv_offset);
        CHECK(js["qo"]["dst_indices"].get<std::vector<std::vector<Rank>>>() == sc.qo.dst_indices);
        CHECK(js["kv"]["src_index"].get<std::vector<Rank>>() == sc.kv.src_index);
        CHECK(js["kv"]["output_split_sizes"].get<std::vector<Token>>() == sc.kv.output_split_sizes);
        CHECK(js["qo"]["input_ranges"].size() == sc.qo.input_ranges.size());
        const json& rem = jp["calc"]["remote_attn_args"][s];
        REQUIRE(rem.size() == pp.calc.remote_attn_args[s].size());
        for (std::size_t i = 0; i < rem.size(); ++i)
          CHECK(rem[i]["k_buf"] == (pp.calc.remote_attn_args[s][i].k_buf == BufferId::local ? "local" : "remote"));
      }
    }
  }
}

TEST_CASE("plan JSON without a plan has no ranks part; missing inputs are an error") {
  Fixture f;
  PlanExport e;
  e.assignment = &f.a;
  e.metrics = &f.m;
  e.include_tasks = false;
  const json doc = json::parse(plan_json(e));
  CHECK_FALSE(doc.contains("ranks"));
  CHECK_FALSE(doc.contains("tasks"));
  e.metrics = nullptr;
  CHECK_THROWS_AS(plan_json(e), Error);
}

TEST_CASE("SVG: one panel per drawn head group, rank colours, figures, valid structure") {
  Fixture f;
  const std::string svg = plan_svg(f.a, f.m, SvgOptions{{}, 2, 300, "test <plan>", "random", 2});
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(svg.find("head group 0") != std::string::npos);
  CHECK(svg.find("head group 1") != std::string::npos);
  CHECK(svg.find("head group 2") == std::string::npos);  // max_groups = 2
  CHECK(svg.find("test &lt;plan&gt;") != std::string::npos);
  CHECK(svg.find("forward: total send") != std::string::npos);
  std::set<Rank> used(f.a.rank.begin(), f.a.rank.end());
  for (Rank r : used) CHECK(svg.find("fill=\"" + rank_colour(r, 3) + "\" d=\"M") != std::string::npos);
  // Every opened group is closed.
  std::size_t open = 0, close = 0;
  for (std::size_t i = svg.find("<g>"); i != std::string::npos; i = svg.find("<g>", i + 1)) ++open;
  for (std::size_t i = svg.find("</g>"); i != std::string::npos; i = svg.find("</g>", i + 1)) ++close;
  CHECK(open == 2);
  CHECK(close == 2);

  const std::string chosen = plan_svg(f.a, f.m, SvgOptions{{2}, 4, 300, "", "", 0});
  CHECK(chosen.find("head group 2") != std::string::npos);
  CHECK(chosen.find("head group 0") == std::string::npos);
  CHECK_THROWS_WITH_AS(plan_svg(f.a, f.m, SvgOptions{{3}, 4, 300, "", "", 0}), doctest::Contains("head group 3"), Error);

  const auto file = std::filesystem::temp_directory_path() / "cpsched_test_plan_export.svg";
  write_plan_svg(file, f.a, f.m);
  CHECK(std::filesystem::file_size(file) > 1000);
  std::filesystem::remove(file);
  CHECK_THROWS_AS(write_plan_svg("/nonexistent-dir/x.svg", f.a, f.m), Error);
}

TEST_CASE("rank colours are distinct for 128 ranks") {
  std::set<std::string> colours;
  for (Rank r = 0; r < 128; ++r) colours.insert(rank_colour(r, 128));
  CHECK(colours.size() == 128);
}

TEST_CASE("streamed plan JSON has nlohmann's exact layout at every indent, and the same text either way") {
  Fixture f;
  PlanExport e;
  e.note = "quotes \" backslash \\ newline \n tab \t control \x01 unicode \xc3\xa9";
  e.assignment = &f.a;
  e.metrics = &f.m;
  e.plan = &f.plan;
  e.solver = "random";
  // Every parameter type, reals with and without a fraction.
  e.solver_params = Params({{"seed", std::int64_t{-17}},
                            {"mu", 1.1},
                            {"whole", 2.0},
                            {"tiny", 1e-300},
                            {"flag", true},
                            {"off", false},
                            {"label", std::string("a \"b\"")}});
  e.solve_ms = 0.1 + 0.2;
  for (int indent : {-1, 0, 1, 2, 4}) {
    CAPTURE(indent);
    const std::string text = plan_json(e, indent);
    // The format of record: what nlohmann::json prints (sorted keys, its
    // spacing and number formatting) for the same document.
    CHECK(json::parse(text).dump(indent) == text);
    std::ostringstream os;
    write_plan_json(os, e, indent);
    CHECK(os.str() == text);
  }
  const json doc = json::parse(plan_json(e));
  CHECK(doc["solver"]["note"] == e.note);
  CHECK(doc["solver"]["params"]["whole"].is_number_float());
  CHECK(doc["solver"]["solve_ms"] == 0.1 + 0.2);
  CHECK(doc["solver"]["params"]["label"] == "a \"b\"");
  CHECK(plan_json(e).find("\"whole\":2.0") != std::string::npos);

  // Invalid UTF-8 in a solver's note is replaced, not a failed export.
  e.note = "bad \xff byte";
  CHECK(json::parse(plan_json(e))["solver"]["note"] == "bad \xef\xbf\xbd byte");
}

TEST_CASE("plan JSON: empty lists and a plan with no remote stage keep the layout") {
  std::mt19937_64 rng(5);
  auto g = test::make_grid(test::random_document_mask(12, rng), 1, {2, 1, 8, 2});
  Assignment a = test::random_assignment(g, rng);
  const Plan plan = build_plan(a, 1);
  const Metrics m = compute_metrics(a);
  PlanExport e;
  e.assignment = &a;
  e.metrics = &m;
  e.plan = &plan;
  for (int indent : {-1, 2}) {
    const std::string text = plan_json(e, indent);
    CHECK(json::parse(text).dump(indent) == text);
    CHECK(text.find(indent < 0 ? "\"params\":{}" : "\"params\": {}") != std::string::npos);
  }
}

TEST_CASE("plan SVG files are replaced whole; a failed write names the path and keeps the old file") {
  Fixture f;
  const auto dir = std::filesystem::temp_directory_path() / ("cpsched_svg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "p.svg";
  std::ofstream(file) << "old";
  write_plan_svg(file, f.a, f.m);
  std::ifstream in(file);
  std::string first;
  std::getline(in, first);
  CHECK(first.rfind("<svg", 0) == 0);
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);
  const std::string expected = (dir / "no" / "x.svg").string() + "': No such file or directory";
  CHECK_THROWS_WITH_AS(write_plan_svg(dir / "no" / "x.svg", f.a, f.m), doctest::Contains(expected.c_str()), Error);
  std::filesystem::remove_all(dir);
}

namespace {
// Records the pieces a writer hands to its stream.
class PieceCounter : public std::streambuf {
 public:
  std::size_t pieces = 0, largest = 0, total = 0;

 protected:
  std::streamsize xsputn(const char*, std::streamsize n) override {
    ++pieces;
    largest = std::max(largest, static_cast<std::size_t>(n));
    total += static_cast<std::size_t>(n);
    return n;
  }
  int_type overflow(int_type c) override {
    if (!traits_type::eq_int_type(c, traits_type::eof())) xsputn(nullptr, 1);
    return traits_type::not_eof(c);
  }
};
}  // namespace

TEST_CASE("plan JSON reaches the stream in bounded pieces, not as one whole document") {
  std::mt19937_64 rng(3);
  auto g = test::make_grid(test::random_document_mask(3000, rng), 16, {8, 4, 8, 2}, GridOptions{true, 2});
  Assignment a = test::random_assignment(g, rng);
  const Plan plan = build_plan(a, 3);
  const Metrics m = compute_metrics(a);
  PlanExport e;
  e.assignment = &a;
  e.metrics = &m;
  e.plan = &plan;
  PieceCounter counter;
  std::ostream os(&counter);
  write_plan_json(os, e, 2);
  CHECK(counter.total == plan_json(e, 2).size());
  REQUIRE(counter.total > (1u << 20));  // large enough for the check to mean something
  CHECK(counter.largest < (1u << 17));  // the writer's buffer, never the document
  CHECK(counter.pieces >= counter.total / (1u << 17));
}

TEST_CASE("plan SVGs have a size bound: above kSvgMaxTasks tasks a panel aggregates per rank pair") {
  // Unbounded, a causal mask at P = 1024 drew every task (106 MB). Here P =
  // 256 (32896 causal tasks per group, over kSvgMaxTasks) against P = 64
  // (2080 tasks, drawn one by one).
  auto draw = [](int P, int kv) {
    const Token S = Token{P} * 64;
    auto g = test::make_grid(RangeMask(S, {Slice{{0, S}, {0, S}, MaskType::causal}}), P, {kv, kv, 8, 2});
    Assignment a;
    a.grid = g;
    a.rank.resize(static_cast<std::size_t>(g->num_tasks()));
    for (TaskId t = 0; t < g->num_tasks(); ++t) a.rank[static_cast<std::size_t>(t)] = g->q_host(t);
    SvgOptions o;
    o.max_groups = 8;
    return plan_svg(a, compute_metrics(a), o);
  };
  const std::string small = draw(64, 1);
  CHECK(small.find("aggregated") == std::string::npos);
  const std::string big = draw(256, 1);
  CHECK(big.find("aggregated: q x kv host ranks") != std::string::npos);
  CHECK(big.size() < (std::size_t{3} << 20));
  CHECK(big.find("</svg>") != std::string::npos);
  // Every drawn square is one path segment: at most kSvgMaxTiles per panel.
  std::size_t squares = 0;
  for (std::size_t at = big.find('M'); at != std::string::npos; at = big.find('M', at + 1)) ++squares;
  CHECK(squares <= static_cast<std::size_t>(kSvgMaxTiles + 256 + 64));
  // With 8 groups (8 panels of the aggregate), still bounded by the panels drawn.
  CHECK(draw(256, 8).size() < (std::size_t{8} * (std::size_t{3} << 20)));
  // The legend stops at kSvgMaxLegend ranks; more than kSvgMaxPanels groups is an error.
  CHECK(big.find("r255<") != std::string::npos);
  Fixture f;
  SvgOptions many;
  many.groups = std::vector<int>(17, 0);
  CHECK_THROWS_WITH_AS(plan_svg(f.a, f.m, many), doctest::Contains("at most 16"), Error);
}
