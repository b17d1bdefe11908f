// Host-side wrappers around plugin objects: the exception fence's far side.
#include "plugin_objects.hpp"

#include <cstring>

#include "cpsched/error.hpp"

namespace cpsched::detail {

namespace {

// Calls the plugin's factory; the plugin writes its error text into `error`.
void* create(const PluginLib& p, const Params& params) {
  char error[2048] = {};
  void* object = p.descriptor->create(&params, error, sizeof error);
  if (object == nullptr) {
    error[sizeof error - 1] = '\0';
    throw Error(p.label + ": " + (error[0] != '\0' ? error : "factory failed without a message"));
  }
  return object;
}

// Owns one plugin object: destroys it through the plugin, then (member order)
// releases the library.
template <class Object>
class Held {
 public:
  Held(const PluginLib& p, const Params& params)
      : lib_(p), object_(static_cast<Object*>(create(p, params))) {}
  ~Held() { lib_.descriptor->destroy(object_); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

  Object& object() const { return *object_; }
  [[noreturn]] void fail(const abi::Status& s) const {
    throw Error(lib_.label + ": " + (s.message.empty() ? "failed without a message" : s.message));
  }

 private:
  PluginLib lib_;
  Object* object_;
};

class SolverHandle final : public Solver {
 public:
  SolverHandle(const PluginLib& p, const Params& params) : held_(p, params) {}
  Assignment solve(const SolveInput& in) override {
    Assignment out;
    const abi::Status s = held_.object().solve(in, out);
    if (!s.ok) held_.fail(s);
    return out;
  }

 private:
  Held<abi::SolverObject> held_;
};

class CostModelHandle final : public CostModel {
 public:
  CostModelHandle(const PluginLib& p, const Params& params)
      : held_(p, params), model_(&held_.object().model()) {}
  double compute(const TaskGrid& g, TaskId t) const override { return model_->compute(g, t); }
  double transfer(TransferKind kind, Token tokens, int heads, Rank src, Rank dst) const override {
    return model_->transfer(kind, tokens, heads, src, dst);
  }

 private:
  Held<abi::CostModelObject> held_;
  const CostModel* model_;  // lives inside the plugin object
};

class ExecutorHandle final : public Executor {
 public:
  ExecutorHandle(const PluginLib& p, const Params& params) : held_(p, params) {}
  ExecutionReport execute(const ExecuteInput& in) override {
    ExecutionReport out;
    const abi::Status s = held_.object().execute(in, out);
    if (!s.ok) held_.fail(s);
    return out;
  }

 private:
  Held<abi::ExecutorObject> held_;
};

}  // namespace

std::unique_ptr<Solver> make_solver_object(const PluginLib& p, const Params& params) {
  return std::make_unique<SolverHandle>(p, params);
}
std::unique_ptr<CostModel> make_cost_model_object(const PluginLib& p, const Params& params) {
  return std::make_unique<CostModelHandle>(p, params);
}
std::unique_ptr<Executor> make_executor_object(const PluginLib& p, const Params& params) {
  return std::make_unique<ExecutorHandle>(p, params);
}

}  // namespace cpsched::detail
