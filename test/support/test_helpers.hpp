#pragma once
// Small helpers several unit tests share.
#include <functional>
#include <string>

#include "cpsched/error.hpp"
#include "cpsched/registry.hpp"

namespace cpsched::test {

// The message of the cpsched::Error that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The build's plugins, scanned once. It lives to the end of the process:
// solvers made from it keep their libraries loaded.
inline Registry& build_registry() {
  static Registry* reg = [] {
    auto* r = new Registry;
    r->scan(CPSCHED_PLUGIN_BUILD_DIR);
    return r;
  }();
  return *reg;
}

}  // namespace cpsched::test
