// Checks the report folders written by `cpsched compare` (test/compare/
// CMakeLists.txt runs it first): the files a user opens exist and link up,
// the CSV has its documented columns and a row for every solver on every
// sweep point, and its figures agree with each other (reductions recomputed
// from the volumes, USP's closed form recomputed from the problem, means
// recomputed from the packs; the gap to the exact `ilp` solver recomputed
// from ilp's row of the same point, per pack and as a ratio of means; the
// step time over the compute bound recomputed, the bound checked against the
// hardware axis).
#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// One CSV record (RFC 4180 quotes; the tool writes one record per line).
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

struct Csv {
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;
  bool ragged = false;
};

Csv read_csv(const fs::path& p) {
  Csv csv;
  std::ifstream in(p);
  std::string line;
  if (!std::getline(in, line)) return csv;
  csv.header = split_csv(line);
  while (std::getline(in, line)) {
    const auto cells = split_csv(line);
    if (cells.size() != csv.header.size()) csv.ragged = true;
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < std::min(cells.size(), csv.header.size()); ++i) row[csv.header[i]] = cells[i];
    csv.rows.push_back(std::move(row));
  }
  return csv;
}

double num(const std::map<std::string, std::string>& row, const std::string& col) {
  const auto it = row.find(col);
  REQUIRE_MESSAGE(it != row.end(), "no column " << col);
  REQUIRE_MESSAGE(!it->second.empty(), "empty " << col << " in a row of solver " << row.at("solver"));
  return std::stod(it->second);
}

bool close(double a, double b, double rel = 1e-6, double abs = 1e-9) {
  return std::fabs(a - b) <= abs + rel * std::max(std::fabs(a), std::fabs(b));
}

const std::vector<std::string> kColumns = {
    "row", "mask", "cp_size", "heads_q", "heads_kv", "head_dim", "stages", "hardware", "layout", "uses", "solver", "pack", "packs",
    "status",
    "fwd_send_gib", "fwd_bottleneck_gib", "bwd_send_gib", "bwd_bottleneck_gib",
    "usp_closed_form_fwd_gib", "usp_placement_fwd_gib", "usp_placement_bwd_gib",
    "fwd_reduction_vs_usp_closed_pct", "fwd_reduction_vs_usp_placement_pct", "bwd_reduction_vs_usp_placement_pct",
    "imbalance", "stage0_share", "feasible_packs",
    "latency_ms", "grid_ms", "solve_ms", "plan_ms",
    "fwd_step_ms", "bwd_step_ms", "step_ms", "fwd_exposed_comm_ms", "bwd_exposed_comm_ms", "exposed_comm_ms",
    "compute_bound_ms", "step_over_bound", "rank_path_ms", "cost_per_use",
    "gap_to_ilp_pct", "ilp_fwd_gib", "ilp_bound_gib", "ilp_proven",
    "error", "note", "solver_note"};

// The sweep the quick config asks for.
struct Sweep {
  std::vector<std::string> solvers, masks, hardware;
  std::vector<int> cp_sizes, stages;
  std::vector<std::pair<int, int>> heads;
  int packs = 0;
  long seqlen_per_rank = 0;
  int head_dim = 0;
};

Sweep quick_sweep() {
  const YAML::Node root = YAML::LoadFile(COMPARE_QUICK_CONFIG);
  const YAML::Node c = root["compare"];
  Sweep s;
  for (const auto& n : c["solvers"]) s.solvers.push_back(n.as<std::string>());
  for (const auto& n : c["masks"]) s.masks.push_back(n.as<std::string>());
  for (const auto& n : c["cp_sizes"]) s.cp_sizes.push_back(n.as<int>());
  for (const auto& n : c["stages"]) s.stages.push_back(n.as<int>());
  for (const auto& n : c["heads"]) s.heads.emplace_back(n["q"].as<int>(), n["kv"].as<int>());
  s.packs = c["packs"].as<int>();
  if (c["hardware"]) {
    for (const auto& n : c["hardware"]) s.hardware.push_back(n.as<std::string>());
  } else {
    s.hardware = {c["timing"]["hardware"].as<std::string>()};
  }
  s.seqlen_per_rank = root["problem"]["seqlen_per_rank"].as<long>();
  s.head_dim = root["problem"]["heads"]["dim"].as<int>();
  return s;
}

