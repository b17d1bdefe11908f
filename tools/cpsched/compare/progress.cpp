#include "compare/progress.hpp"

#include <cstdio>
#include <fmt/format.h>
#include <unistd.h>

namespace cpsched::cli {

Progress::Progress(long total, bool enabled)
    : total_(total > 0 ? total : 1), enabled_(enabled), start_(std::chrono::steady_clock::now()) {}

bool Progress::stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

void Progress::step(const std::string& label) {
  ++done_;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  // Redraw at most ~10 times a second: a terminal is slow compared with small solves.
  if (done_ < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done_ / total_);
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double eta = done_ > 0 ? elapsed * static_cast<double>(total_ - done_) / static_cast<double>(done_) : 0.0;
  fmt::print(stderr, "\r\033[K[{}{}] {}/{}  {:.0f}s elapsed, ~{:.0f}s left  {}", std::string(filled, '#'),
             std::string(kWidth - filled, '.'), done_, total_, elapsed, eta, label);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_) return;
  fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
}

}  // namespace cpsched::cli
