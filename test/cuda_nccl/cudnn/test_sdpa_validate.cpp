// cuDNN's graphs for every batch form the plans of configs/ produce, built
// and validated without a device: the frontend's validate() at sm_90 (H100,
// H200) checks the graph against cuDNN's support surface (layouts, ragged
// offsets, masks, GQA, head dims) with the cuDNN library of this machine and
// no handle. What it cannot check without a device (the engine heuristics,
// the execution plan, the numbers) is the GPU check's (tools/gpu_check.sh).
//
// Every run config and every axis of the compare configs (masks, heads) is
// planned at a small size with remote buffers on both sides, with and
// without head groups, plus a sliding window (inv_causal and bi_causal
// pieces); the union of their batch geometries, both passes, is validated.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <set>
#include <yaml-cpp/yaml.h>

#include "cpsched/base/error.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/mask/generators.hpp"
#include "device/cudnn_sdpa.hpp"
#include "host/plan/sdpa_batches.hpp"
#include "plans.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;
namespace fs = std::filesystem;

namespace {

constexpr int kSm90 = 90;

struct Variant {
  fs::path file;
  std::vector<std::string> overrides;
  std::string name() const {
    std::string s = file.filename().string();
    for (const auto& o : overrides) s += " " + o;
    return s;
  }
};

// The config's own problem, each compare axis value, and a sliding window.
std::vector<Variant> variants_of(const fs::path& file) {
  const std::vector<std::string> small = {"problem.seqlen_per_rank=256", "problem.layout=fixed"};
  std::vector<Variant> out;
  out.push_back({file, small});
  const YAML::Node root = YAML::LoadFile(file.string());
  if (const YAML::Node cmp = root["compare"]) {
    if (const YAML::Node masks = cmp["masks"])
      for (const auto& m : masks) {
        auto o = small;
        o.push_back("problem.mask.kind=" + m.as<std::string>());
        out.push_back({file, o});
      }
    if (const YAML::Node heads = cmp["heads"])
      for (const auto& h : heads) {
        auto o = small;
        o.push_back(fmt::format("problem.heads={{q: {}, kv: {}}}", h["q"].as<int>(), h["kv"].as<int>()));
        out.push_back({file, o});
      }
  }
  auto o = small;
  o.push_back("problem.mask={kind: sliding_window, window: [70, 0], histogram: data/doc_length_distribution.csv}");
  out.push_back({file, o});
  return out;
}

bool is_config(const fs::path& p) { return p.extension() == ".yaml" && p.parent_path().filename() == "configs"; }

}  // namespace

TEST_CASE("every batch form of configs/ builds a cuDNN graph that validates at sm_90") {
  if (!g::cudnn::built()) {
    MESSAGE("cuDNN path not built: ", g::cudnn::describe_build());
    return;
  }
  MESSAGE(g::cudnn::describe_build());
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(CPSCHED_SOURCE_DIR) / "configs"))
    if (is_config(e.path())) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 3);

  std::vector<g::SdpaGeometry> forms;
  std::set<std::string> masks_seen;
  int planned = 0, mla = 0;
  for (const fs::path& f : files)
    for (const Variant& v : variants_of(f)) {
      INFO(v.name());
      const Config cfg = load_config(v.file, v.overrides);
      if (!cfg.heads.is_gqa()) {
        // MLA (configs/dsa.yaml): outside cuDNN's SDPA, its args run on the runtime's own
        // kernels (cudnn_dsa_emulate, test_cuda_host_heads); no graph to validate.
        CHECK(g::HeadLayout::of(make_problem(cfg)).is_mla());
        CHECK(!g::sdpa_heads_reason(cfg.heads.dqk(), cfg.heads.dv(), cfg.heads.kv_shared, cfg.heads.dtype_bytes).empty());
        ++mla;
        continue;
      }
      // Head groups flattened or not (selections per KV head need them flattened).
      std::vector<bool> flats = {true, false};
      if (is_index_kind(cfg.mask.kind)) flats = {cfg.grid.flatten_head_groups};
      for (const bool flat : flats) {
        Config c = cfg;
        c.cp_size = std::min(cfg.cp_size, 4);
        c.grid.flatten_head_groups = flat;
        auto problem = std::make_shared<const Problem>(make_problem(c));
        const test::PlanCase pc = test::plan_case_of(problem, c.cp_size, 2, 11);
        const g::HeadLayout h = g::HeadLayout::of(*problem);
        for (Rank r = 0; r < c.cp_size; ++r) {
          const RankPlan& rp = pc.plan.ranks[static_cast<std::size_t>(r)];
          for (const auto& [pass, pp] : {std::pair{g::Pass::fwd, &rp.fwd}, std::pair{g::Pass::bwd, &rp.bwd}}) {
            g::SdpaPolicy pol;
            pol.min_band_area = 1;
            const g::PassSdpa sd =
                g::plan_sdpa(*pp, pass, h, g::remote_shape(*pp, h), pc.plan.sharding.rank_tokens(r).size(), pol);
            for (const auto& stage : sd.batches)
              for (const g::SdpaBatch& b : stage) {
                masks_seen.insert(std::string(g::to_string(b.geo.mask)));
                if (std::find(forms.begin(), forms.end(), b.geo) == forms.end()) forms.push_back(b.geo);
              }
          }
        }
        ++planned;
      }
    }
  MESSAGE(planned, " plans, ", forms.size(), " distinct graph geometries, ", mla, " MLA variants");
  CHECK(masks_seen.size() == 4);  // full, causal, inv_causal, bi_causal
  for (const g::SdpaGeometry& geo : forms) {
    INFO(g::describe(geo));
    CHECK(g::cudnn::validate(geo, kSm90) == "");
  }
}

TEST_CASE("validate() is not a formality: it refuses what cuDNN cannot run") {
  if (!g::cudnn::built()) return;
  g::SdpaGeometry geo{g::Pass::fwd, g::SdpaMask::causal, 0, 4, 8, 2, 128, 256, 256, 8, 2, 1024, 1024, 0.088f};
  CHECK(g::cudnn::validate(geo, kSm90) == "");
  g::SdpaGeometry bad = geo;
  bad.kv_heads = 3;  // 8 query heads over 3 kv heads
  CHECK(g::cudnn::validate(bad, kSm90) != "");
  bad = geo;
  bad.dim = 20;  // not a multiple of 8
  bad.pass = g::Pass::bwd;
  CHECK(g::cudnn::validate(bad, kSm90) != "");
}