bool is_document_mask(const std::string& m) { return m != "full" && m != "causal"; }

// USP's closed form (docs/design.md#metrics), all ranks, GiB; u = largest divisor of P at most min(8, hkv).
double usp_closed_gib(int P, long per_rank, int hq, int hkv, int D, int b) {
  int u = 1;
  for (int d = 1; d <= std::min(8, hkv); ++d)
    if (P % d == 0) u = d;
  const double per = static_cast<double>(per_rank) * D * b *
                     (2.0 * hq * (u - 1) / u + 2.0 * hkv * (u - 1) / u + 2.0 * hkv * (P / u - 1));
  return per * P / (1024.0 * 1024.0 * 1024.0);
}

std::string point_key(const std::map<std::string, std::string>& r) {
  return r.at("mask") + "/" + r.at("cp_size") + "/" + r.at("heads_q") + ":" + r.at("heads_kv") + "/" + r.at("pack");
}

// A point on one profile: the rows that share a hardware.
std::string hw_point_key(const std::map<std::string, std::string>& r) {
  return point_key(r) + "/" + r.at("hardware");
}

}  // namespace

TEST_CASE("the quick report folder has its files, and index.html links every chart") {
  const fs::path dir = COMPARE_QUICK_DIR;
  for (const char* f : {"results.csv", "results.md", "index.html"}) CHECK_MESSAGE(fs::is_regular_file(dir / f), f);
  std::set<std::string> svgs;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".svg") svgs.insert(e.path().filename().string());
  const Sweep s = quick_sweep();
  // Per (heads, mask): volumes (fwd, bwd, bottleneck), latency, imbalance
  // (the same plans on every profile: drawn once); per hardware profile too:
  // step time and exposed communication.
  CHECK(svgs.size() == s.heads.size() * s.masks.size() * (5 + 2 * s.hardware.size()));
  for (const auto& m : s.masks)
    for (const auto& hw : s.hardware) {
      const std::string f = m + "_16x4d128_step_time_" + hw + ".svg";
      REQUIRE_MESSAGE(svgs.count(f), f);
      // The compute bound is drawn (dashed, no markers) and the note says how it was taken.
      const std::string svg = read_text(dir / f);
      CHECK(svg.find("compute bound") != std::string::npos);
      CHECK(svg.find("least over solvers") != std::string::npos);
      CHECK(svg.find("hardware " + hw) != std::string::npos);
    }
  const std::string html = read_text(dir / "index.html");
  const std::string md = read_text(dir / "results.md");
  for (const auto& f : svgs) {
    CHECK_MESSAGE(html.find("src=\"" + f + "\"") != std::string::npos, f << " is not shown in index.html");
    CHECK_MESSAGE(md.find("(" + f + ")") != std::string::npos, f << " is not in results.md");
    const std::string svg = read_text(dir / f);
    CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
    CHECK(svg.find("</svg>") != std::string::npos);
    CHECK(svg.find("<polyline") != std::string::npos);  // something was drawn
    CHECK(svg.find("<script") == std::string::npos);
  }
  // Offline: no absolute URLs, no scripts.
  CHECK(html.find("http://") == std::string::npos);
  CHECK(html.find("https://") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  // Tables are split by hardware and carry the bound columns.
  for (const auto& hw : s.hardware) {
    CHECK_MESSAGE(md.find("D 128, hardware " + hw + "\n") != std::string::npos, hw << " has no table in results.md");
    CHECK_MESSAGE(html.find("D 128, hardware " + hw + "</h3>") != std::string::npos, hw << " has no table in index.html");
  }
  CHECK(md.find("| bound (ms) | step/bound |") != std::string::npos);
  for (const auto& solver : s.solvers) {
    CHECK_MESSAGE(html.find(">" + solver + "<") != std::string::npos, solver << " missing from index.html");
    CHECK_MESSAGE(md.find("| " + solver + " |") != std::string::npos, solver << " missing from results.md");
  }
}

