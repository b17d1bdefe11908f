#pragma once
// Internal: host-side objects that wrap what a plugin's factory made. Each
// holds its library, so the code it calls stays mapped while it lives.
#include <memory>
#include <string>

#include <boost/dll/shared_library.hpp>

#include "cpsched/plugin/abi.hpp"
#include "cpsched/plugin/registry.hpp"

namespace cpsched::detail {

struct PluginLib {
  std::shared_ptr<const boost::dll::shared_library> lib;
  const cpsched_plugin_descriptor_t* descriptor = nullptr;  // inside `lib`
  std::string label;  // "plugin 'name' (file)", prefix of every runtime error
};

// `params` holds every declared parameter (from Registry::resolve_params).
// Factory failures throw cpsched::Error "<label>: <plugin's message>".
std::unique_ptr<Solver> make_solver_object(const PluginLib& p, const Params& params);
std::unique_ptr<CostModel> make_cost_model_object(const PluginLib& p, const Params& params);
std::unique_ptr<Executor> make_executor_object(const PluginLib& p, const Params& params);

}  // namespace cpsched::detail
