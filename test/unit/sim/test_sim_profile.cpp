// Hardware profiles of the sim timing model: the bundled files load, and
// broken files give errors that name the file, line and key.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>

#include "cpsched/base/error.hpp"
#include "cpsched/hardware/profile.hpp"
#include "sim_runner.hpp"

using namespace cpsched;
using namespace cpsched::sim;

namespace {
// kGood with the first `from` swapped for `to` (substr concatenation: GCC 12's
// -Wrestrict misfires on std::string::replace here).
std::string swap_text(const std::string& from, const std::string& to);

const char* kGood = R"(name: t
attention_tflops: {fwd: 500, bwd: 400}
hbm_gb_s: 2500
gpus_per_node: 4
intra_node: {bandwidth_gb_s: 300, latency_us: 3}
inter_node: {bandwidth_gb_s: 40, latency_us: 10}
overlap: false
)";

std::string swap_text(const std::string& from, const std::string& to) {
  const std::string t = kGood;
  const std::size_t at = t.find(from);
  REQUIRE(at != std::string::npos);
  return t.substr(0, at) + to + t.substr(at + from.size());
}
}  // namespace

TEST_CASE("the three bundled profiles load and equal their files") {
  const auto names = bundled_hardware_names();
  for (const char* n : {"h100_8x_nvlink", "h200_8x_nvlink", "cluster_8gpu_ib"}) {
    CAPTURE(n);
    REQUIRE(std::find(names.begin(), names.end(), n) != names.end());
    const HardwareProfile b = resolve_hardware_profile(n);
    const HardwareProfile f =
        resolve_hardware_profile(std::string(CPSCHED_SOURCE_DIR) + "/configs/hardware/" + n + ".yaml");
    CHECK(b.name == n);
    CHECK(b.fwd_tflops == f.fwd_tflops);
    CHECK(b.inter_node.bandwidth_gb_s == f.inter_node.bandwidth_gb_s);
    CHECK(b.gpus_per_node == 8);
    CHECK(b.overlap);
    CHECK(b.intra_node.bandwidth_gb_s > b.inter_node.bandwidth_gb_s);
    CHECK(b.hbm_gb_s == f.hbm_gb_s);
    // Sustained copy bandwidth: below the HBM peak (H100 3350 GB/s, H200 4800 GB/s).
    CHECK(b.hbm_gb_s == (std::string(n) == "h200_8x_nvlink" ? 4000 : 2800));
  }
}

TEST_CASE("a profile's values are read as written") {
  const HardwareProfile p = parse_hardware_profile(kGood, "x.yaml");
  CHECK(p.fwd_tflops == 500);
  CHECK(p.bwd_tflops == 400);
  CHECK(p.hbm_gb_s == 2500);
  CHECK(p.gpus_per_node == 4);
  CHECK(p.intra_node.bandwidth_gb_s == 300);
  CHECK(p.inter_node.latency_us == 10);
  CHECK_FALSE(p.overlap);
  CHECK(p.nodes().same_node(0, 3));
  CHECK_FALSE(p.nodes().same_node(3, 4));
}