TEST_CASE("the quick CSV has the documented columns and a row for every solver on every sweep point") {
  const Csv csv = read_csv(fs::path(COMPARE_QUICK_DIR) / "results.csv");
  REQUIRE(csv.header == kColumns);
  CHECK_FALSE(csv.ragged);
  const Sweep s = quick_sweep();

  std::map<std::string, int> count;  // (row kind, point, stages, solver) -> rows
  for (const auto& r : csv.rows) {
    CHECK_MESSAGE(r.at("status") == "ok", r.at("solver") << " failed on " << point_key(r) << ": " << r.at("error"));
    // Each pack's row carries the solver's own account of its answer; a mean row has none.
    if (r.at("row") == "mean") CHECK(r.at("solver_note").empty());
    else if (r.at("solver") == "usp") CHECK(r.at("solver_note").rfind("usp: Ulysses degree ", 0) == 0);
    count[r.at("row") + "|" + r.at("mask") + "|" + r.at("cp_size") + "|" + r.at("heads_q") + ":" + r.at("heads_kv") +
          "|" + r.at("stages") + "|" + r.at("hardware") + "|" + r.at("solver") + "|" + r.at("pack")]++;
  }
  std::size_t expected_rows = 0;
  for (const auto& [q, kv] : s.heads)
    for (const auto& m : s.masks)
      for (int P : s.cp_sizes)
        for (int st : s.stages)
          for (const auto& hw : s.hardware)
            for (const auto& solver : s.solvers) {
              const std::string k = m + "|" + std::to_string(P) + "|" + std::to_string(q) + ":" + std::to_string(kv) +
                                    "|" + std::to_string(st) + "|" + hw + "|" + solver + "|";
              CHECK_MESSAGE(count["mean|" + k] == 1, "no mean row for " << k);
              if (is_document_mask(m)) {
                for (int pack = 0; pack < s.packs; ++pack)
                  CHECK_MESSAGE(count["pack|" + k + std::to_string(pack)] == 1, "no row for " << k << pack);
                expected_rows += static_cast<std::size_t>(s.packs) + 1;
              } else {
                CHECK_MESSAGE(count["pack|" + k] == 1, "no row for " << k);
                expected_rows += 2;
              }
            }
  CHECK(csv.rows.size() == expected_rows);
}

