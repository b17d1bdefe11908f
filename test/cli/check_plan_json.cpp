// The quickstart's plan JSON, as a user reads it (docs/plan_format.md): format, every
// task on a valid rank, per head group the task areas add up to the mask's
// area, per-rank CalcMeta/CommMeta present for both passes, metrics totals.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cpsched/mask/mask.hpp"

using nlohmann::json;

TEST_CASE("quickstart plan JSON") {
  std::ifstream f(PLAN_JSON);
  REQUIRE(f.good());
  const json plan = json::parse(f);
  CHECK(plan.at("format") == "cpsched-plan/1");
  const json& pr = plan.at("problem");
  const int P = pr.at("cp_size");
  const int G = pr.at("head_groups");
  CHECK(P == 8);
  // The mask's area from its slices (closed forms of core, checked against brute force elsewhere).
  std::int64_t mask_area = 0;
  for (const json& s : pr.at("mask")) {
    const auto t = cpsched::parse_mask_type(s.at("type").get<std::string>());
    REQUIRE(t.has_value());
    mask_area += cpsched::slice_area({{s.at("q")[0], s.at("q")[1]}, {s.at("k")[0], s.at("k")[1]}, *t});
  }
  CHECK(mask_area > 0);
  std::map<int, std::int64_t> area_per_group;
  for (const json& t : plan.at("tasks")) {
    const int r = t.at("rank");
    CHECK(r >= 0);
    CHECK(r < P);
    area_per_group[t.at("group").get<int>()] += t.at("area").get<std::int64_t>();
  }
  REQUIRE(static_cast<int>(area_per_group.size()) == G);
  for (const auto& [g, a] : area_per_group) {
    INFO("head group ", g);
    CHECK(a == mask_area);
  }
  REQUIRE(plan.at("ranks").size() == static_cast<std::size_t>(P));
  for (const json& r : plan.at("ranks"))
    for (const char* pass : {"fwd", "bwd"}) {
      CHECK(r.at(pass).contains("calc"));
      CHECK(r.at(pass).contains("comm"));
    }
  const json& fwd = plan.at("metrics").at("fwd");
  std::int64_t total = 0;
  for (const json& v : fwd.at("send")) total += v.get<std::int64_t>();
  CHECK(total == fwd.at("total_send").get<std::int64_t>());
}
