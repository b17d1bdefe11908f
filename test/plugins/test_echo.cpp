// A well-formed executor: reports the number of tasks, or fails on request.
#include <stdexcept>

#include <cpsched/plugin/executor.hpp>
#include <cpsched/plugin/plugin.hpp>

namespace {

class Echo final : public cpsched::Executor {
 public:
  explicit Echo(const cpsched::Params& p) : fail_(p.get_bool("fail")), text_(p.get_string("text")) {}
  cpsched::ExecutionReport execute(const cpsched::ExecuteInput& in) override {
    if (fail_) throw std::runtime_error("asked to fail by fail=true");
    cpsched::ExecutionReport r;
    r.figures.set("tasks", static_cast<double>(in.grid->num_tasks()));
    r.text = text_;
    return r;
  }

 private:
  bool fail_;
  std::string text_;
};

const cpsched_param_spec kParams[] = {
    {"fail", CPSCHED_PARAM_BOOL, "false", "throw from execute"},
    {"text", CPSCHED_PARAM_STRING, "echo", "the report's text"},
};

}  // namespace

CPSCHED_EXECUTOR_PLUGIN(Echo, "test_echo", "test executor: counts tasks", kParams)