TEST_CASE("the quick CSV is consistent: reductions, USP closed form, baselines and means recomputed") {
  const Csv csv = read_csv(fs::path(COMPARE_QUICK_DIR) / "results.csv");
  REQUIRE(csv.header == kColumns);
  const Sweep s = quick_sweep();
  // The `usp` solver's forward and backward send per sweep point.
  std::map<std::string, std::pair<double, double>> usp;
  for (const auto& r : csv.rows)
    if (r.at("row") == "pack" && r.at("solver") == "usp" && r.at("status") == "ok")
      usp[point_key(r)] = {num(r, "fwd_send_gib"), num(r, "bwd_send_gib")};

  for (const auto& r : csv.rows) {
    if (r.at("status") != "ok") continue;
    CAPTURE(r.at("row"));
    CAPTURE(point_key(r));
    CAPTURE(r.at("solver"));
    const double fwd = num(r, "fwd_send_gib"), bwd = num(r, "bwd_send_gib");
    const double closed = num(r, "usp_closed_form_fwd_gib");
    const double ref_fwd = num(r, "usp_placement_fwd_gib"), ref_bwd = num(r, "usp_placement_bwd_gib");
    CHECK(close(closed, usp_closed_gib(std::stoi(r.at("cp_size")), s.seqlen_per_rank, std::stoi(r.at("heads_q")),
                                       std::stoi(r.at("heads_kv")), s.head_dim, 2)));
    CHECK(close(num(r, "fwd_reduction_vs_usp_closed_pct"), 100.0 * (1.0 - fwd / closed), 1e-6, 1e-6));
    CHECK(close(num(r, "fwd_reduction_vs_usp_placement_pct"), 100.0 * (1.0 - fwd / ref_fwd), 1e-6, 1e-6));
    CHECK(close(num(r, "bwd_reduction_vs_usp_placement_pct"), 100.0 * (1.0 - bwd / ref_bwd), 1e-6, 1e-6));
    // A bottleneck is one rank's share of the total; backward moves more than
    // forward over the same transfers (docs/design.md#metrics).
    CHECK(num(r, "fwd_bottleneck_gib") <= fwd * (1 + 1e-9));
    CHECK(num(r, "bwd_bottleneck_gib") <= bwd * (1 + 1e-9));
    CHECK(bwd >= fwd);
    CHECK(num(r, "imbalance") >= 1.0 - 1e-12);
    CHECK(num(r, "stage0_share") >= 0.0);
    CHECK(num(r, "stage0_share") <= 1.0);
    CHECK(num(r, "latency_ms") > 0);
    CHECK(close(num(r, "step_ms"), num(r, "fwd_step_ms") + num(r, "bwd_step_ms")));
    CHECK(close(num(r, "exposed_comm_ms"), num(r, "fwd_exposed_comm_ms") + num(r, "bwd_exposed_comm_ms")));
    CHECK(num(r, "fwd_exposed_comm_ms") <= num(r, "fwd_step_ms") * (1 + 1e-9));
    // The compute bound: positive, and no step beats it (it is perfect
    // balance with free communication on the same profile).
    const double bound = num(r, "compute_bound_ms");
    CHECK(bound > 0);
    CHECK(close(num(r, "step_over_bound"), num(r, "step_ms") / bound, 1e-8, 1e-12));
    CHECK(num(r, "step_over_bound") >= 1.0 - 1e-9);
    // The quick config plans the layout ahead (problem.layout: planned, no plan.uses): a use costs the step.
    CHECK(r.at("layout") == "planned");
    CHECK(r.at("uses") == "ahead");
    CHECK(close(num(r, "cost_per_use"), num(r, "step_over_bound"), 1e-12, 1e-12));
    CHECK(r.at("rank_path_ms").empty());  // compare.rank_path is off
    // ilp is not compared here: nothing to measure a gap against.
    for (const char* col : {"gap_to_ilp_pct", "ilp_fwd_gib", "ilp_bound_gib", "ilp_proven"})
      CHECK_MESSAGE(r.at(col).empty(), col);
    if (r.at("row") == "pack") {
      // The baseline columns are the usp solver's own row of the same point.
      REQUIRE(usp.count(point_key(r)));
      CHECK(close(ref_fwd, usp.at(point_key(r)).first));
      CHECK(close(ref_bwd, usp.at(point_key(r)).second));
    }
  }

  // Mean rows: means of their pack rows, imbalance the worst, feasible packs counted.
  for (const auto& m : csv.rows) {
    if (m.at("row") != "mean") continue;
    std::vector<const std::map<std::string, std::string>*> packs;
    for (const auto& r : csv.rows)
      if (r.at("row") == "pack" && r.at("mask") == m.at("mask") && r.at("cp_size") == m.at("cp_size") &&
          r.at("heads_q") == m.at("heads_q") && r.at("heads_kv") == m.at("heads_kv") &&
          r.at("stages") == m.at("stages") && r.at("hardware") == m.at("hardware") && r.at("solver") == m.at("solver"))
        packs.push_back(&r);
    CAPTURE(m.at("mask"));
    CAPTURE(m.at("cp_size"));
    CAPTURE(m.at("solver"));
    CAPTURE(m.at("hardware"));
    REQUIRE(static_cast<int>(packs.size()) == std::stoi(m.at("packs")));
    for (const char* col : {"fwd_send_gib", "fwd_bottleneck_gib", "bwd_send_gib", "bwd_bottleneck_gib",
                            "usp_placement_fwd_gib", "stage0_share", "latency_ms", "step_ms", "compute_bound_ms"}) {
      double mean = 0;
      for (const auto* r : packs) mean += num(*r, col) / static_cast<double>(packs.size());
      CHECK_MESSAGE(close(num(m, col), mean, 1e-8, 1e-9), col);
    }
    double worst = 0, feasible = 0;
    for (const auto* r : packs) {
      worst = std::max(worst, num(*r, "imbalance"));
      feasible += num(*r, "feasible_packs");
    }
    CHECK(close(num(m, "imbalance"), worst));
    CHECK(num(m, "feasible_packs") == feasible);
  }
}

