#pragma once
// Wall time for reports (latencies in plans, benchmarks, the Python
// results); never an input to a decision, which must not depend on a clock.
#include <chrono>

namespace cpsched {

using Clock = std::chrono::steady_clock;

// Milliseconds since t0.
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace cpsched
