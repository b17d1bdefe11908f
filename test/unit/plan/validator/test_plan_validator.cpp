// Plan validator: a valid plan passes; deliberately corrupted plans are
// rejected with a problem that names the fault.
#include <doctest/doctest.h>

#include <algorithm>
#include <fmt/format.h>
#include <random>

#include "brute_force.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/validator.hpp"
#include "plan_fixtures.hpp"

using namespace cpsched;

namespace {

bool mentions(const std::vector<std::string>& problems, const std::string& what) {
  for (const auto& p : problems)
    if (p.find(what) != std::string::npos) return true;
  return false;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

struct Fixture {
  Assignment a;
  Plan plan;
  Fixture() {
    std::mt19937_64 rng(3);
    auto g = test::make_grid(test::random_document_mask(37, rng), 4, {4, 2, 8, 2});
    a = test::random_assignment(g, rng);
    plan = build_plan(a, 2);
  }
  // A (rank, stage) whose forward QO arg sends something.
  std::pair<std::size_t, std::size_t> sender() const {
    for (std::size_t r = 0; r < plan.ranks.size(); ++r)
      for (std::size_t s = 0; s < plan.ranks[r].fwd.comm.stages.size(); ++s)
        if (!plan.ranks[r].fwd.comm.stages[s].qo.input_ranges.empty()) return {r, s};
    FAIL("no QO sender");
    return {0, 0};
  }
  std::pair<std::size_t, std::size_t> receiver() const {
    for (std::size_t r = 0; r < plan.ranks.size(); ++r)
      for (std::size_t s = 0; s < plan.ranks[r].fwd.comm.stages.size(); ++s)
        if (!plan.ranks[r].fwd.comm.stages[s].qo.src_index.empty()) return {r, s};
    FAIL("no QO receiver");
    return {0, 0};
  }
};

}  // namespace

TEST_CASE("the fixture's plan is valid") {
  Fixture f;
  const auto problems = validate_plan(f.a, f.plan);
  CHECK_MESSAGE(problems.empty(), joined(problems));
  CHECK(brute_force_plan_coverage(f.a, f.plan).empty());
}

TEST_CASE("a dropped input split is reported by the receiver that misses it") {
  Fixture f;
  auto [r, s] = f.sender();
  GroupCollectiveArg& qo = f.plan.ranks[r].fwd.comm.stages[s].qo;
  const Rank dst = qo.dst_indices[0][0];
  qo.input_split_sizes.erase(qo.input_split_sizes.begin());
  qo.input_ranges.erase(qo.input_ranges.begin());
  qo.input_groups.erase(qo.input_groups.begin());
  qo.dst_indices.erase(qo.dst_indices.begin());
  const auto problems = validate_plan(f.a, f.plan);
  REQUIRE_FALSE(problems.empty());
  CHECK_MESSAGE(mentions(problems, fmt::format("QO rank {}: output split", dst)), joined(problems));
  CHECK_FALSE(brute_force_plan_coverage(f.a, f.plan).empty());
}

TEST_CASE("a split dropped on both sides leaves entries uncovered") {
  Fixture f;
  auto [r, s] = f.receiver();
  StageComm& sc = f.plan.ranks[r].fwd.comm.stages[s];
  const Rank src = sc.qo.src_index.back();
  const Token size = sc.qo.output_split_sizes.back();
  sc.qo.output_split_sizes.pop_back();
  sc.qo.src_index.pop_back();
  sc.qo.output_groups.pop_back();
  sc.num_remote_qo_tokens -= size;
  // Remove r from the last split of src that names it.
  GroupCollectiveArg& in = f.plan.ranks[static_cast<std::size_t>(src)].fwd.comm.stages[s].qo;
  for (std::size_t i = in.dst_indices.size(); i-- > 0;) {
    auto& d = in.dst_indices[i];
    auto it = std::find(d.begin(), d.end(), static_cast<Rank>(r));
    if (it == d.end()) continue;
    d.erase(it);
    if (d.empty()) {
      in.input_split_sizes.erase(in.input_split_sizes.begin() + static_cast<std::ptrdiff_t>(i));
      in.input_ranges.erase(in.input_ranges.begin() + static_cast<std::ptrdiff_t>(i));
      in.input_groups.erase(in.input_groups.begin() + static_cast<std::ptrdiff_t>(i));
      in.dst_indices.erase(in.dst_indices.begin() + static_cast<std::ptrdiff_t>(i));
    }
    break;
  }
  const auto problems = validate_plan(f.a, f.plan);
  REQUIRE_FALSE(problems.empty());
  CHECK_MESSAGE(mentions(problems, "outside its QO buffer"), joined(problems));
  CHECK_FALSE(brute_force_plan_coverage(f.a, f.plan).empty());
}

TEST_CASE("a wrong source rank is reported") {
  Fixture f;
  auto [r, s] = f.receiver();
  GroupCollectiveArg& qo = f.plan.ranks[r].fwd.comm.stages[s].qo;
  const Rank was = qo.src_index[0];
  Rank other = (was + 1) % 4;
  if (other == static_cast<Rank>(r)) other = (other + 1) % 4;
  qo.src_index[0] = other;
  const auto problems = validate_plan(f.a, f.plan);
  REQUIRE_FALSE(problems.empty());
  CHECK_MESSAGE(mentions(problems, fmt::format("output split 0 is (src {},", other)), joined(problems));
}

TEST_CASE("an off-by-one arg range is reported") {
  Fixture f;
  SUBCASE("past the end of the local shard") {
    AttnArg& x = f.plan.ranks[0].bwd.calc.local_attn_args.at(0);
    x.q.end = 10 + f.plan.sharding.rank_tokens(0).size();
    const auto problems = validate_plan(f.a, f.plan);
    CHECK_MESSAGE(mentions(problems, "outside its local buffer"), joined(problems));
  }
  SUBCASE("one row off inside the buffer") {
    // Move a local arg up by one row: still in bounds, but the wrong entries.
    // (Growing a causal arg by a row on top may add no entry at all, so that
    // would not be a corruption.)
    for (RankPlan& rp : f.plan.ranks)
      for (AttnArg& x : rp.fwd.calc.local_attn_args)
        if (x.q.begin > 0) {
          x.q.begin -= 1;
          x.q.end -= 1;
          const auto problems = validate_plan(f.a, f.plan);
          REQUIRE_FALSE(problems.empty());
          CHECK_FALSE(brute_force_plan_coverage(f.a, f.plan).empty());
          return;
        }
    FAIL("no local arg off row 0");
  }
  SUBCASE("an input split one token off") {
    auto [r, s] = f.sender();
    GroupCollectiveArg& qo = f.plan.ranks[r].fwd.comm.stages[s].qo;
    qo.input_ranges[0].begin += 1;
    qo.input_split_sizes[0] -= 1;
    const auto problems = validate_plan(f.a, f.plan);
    CHECK_MESSAGE(mentions(problems, "output split"), joined(problems));
  }
}

TEST_CASE("a task placed twice is reported as entries computed twice") {
  Fixture f;
  for (RankPlan& rp : f.plan.ranks)
    if (!rp.fwd.calc.local_attn_args.empty()) {
      rp.fwd.calc.local_attn_args.push_back(rp.fwd.calc.local_attn_args.front());
      break;
    }
  const auto problems = validate_plan(f.a, f.plan);
  CHECK_MESSAGE(mentions(problems, "computed twice"), joined(problems));
  CHECK(mentions(problems, "fwd metrics rank"));  // the load no longer matches
  CHECK_FALSE(brute_force_plan_coverage(f.a, f.plan).empty());
}

TEST_CASE("a task computed by another rank than the assignment's is reported") {
  Fixture f;
  // Move rank 0's first local arg to rank 1 as a (now wrong) local arg there.
  auto& from = f.plan.ranks[0].fwd.calc.local_attn_args;
  REQUIRE_FALSE(from.empty());
  f.plan.ranks[1].fwd.calc.local_attn_args.push_back(from.front());
  from.erase(from.begin());
  const auto problems = validate_plan(f.a, f.plan);
  CHECK_FALSE(problems.empty());
}

TEST_CASE("stage-0 args must not read remote buffers; stage counts must agree") {
  Fixture f;
  SUBCASE("remote in stage 0") {
    auto& st1 = f.plan.ranks[0].fwd.calc.remote_attn_args[0];
    REQUIRE_FALSE(st1.empty());
    f.plan.ranks[0].fwd.calc.local_attn_args.push_back(st1.front());
    CHECK(mentions(validate_plan(f.a, f.plan), "stage-0 arg reads a remote buffer"));
  }
  SUBCASE("missing stage") {
    f.plan.ranks[2].bwd.comm.stages.pop_back();
    CHECK(mentions(validate_plan(f.a, f.plan), "comm stages"));
  }
}

TEST_CASE("the problem list is capped") {
  Fixture f;
  for (RankPlan& rp : f.plan.ranks) rp.fwd.calc.local_attn_args.clear();
  for (RankPlan& rp : f.plan.ranks) rp.bwd.calc.local_attn_args.clear();
  const auto problems = validate_plan(f.a, f.plan, {true, 5});
  REQUIRE(problems.size() == 6);
  CHECK(problems.back().find("more problems") != std::string::npos);
}