TEST_CASE("the quick CSV's hardware axis: every row on every profile, one solve timed on each") {
  const Csv csv = read_csv(fs::path(COMPARE_QUICK_DIR) / "results.csv");
  REQUIRE(csv.header == kColumns);
  const Sweep s = quick_sweep();
  REQUIRE(s.hardware.size() >= 2);
  std::set<std::string> seen;
  // The compute bound is total compute / P: the same for every solver and
  // stage count at a point on one profile.
  std::map<std::string, std::pair<double, double>> bound_range;
  // The area cost model does not take `hardware`: one solve per point, so the
  // volumes are the same on every profile.
  std::map<std::string, std::set<std::string>> volumes;
  for (const auto& r : csv.rows) {
    seen.insert(r.at("hardware"));
    if (r.at("status") != "ok") continue;
    const double b = num(r, "compute_bound_ms");
    auto [it, fresh] = bound_range.emplace(r.at("row") + "/" + hw_point_key(r), std::make_pair(b, b));
    it->second.first = std::min(it->second.first, b);
    it->second.second = std::max(it->second.second, b);
    volumes[r.at("row") + "/" + point_key(r) + "/" + r.at("stages") + "/" + r.at("solver")].insert(
        r.at("fwd_send_gib") + "," + r.at("bwd_send_gib") + "," + r.at("imbalance"));
  }
  CHECK(seen == std::set<std::string>(s.hardware.begin(), s.hardware.end()));
  for (const auto& [k, lohi] : bound_range) CHECK_MESSAGE(close(lohi.first, lohi.second, 1e-9), k);
  for (const auto& [k, v] : volumes) CHECK_MESSAGE(v.size() == 1, k << " differs between profiles");
}

TEST_CASE("a slower inter-node fabric never shortens the step of the same plan") {
  // compare_hardware_run: the quick config at P = 8 (one node) and 16 (two
  // nodes) on h100_8x_nvlink and cluster_8gpu_ib, which differ only in the
  // inter-node link (45 vs 22 GB/s).
  const Csv csv = read_csv(fs::path(COMPARE_HARDWARE_DIR) / "results.csv");
  REQUIRE(csv.header == kColumns);
  CHECK_FALSE(csv.ragged);
  std::map<std::string, std::map<std::string, double>> step;  // point/stages/solver -> hardware -> ms
  for (const auto& r : csv.rows) {
    REQUIRE(r.at("status") == "ok");
    step[r.at("row") + "/" + point_key(r) + "/" + r.at("stages") + "/" + r.at("solver")][r.at("hardware")] =
        num(r, "step_ms");
  }
  int slower = 0;
  for (const auto& [k, by_hw] : step) {
    CAPTURE(k);
    REQUIRE(by_hw.size() == 2);
    const double h100 = by_hw.at("h100_8x_nvlink"), cluster = by_hw.at("cluster_8gpu_ib");
    CHECK(cluster >= h100 * (1 - 1e-12));
    if (k.find("/8/") != std::string::npos) CHECK(close(cluster, h100, 1e-12));  // inside one node: equal
    slower += cluster > h100 * (1 + 1e-6) ? 1 : 0;
  }
  CHECK(slower > 0);
}

TEST_CASE("a cost model that takes `hardware` is made per profile: every chart is drawn per profile") {
  // compare_time_cost_run: the `time` cost model, causal_document, P = 8 and
  // 16 on the quick config's two profiles.
  const fs::path dir = COMPARE_TIME_COST_DIR;
  const Csv csv = read_csv(dir / "results.csv");
  REQUIRE(csv.header == kColumns);
  CHECK_FALSE(csv.ragged);
  const Sweep s = quick_sweep();
  std::map<std::string, int> rows_per_hw;
  for (const auto& r : csv.rows) {
    CAPTURE(hw_point_key(r));
    REQUIRE(r.at("status") == "ok");
    ++rows_per_hw[r.at("hardware")];
    CHECK(close(num(r, "step_over_bound"), num(r, "step_ms") / num(r, "compute_bound_ms"), 1e-8, 1e-12));
  }
  REQUIRE(rows_per_hw.size() == s.hardware.size());
  for (const auto& [hw, n] : rows_per_hw) CHECK(n == rows_per_hw.begin()->second);
  // Volumes, latency and imbalance come from a solve per profile: drawn per profile too.
  std::set<std::string> svgs;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".svg") svgs.insert(e.path().filename().string());
  CHECK(svgs.size() == 7 * s.hardware.size());
  for (const auto& hw : s.hardware)
    for (const char* m : {"fwd_send", "latency", "imbalance", "step_time"})
      CHECK_MESSAGE(svgs.count(std::string("causal_document_") + m + "_" + hw + ".svg"), m << " " << hw);
}