TEST_CASE("errors name the file, the line and the key") {
  SUBCASE("unknown key lists the known ones") {
    const std::string t = std::string(kGood) + "overlapp: true\n";
    CHECK_THROWS_WITH_AS(parse_hardware_profile(t, "x.yaml"),
                         doctest::Contains("x.yaml:8:1: key 'overlapp': unknown key (known: name"), Error);
  }
  SUBCASE("missing key") {
    const std::string t = swap_text("gpus_per_node: 4\n", "");
    CHECK_THROWS_WITH_AS(parse_hardware_profile(t, "x.yaml"), doctest::Contains("missing key 'gpus_per_node'"), Error);
  }
  SUBCASE("a profile without hbm_gb_s is an error naming the key") {
    const std::string t = swap_text("hbm_gb_s: 2500\n", "");
    CHECK_THROWS_WITH_AS(parse_hardware_profile(t, "x.yaml"),
                         doctest::Contains("x.yaml:1:1: key '<root>': missing key 'hbm_gb_s'"), Error);
  }
  SUBCASE("non-positive HBM bandwidth") {
    const std::string t = swap_text("hbm_gb_s: 2500", "hbm_gb_s: 0");
    CHECK_THROWS_WITH_AS(parse_hardware_profile(t, "x.yaml"),
                         doctest::Contains("x.yaml:3:11: key 'hbm_gb_s': must be > 0"), Error);
  }
  SUBCASE("non-positive bandwidth") {
    const std::string t = swap_text("300", "0");
    CHECK_THROWS_WITH_AS(parse_hardware_profile(t, "x.yaml"),
                         doctest::Contains("key 'intra_node.bandwidth_gb_s': must be > 0"), Error);
  }
  SUBCASE("non-finite and absurd numbers are refused, naming the key (latency_us: .inf looped the sim)") {
    CHECK_THROWS_WITH_AS(parse_hardware_profile(swap_text("latency_us: 10", "latency_us: .inf"), "x.yaml"),
                         doctest::Contains("key 'inter_node.latency_us': must be a finite number (got .inf)"),
                         Error);
    CHECK_THROWS_WITH_AS(parse_hardware_profile(swap_text("500", ".nan"), "x.yaml"),
                         doctest::Contains("key 'attention_tflops.fwd': must be a finite number (got .nan)"), Error);
    CHECK_THROWS_WITH_AS(parse_hardware_profile(swap_text("hbm_gb_s: 2500", "hbm_gb_s: -.inf"), "x.yaml"),
                         doctest::Contains("key 'hbm_gb_s': must be a finite number"), Error);
    CHECK_THROWS_WITH_AS(parse_hardware_profile(swap_text("300", "1e300"), "x.yaml"),
                         doctest::Contains("key 'intra_node.bandwidth_gb_s': must be at most 1e+06 (got 1e300)"), Error);
    CHECK_THROWS_WITH_AS(parse_hardware_profile(swap_text("latency_us: 3", "latency_us: -1"), "x.yaml"),
                         doctest::Contains("key 'intra_node.latency_us': must be >= 0 (got -1)"), Error);
    CHECK_THROWS_WITH_AS(parse_hardware_profile(swap_text("gpus_per_node: 4", "gpus_per_node: 1e9"), "x.yaml"),
                         doctest::Contains("key 'gpus_per_node': must be at most 1024"), Error);
    // Zero latency is an ideal link, allowed; zero bandwidth is not.
    CHECK_NOTHROW(parse_hardware_profile(swap_text("latency_us: 3", "latency_us: 0"), "x.yaml"));
  }
  SUBCASE("not a number") {
    const std::string t = swap_text("500", "fast");
    CHECK_THROWS_WITH_AS(parse_hardware_profile(t, "x.yaml"),
                         doctest::Contains("x.yaml:2:25: key 'attention_tflops.fwd': expected a number, got 'fast'"),
                         Error);
  }
  SUBCASE("unknown nested key") {
    const std::string t = swap_text("latency_us: 3", "latency: 3");
    CHECK_THROWS_WITH_AS(parse_hardware_profile(t, "x.yaml"),
                         doctest::Contains("key 'intra_node.latency': unknown key (known: bandwidth_gb_s, latency_us)"),
                         Error);
  }
}

TEST_CASE("an unknown profile name lists the bundled ones; a missing file is named") {
  CHECK_THROWS_WITH_AS(resolve_hardware_profile("a100"),
                       doctest::Contains("unknown hardware profile 'a100' (bundled: cluster_8gpu_ib, h100_8x_nvlink, "
                                         "h200_8x_nvlink"),
                       Error);
  CHECK_THROWS_WITH_AS(resolve_hardware_profile("/nonexistent/hw.yaml"), doctest::Contains("/nonexistent/hw.yaml"),
                       Error);
}

TEST_CASE("executor parameters are checked and name the parameter") {
  CHECK(parse_sim_options(Params{}).mode == SimMode::timing);
  CHECK(parse_sim_options(Params{}).hardware.name == "h100_8x_nvlink");
  CHECK(parse_sim_options(Params({{"mode", std::string("numeric")}})).mode == SimMode::numeric);
  CHECK_THROWS_WITH_AS(parse_sim_options(Params({{"mode", std::string("fast")}})),
                       doctest::Contains("parameter 'mode' is 'fast' (expected numeric or timing)"), Error);
  CHECK_THROWS_WITH_AS(parse_sim_options(Params({{"check_tolerance", 0.0}})),
                       doctest::Contains("'check_tolerance' must be > 0"), Error);
  CHECK(parse_sim_options(Params({{"hardware", std::string("cluster_8gpu_ib")}})).hardware.inter_node.bandwidth_gb_s ==
        22);
}
