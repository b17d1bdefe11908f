// Host-side wrappers around plugin objects: the exception fence's far side.
#include "plugin/objects.hpp"

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "cpsched/base/error.hpp"
#include "cpsched/problem/task_grid.hpp"

namespace cpsched::detail {

namespace {

// Calls the plugin's factory; the plugin writes its error text into `error`.
void* create(const PluginLib& p, const Params& params) {
  char error[2048] = {};
  void* object = p.descriptor->create(&params, error, sizeof error);
  if (object == nullptr) {
    error[sizeof error - 1] = '\0';
    throw PluginError(p.label + ": " + (error[0] != '\0' ? error : "factory failed without a message"));
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
  const PluginLib& lib() const { return lib_; }
  [[noreturn]] void fail(const abi::Status& s) const {
    throw PluginError(lib_.label + ": " + (s.message.empty() ? "failed without a message" : s.message));
  }

 private:
  PluginLib lib_;
  Object* object_;
};

// A plugin's grid with the library whose code releases it. Members are
// destroyed in reverse order: the grid first, while the library is mapped.
struct GridKeeper {
  std::shared_ptr<const boost::dll::shared_library> lib;
  std::shared_ptr<const TaskGrid> grid;
};

// A grid the solver made has its shared_ptr control block (and the inline
// destructors it calls) in the plugin's .so, so releasing it after the
// library is unloaded jumps into unmapped code. Make it safe for any order
// of destruction:
//  - the grid refers to the input's Problem (static's dispatch): wrap it in a
//    core-made shared_ptr that also holds the library;
//  - it carries a Problem the plugin made (balanced_bytes re-grids): that
//    Problem can escape through problem_ptr() and outlive any wrapper, so
//    core re-makes both (the grid is a function of problem and sharding).
void adopt_grid(const SolveInput& in, Assignment& out, const PluginLib& lib) {
  if (!out.grid || out.grid == in.grid()) return;
  if (in.grid() && &out.grid->problem() == &in.grid()->problem()) {
    auto keeper = std::make_shared<GridKeeper>(GridKeeper{lib.lib, std::move(out.grid)});
    const TaskGrid* grid = keeper->grid.get();
    out.grid = std::shared_ptr<const TaskGrid>(std::move(keeper), grid);
    return;
  }
  auto problem = std::make_shared<const Problem>(out.grid->problem());
  auto grid = std::make_shared<const TaskGrid>(std::move(problem), out.grid->sharding());
  if (grid->num_tasks() != out.grid->num_tasks()) {
    throw PluginError(lib.label + ": its grid has " + std::to_string(out.grid->num_tasks()) +
                " tasks but rebuilding it from its problem and sharding gives " +
                std::to_string(grid->num_tasks()));
  }
  out.grid = std::move(grid);  // the plugin's grid is released here, its library still held
}

class SolverHandle final : public Solver {
 public:
  SolverHandle(const PluginLib& p, const Params& params) : held_(p, params) {}
  Solution solve(const SolveInput& in) override {
    Solution out;
    const abi::Status s = held_.object().solve(in, out);
    if (!s.ok) held_.fail(s);
    adopt_grid(in, out.assignment, held_.lib());
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
  double transfer(const TaskGrid& g, RowKind kind, Token tokens, int heads, Rank src, Rank dst) const override {
    return model_->transfer(g, kind, tokens, heads, src, dst);
  }
  const HardwareProfile* hardware() const override { return model_->hardware(); }

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