TEST_CASE("layout and uses axes: every (layout, uses) per point, static skipped under fixed, cost per use") {
  const Csv csv = read_csv(fs::path(COMPARE_ONLINE_DIR) / "results.csv");
  REQUIRE(csv.header == kColumns);
  CHECK_FALSE(csv.ragged);
  std::map<std::string, int> per_variant;
  int static_skipped = 0;
  for (const auto& r : csv.rows) {
    CAPTURE(r.at("row") + " " + r.at("solver") + " " + r.at("layout") + " " + r.at("uses") + " P" + r.at("cp_size"));
    ++per_variant[r.at("layout") + "/" + r.at("uses")];
    if (r.at("solver") == "static" && r.at("layout") == "fixed") {
      CHECK(r.at("status") == "skipped");
      CHECK(r.at("error").find("problem.layout: fixed rules out") != std::string::npos);
      ++static_skipped;
      continue;
    }
    REQUIRE(r.at("status") == "ok");
    // Each rank's own path: grid + solve + its plan, at most the whole path's parts plus a rank's build.
    const double rank_path = num(r, "rank_path_ms");
    CHECK(rank_path >= num(r, "grid_ms") + num(r, "solve_ms") - 1e-9);
    const double ratio = num(r, "step_over_bound");
    const double bound = num(r, "compute_bound_ms");
    const std::string uses = r.at("uses");
    const double want = uses == "ahead" ? ratio : ratio + rank_path / std::stod(uses) / bound;
    CHECK(close(num(r, "cost_per_use"), want, 1e-8, 1e-12));
  }
  for (const char* v : {"fixed/1", "fixed/8", "fixed/32", "fixed/ahead", "planned/1", "planned/8", "planned/32",
                        "planned/ahead"})
    CHECK_MESSAGE(per_variant[v] == per_variant["fixed/1"], v);
  CHECK(per_variant.size() == 8);
  CHECK(static_skipped == 4 * (2 * 2 + 2));  // 4 uses x (2 P x 2 packs + 2 mean rows)
}

TEST_CASE("a solver that cannot run is reported on every row, not skipped") {
  // Head groups not flattened: Ulysses cannot split heads, so `usp` fails.
  const Csv csv = read_csv(fs::path(COMPARE_UNFLATTENED_DIR) / "results.csv");
  REQUIRE(csv.header == kColumns);
  const Sweep s = quick_sweep();
  std::set<std::string> solvers;
  int usp_rows = 0;
  for (const auto& r : csv.rows) {
    solvers.insert(r.at("solver"));
    CAPTURE(r.at("solver"));
    CAPTURE(point_key(r));
    if (r.at("solver") == "usp") {
      ++usp_rows;
      CHECK(r.at("status") == "error");
      CHECK(r.at("error").find("flatten") != std::string::npos);
      CHECK(r.at("fwd_send_gib").empty());
    } else {
      CHECK(r.at("status") == "ok");
      CHECK(r.at("usp_placement_fwd_gib").empty());  // no baseline placement to compare with
      CHECK(r.at("fwd_reduction_vs_usp_placement_pct").empty());
      CHECK_FALSE(r.at("fwd_reduction_vs_usp_closed_pct").empty());
    }
  }
  CHECK(solvers == std::set<std::string>(s.solvers.begin(), s.solvers.end()));
  CHECK(usp_rows > 0);
  const std::string md = read_text(fs::path(COMPARE_UNFLATTENED_DIR) / "results.md");
  CHECK(md.find("FAILED") != std::string::npos);
}

#ifdef COMPARE_HAVE_ILP
namespace {

std::string combo_key(const std::map<std::string, std::string>& r) {
  return r.at("mask") + "/" + r.at("cp_size") + "/" + r.at("heads_q") + ":" + r.at("heads_kv") + "/" + r.at("stages");
}

}  // namespace

