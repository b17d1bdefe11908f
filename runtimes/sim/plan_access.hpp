#pragma once
// Small helpers both execution modes share: which pass of a rank's plan, and
// where the heads of a head group sit in local and remote buffers.
#include <string>
#include <string_view>

#include "cpsched/plan/plan.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched::sim {

using ::cpsched::RowKind;
using ::cpsched::Pass;
using ::cpsched::collective;
using ::cpsched::pass_plan;
using ::cpsched::to_string;

// Local buffers hold every head; a remote row holds the heads of one group
// (every group has the same count, so remote rows have a fixed width).
// "D = 128" under GQA; "d_qk = 576, d_v = 512, shared KV latent" otherwise.
inline std::string head_dims_text(const Heads& h) {
  if (h.is_gqa()) return "D = " + std::to_string(h.dim);
  return "d_qk = " + std::to_string(h.dqk()) + ", d_v = " + std::to_string(h.dv()) +
         (h.kv_shared ? ", shared KV latent" : "");
}

struct HeadLayout {
  int hq = 1, hkv = 1, dim = 1;  // dim = d_qk
  int dim_v = 1;                 // d_v (resolved)
  bool kv_shared = false;        // V is K's first d_v dims: no V / dV rows of its own
  int groups = 1;        // head groups of the plan (hkv when flattened, else 1)
  int q_per_group = 1;   // query heads of a group
  int kv_per_group = 1;  // kv heads of a group
  bool flattened = true;

  static HeadLayout of(const Problem& p) {
    HeadLayout h;
    h.hq = p.heads.q;
    h.hkv = p.heads.kv;
    h.dim = p.heads.dqk();
    h.dim_v = p.heads.dv();
    h.kv_shared = p.heads.kv_shared;
    h.groups = p.num_groups();
    h.q_per_group = p.q_heads_per_task();
    h.kv_per_group = p.kv_heads_per_task();
    h.flattened = p.grid.flatten_head_groups;
    return h;
  }
  // Flattened plans name a group in [0, G); unflattened ones use -1 (all heads).
  bool valid_group(int g) const { return flattened ? (g >= 0 && g < groups) : g == -1; }
  int q_head0(int g) const { return g < 0 ? 0 : g * q_per_group; }
  int kv_head0(int g) const { return g < 0 ? 0 : g * kv_per_group; }
};

}  // namespace cpsched::sim
