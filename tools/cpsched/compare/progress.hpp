#pragma once
// A one-line progress bar on stderr, drawn only when stderr is a terminal (so
// logs and pipes stay clean).
#include <chrono>
#include <string>

namespace cpsched::cli {

class Progress {
 public:
  explicit Progress(long total, bool enabled);
  static bool stderr_is_tty();
  // One unit done; `label` says what ran.
  void step(const std::string& label);
  // Clears the bar.
  void finish();

 private:
  long total_;
  long done_ = 0;
  bool enabled_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace cpsched::cli