TEST_CASE("the gap to ilp is each solver's forward send over ilp's, per pack and as a ratio of means") {
  const fs::path dir = COMPARE_QUICK_ILP_DIR;
  const Csv csv = read_csv(dir / "results.csv");
  REQUIRE(csv.header == kColumns);
  CHECK_FALSE(csv.ragged);
  const YAML::Node spec = YAML::LoadFile(COMPARE_QUICK_ILP_CONFIG)["compare"];
  const int ilp_max_p = spec["max_cp_size"]["ilp"].as<int>();

  // ilp's own rows: where it ran, its forward send is what the others are
  // measured against; where it was skipped, nobody has a gap.
  std::map<std::string, double> ilp_fwd;  // pack rows: point + stages -> GiB
  std::set<std::string> ilp_skipped;      // combinations (no pack) where ilp did not run
  int ilp_rows = 0, skipped_rows = 0;
  for (const auto& r : csv.rows) {
    if (r.at("solver") != "ilp") continue;
    CAPTURE(point_key(r));
    const int P = std::stoi(r.at("cp_size"));
    if (P > ilp_max_p) {
      CHECK(r.at("status") == "skipped");
      ++skipped_rows;
      ilp_skipped.insert(combo_key(r));
      continue;
    }
    REQUIRE(r.at("status") == "ok");
    ++ilp_rows;
    const double fwd = num(r, "fwd_send_gib"), bound = num(r, "ilp_bound_gib");
    CHECK(close(num(r, "gap_to_ilp_pct"), 0.0, 0, 1e-9));
    CHECK(close(num(r, "ilp_fwd_gib"), fwd));
    // The bound is proven: no placement moves less; proven optimal means the
    // bound is met (up to the note's whole bytes).
    CHECK(bound <= fwd * (1 + 1e-9));
    const std::string proven = r.at("ilp_proven");
    REQUIRE((proven == "0" || proven == "1"));
    if (proven == "1") CHECK(close(bound, fwd, 1e-6, 1e-8));
    if (proven == "0") CHECK(r.at("note").find("not proven optimal") != std::string::npos);
    if (r.at("row") == "pack") ilp_fwd[point_key(r) + "/" + r.at("stages")] = fwd;
  }
  CHECK(ilp_rows > 0);
  CHECK(skipped_rows > 0);

  for (const auto& r : csv.rows) {
    if (r.at("status") != "ok") continue;
    CAPTURE(r.at("row"));
    CAPTURE(point_key(r));
    CAPTURE(r.at("solver"));
    if (r.at("solver") != "ilp") {
      CHECK(r.at("ilp_bound_gib").empty());
      CHECK(r.at("ilp_proven").empty());
    }
    if (ilp_skipped.count(combo_key(r))) {
      CHECK(r.at("gap_to_ilp_pct").empty());
      CHECK(r.at("ilp_fwd_gib").empty());
      continue;
    }
    const double fwd = num(r, "fwd_send_gib"), base = num(r, "ilp_fwd_gib");
    CHECK(close(num(r, "gap_to_ilp_pct"), 100.0 * (fwd / base - 1.0), 1e-6, 1e-6));
    if (r.at("row") == "pack") {
      const auto it = ilp_fwd.find(point_key(r) + "/" + r.at("stages"));
      REQUIRE(it != ilp_fwd.end());
      CHECK(close(base, it->second));
    } else {
      // Mean rows: ratio of means (the mean of ilp's per-pack sends), not a mean of gaps.
      double mean = 0;
      int n = 0;
      for (const auto& [k, v] : ilp_fwd)
        if (k.rfind(r.at("mask") + "/" + r.at("cp_size") + "/" + r.at("heads_q") + ":" + r.at("heads_kv") + "/", 0) == 0 &&
            k.substr(k.rfind('/') + 1) == r.at("stages")) {
          mean += v;
          ++n;
        }
      REQUIRE(n == std::stoi(r.at("packs")));
      CHECK(close(base, mean / n, 1e-8, 1e-9));
    }
  }

  const std::string md = read_text(dir / "results.md");
  CHECK(md.find("| gap to ilp (% fwd) |") != std::string::npos);
  CHECK(md.find("ratio of means") != std::string::npos);
}
#endif
