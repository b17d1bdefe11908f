// A well-formed solver with two parameters of every type. It writes the
// values it received into Solution::note, so tests see what the factory got.
#include <stdexcept>
#include <string>

#include <cpsched/plugin/plugin.hpp>
#include <cpsched/plugin/solver.hpp>

namespace {

class TestParams final : public cpsched::Solver {
 public:
  explicit TestParams(const cpsched::Params& p)
      : flag_(p.get_bool("flag")),
        verbose_(p.get_bool("verbose")),
        count_(p.get_int("count")),
        offset_(p.get_int("offset")),
        ratio_(p.get_real("ratio")),
        scale_(p.get_real("scale")),
        label_(p.get_string("label")),
        mode_(p.get_string("mode")) {}

  // Task t goes to rank (t * count + offset) mod P; label "fail" throws.
  cpsched::Solution solve(const cpsched::SolveInput& in) override {
    if (label_ == "fail") throw std::runtime_error("asked to fail by label=fail");
    const cpsched::TaskGrid& g = *in.grid();
    const std::int64_t P = g.cp_size();
    cpsched::Solution sol;
    cpsched::Assignment& a = sol.assignment;
    a.grid = in.grid();
    for (cpsched::TaskId t = 0; t < g.num_tasks(); ++t) {
      a.rank.push_back(static_cast<cpsched::Rank>(((t * count_ + offset_) % P + P) % P));
    }
    sol.note = "flag=" + cpsched::format_param(flag_) + " verbose=" + cpsched::format_param(verbose_) +
             " count=" + std::to_string(count_) + " offset=" + std::to_string(offset_) +
             " ratio=" + cpsched::format_param(ratio_) + " scale=" + cpsched::format_param(scale_) +
             " label=" + label_ + " mode=" + mode_;
    return sol;
  }

 private:
  bool flag_, verbose_;
  std::int64_t count_, offset_;
  double ratio_, scale_;
  std::string label_, mode_;
};

const cpsched_param_spec kParams[] = {
    {"flag", CPSCHED_PARAM_BOOL, "false", "a switch"},
    {"verbose", CPSCHED_PARAM_BOOL, "true", "another switch"},
    {"count", CPSCHED_PARAM_INT, "3", "a count"},
    {"offset", CPSCHED_PARAM_INT, "-2", "a signed integer"},
    {"ratio", CPSCHED_PARAM_REAL, "0.5", "a real"},
    {"scale", CPSCHED_PARAM_REAL, "1e3", "a real in exponent form"},
    {"label", CPSCHED_PARAM_STRING, "hello", "a word"},
    {"mode", CPSCHED_PARAM_STRING, "'two words'", "a quoted string"},
};

}  // namespace

CPSCHED_SOLVER_PLUGIN(TestParams, "test_params", "test solver: round robin with a stride", kParams)
