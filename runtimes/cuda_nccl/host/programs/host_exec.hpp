#pragma once
// The CPU twin of a kernel launch: runs a CTA program (attention_programs.hpp)
// for every block of the grid, its threads one after the other, phase by
// phase, with the program's shared memory and per-thread state in host memory.
#include <memory>
#include <vector>

namespace cpsched::gpu {

template <class State>
class HostExec {
 public:
  explicit HostExec(int threads) : state_(static_cast<std::size_t>(threads)) {}
  template <class F>
  void each(F&& f) {
    for (std::size_t t = 0; t < state_.size(); ++t) f(static_cast<int>(t), state_[t]);
  }
  void sync() {}
  // f(w) once per warp w (tile_mma.hpp's products are per warp).
  template <class F>
  void warps(F&& f) {
    for (std::size_t w = 0; w * 32 < state_.size(); ++w) f(static_cast<int>(w));
  }

 private:
  std::vector<State> state_;
};

template <class Program>
void run_on_host(const Program& prog, int grid_x, int grid_y = 1) {
  auto smem = std::make_unique<typename Program::Smem>();
  HostExec<typename Program::State> ex(Program::kThreads);
  for (int y = 0; y < grid_y; ++y)
    for (int x = 0; x < grid_x; ++x) prog(ex, x, y, *smem);
}

}  // namespace cpsched::gpu
