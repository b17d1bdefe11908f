#pragma once
// The binary contract between the host and a plugin shared object.
//
// A plugin exports one C-layout descriptor under the alias
// `cpsched_plugin_descriptor` (Boost.DLL alias). The host reads `abi_version`
// first (it never moves), then `descriptor_size`, then compares
// `build_signature` with its own: objects cross the boundary as C++ classes,
// so compiler, standard library ABI and core version must match exactly: the
// core version is raised whenever a class that crosses the boundary changes,
// so an older plugin is refused instead of being called through a stale
// vtable or layout (the history: CHANGELOG.md).
// Objects are made by `create` and destroyed by `destroy` in the plugin; their
// methods are noexcept and report errors as a Status, so no exception ever
// crosses the boundary.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cpsched/plugin/executor.hpp"
#include "cpsched/plugin/solver.hpp"
#include "cpsched/version.hpp"

#define CPSCHED_PLUGIN_ABI_VERSION 1u
#define CPSCHED_PLUGIN_SYMBOL cpsched_plugin_descriptor

#define CPSCHED_STR2(x) #x
#define CPSCHED_STR(x) CPSCHED_STR2(x)

#if defined(__clang__)
#define CPSCHED_COMPILER_ID "clang-" CPSCHED_STR(__clang_major__)
#elif defined(__GNUC__)
#define CPSCHED_COMPILER_ID "gcc-" CPSCHED_STR(__GNUC__)
#else
#define CPSCHED_COMPILER_ID "unknown"
#endif
#if defined(_GLIBCXX_USE_CXX11_ABI)
#define CPSCHED_STDLIB_ID "libstdc++-cxx11abi" CPSCHED_STR(_GLIBCXX_USE_CXX11_ABI)
#elif defined(_LIBCPP_VERSION)
#define CPSCHED_STDLIB_ID "libc++-" CPSCHED_STR(_LIBCPP_VERSION)
#else
#define CPSCHED_STDLIB_ID "unknown-stdlib"
#endif
// What the host and the plugin must agree on, as seen by whoever compiles this.
#define CPSCHED_BUILD_SIGNATURE \
  CPSCHED_COMPILER_ID ";" CPSCHED_STDLIB_ID ";cpsched-" CPSCHED_VERSION_STRING

extern "C" {

enum cpsched_plugin_kind : std::int32_t {
  CPSCHED_KIND_SOLVER = 1,
  CPSCHED_KIND_COST_MODEL = 2,
  CPSCHED_KIND_EXECUTOR = 3,
};

enum cpsched_param_type : std::int32_t {
  CPSCHED_PARAM_BOOL = 0,
  CPSCHED_PARAM_INT = 1,
  CPSCHED_PARAM_REAL = 2,
  CPSCHED_PARAM_STRING = 3,
};

struct cpsched_param_spec {
  const char* name;
  std::int32_t type;          // cpsched_param_type
  const char* default_text;   // parsed as `type`; checked by the host at load
  const char* doc;
};

struct cpsched_plugin_descriptor_t {
  std::uint32_t abi_version;      // CPSCHED_PLUGIN_ABI_VERSION; first, forever
  std::uint32_t descriptor_size;  // sizeof(cpsched_plugin_descriptor_t)
  const char* build_signature;    // CPSCHED_BUILD_SIGNATURE
  std::int32_t kind;              // cpsched_plugin_kind
  const char* name;
  const char* doc;
  const cpsched_param_spec* params;
  std::uint32_t num_params;
  // Makes an object; `params` points to a cpsched::Params with every declared
  // parameter set. On failure returns null and writes a message to `error`.
  void* (*create)(const void* params, char* error, std::size_t error_size);
  void (*destroy)(void* object);
};

}  // extern "C"

namespace cpsched::abi {

struct Status {
  bool ok = true;
  std::string message;
};

// What `create` returns for each kind. Only noexcept calls cross.
class SolverObject {
 public:
  virtual Status solve(const SolveInput& in, Solution& out) noexcept = 0;
 protected:
  ~SolverObject() = default;
};

class CostModelObject {
 public:
  virtual const CostModel& model() const noexcept = 0;  // methods must not throw
 protected:
  ~CostModelObject() = default;
};

class ExecutorObject {
 public:
  virtual Status execute(const ExecuteInput& in, ExecutionReport& out) noexcept = 0;
 protected:
  ~ExecutorObject() = default;
};

}  // namespace cpsched::abi
