#pragma once
// What a plugin author includes. Write an ordinary class with a constructor
// taking `const cpsched::Params&` (it may throw) and derive it from
// cpsched::Solver, cpsched::CostModel or cpsched::Executor; then, in one .cpp:
//
//   static const cpsched_param_spec kParams[] = {
//       {"mu", CPSCHED_PARAM_REAL, "1.10", "balance target: max load <= mu x mean"}};
//   CPSCHED_SOLVER_PLUGIN(MySolver, "my_solver", "what it does", kParams)
//
// (CPSCHED_SOLVER_PLUGIN_NOPARAMS when there are none). The macros build the
// exception fence and export the descriptor.
#include <cstdio>
#include <exception>
#include <new>

#include <boost/dll/alias.hpp>

#include "cpsched/plugin/params.hpp"
#include "cpsched/plugin/abi.hpp"

namespace cpsched::abi::detail {

inline void write_error(char* buf, std::size_t n, const char* msg) {
  if (buf != nullptr && n > 0) std::snprintf(buf, n, "%s", msg);
}

template <class F>
Status fenced(F&& f) noexcept {
  try {
    f();
    return {};
  } catch (const std::exception& e) {
    return {false, e.what()};
  } catch (...) {
    return {false, "unknown exception"};
  }
}

template <class Impl>
class SolverFence final : public SolverObject {
 public:
  explicit SolverFence(const Params& p) : impl_(p) {}
  Status solve(const SolveInput& in, Solution& out) noexcept override {
    return fenced([&] { out = impl_.solve(in); });
  }
 private:
  Impl impl_;
};

template <class Impl>
class CostModelFence final : public CostModelObject {
 public:
  explicit CostModelFence(const Params& p) : impl_(p) {}
  const CostModel& model() const noexcept override { return impl_; }
 private:
  Impl impl_;
};

template <class Impl>
class ExecutorFence final : public ExecutorObject {
 public:
  explicit ExecutorFence(const Params& p) : impl_(p) {}
  Status execute(const ExecuteInput& in, ExecutionReport& out) noexcept override {
    return fenced([&] { out = impl_.execute(in); });
  }
 private:
  Impl impl_;
};

template <class Object, class Fence>
void* create(const void* params, char* error, std::size_t n) noexcept {
  try {
    return static_cast<Object*>(new Fence(*static_cast<const Params*>(params)));
  } catch (const std::exception& e) {
    write_error(error, n, e.what());
  } catch (...) {
    write_error(error, n, "unknown exception");
  }
  return nullptr;
}

template <class Object, class Fence>
void destroy(void* object) noexcept {
  delete static_cast<Fence*>(static_cast<Object*>(object));
}

}  // namespace cpsched::abi::detail

#define CPSCHED_PLUGIN_IMPL_(KIND, OBJECT, FENCE, CLASS, NAME, DOC, PARAMS, NPARAMS)           \
  extern "C" {                                                                                 \
  const cpsched_plugin_descriptor_t cpsched_plugin_descriptor_value = {                        \
      CPSCHED_PLUGIN_ABI_VERSION,                                                              \
      sizeof(cpsched_plugin_descriptor_t),                                                     \
      CPSCHED_BUILD_SIGNATURE,                                                                 \
      KIND,                                                                                    \
      NAME,                                                                                    \
      DOC,                                                                                     \
      PARAMS,                                                                                  \
      NPARAMS,                                                                                 \
      &::cpsched::abi::detail::create<OBJECT, FENCE<CLASS>>,                                   \
      &::cpsched::abi::detail::destroy<OBJECT, FENCE<CLASS>>};                                 \
  }                                                                                            \
  BOOST_DLL_ALIAS(cpsched_plugin_descriptor_value, cpsched_plugin_descriptor)

#define CPSCHED_PARAMS_N_(P) static_cast<std::uint32_t>(sizeof(P) / sizeof((P)[0]))

#define CPSCHED_SOLVER_PLUGIN(CLASS, NAME, DOC, PARAMS)                                      \
  CPSCHED_PLUGIN_IMPL_(CPSCHED_KIND_SOLVER, ::cpsched::abi::SolverObject,                      \
                       ::cpsched::abi::detail::SolverFence, CLASS, NAME, DOC, PARAMS,          \
                       CPSCHED_PARAMS_N_(PARAMS))
#define CPSCHED_SOLVER_PLUGIN_NOPARAMS(CLASS, NAME, DOC)                                     \
  CPSCHED_PLUGIN_IMPL_(CPSCHED_KIND_SOLVER, ::cpsched::abi::SolverObject,                      \
                       ::cpsched::abi::detail::SolverFence, CLASS, NAME, DOC, nullptr, 0)
#define CPSCHED_COST_MODEL_PLUGIN(CLASS, NAME, DOC, PARAMS)                                  \
  CPSCHED_PLUGIN_IMPL_(CPSCHED_KIND_COST_MODEL, ::cpsched::abi::CostModelObject,               \
                       ::cpsched::abi::detail::CostModelFence, CLASS, NAME, DOC, PARAMS,       \
                       CPSCHED_PARAMS_N_(PARAMS))
#define CPSCHED_COST_MODEL_PLUGIN_NOPARAMS(CLASS, NAME, DOC)                                 \
  CPSCHED_PLUGIN_IMPL_(CPSCHED_KIND_COST_MODEL, ::cpsched::abi::CostModelObject,               \
                       ::cpsched::abi::detail::CostModelFence, CLASS, NAME, DOC, nullptr, 0)
#define CPSCHED_EXECUTOR_PLUGIN(CLASS, NAME, DOC, PARAMS)                                    \
  CPSCHED_PLUGIN_IMPL_(CPSCHED_KIND_EXECUTOR, ::cpsched::abi::ExecutorObject,                  \
                       ::cpsched::abi::detail::ExecutorFence, CLASS, NAME, DOC, PARAMS,        \
                       CPSCHED_PARAMS_N_(PARAMS))
#define CPSCHED_EXECUTOR_PLUGIN_NOPARAMS(CLASS, NAME, DOC)                                   \
  CPSCHED_PLUGIN_IMPL_(CPSCHED_KIND_EXECUTOR, ::cpsched::abi::ExecutorObject,                  \
                       ::cpsched::abi::detail::ExecutorFence, CLASS, NAME, DOC, nullptr, 0)
