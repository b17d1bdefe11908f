#include "cpsched/plan/program.hpp"

#include <fmt/format.h>

#include <array>

#include "cpsched/plan/plan.hpp"

namespace cpsched {

namespace {

// The stage after which stage t's outputs go back: its reduce_after when
// that lies in [t, N], else the last stage.
int reduce_point(int t, int after, int n) { return after >= t && after <= n ? after : n; }

std::vector<int> reduce_after_of(const std::vector<StageComm>& stages, RowKind kind) {
  std::vector<int> out;
  out.reserve(stages.size());
  for (const StageComm& s : stages) out.push_back(kind == RowKind::qo ? s.qo_reduce_after : s.kv_reduce_after);
  return out;
}

void emit_casts(Program& p, int s) {
  p.push_back({Op::cast, s, RowKind::qo, Phase::first});
  p.push_back({Op::cast, s, RowKind::qo, Phase::forwarding});
}

void emit_reduces(Program& p, int t, RowKind kind) {
  p.push_back({Op::reduce, t, kind, Phase::forwarding});
  p.push_back({Op::reduce, t, kind, Phase::first});
}

}  // namespace

Program pass_program(int num_stages, std::span<const int> qo_after, std::span<const int> kv_after, Pass pass) {
  const int n = num_stages;
  Program p;
  p.reserve(static_cast<std::size_t>(8 * n + 4));
  if (n >= 1) emit_casts(p, 1);
  p.push_back({Op::compute, 0});
  for (int s = 1; s <= n; ++s) {
    p.push_back({Op::wait_cast, s});
    if (s < n) emit_casts(p, s + 1);
    p.push_back({Op::compute, s});
    for (int t = 1; t <= s; ++t) {
      const auto i = static_cast<std::size_t>(t - 1);
      if (reduce_point(t, qo_after[i], n) == s) emit_reduces(p, t, RowKind::qo);
      if (pass == Pass::bwd && reduce_point(t, kv_after[i], n) == s) emit_reduces(p, t, RowKind::kv);
    }
  }
  p.push_back({Op::wait_reduces, n});
  p.push_back({Op::merge, n});
  return p;
}

Program pass_program(const std::vector<StageComm>& stages, Pass pass) {
  const std::vector<int> qo = reduce_after_of(stages, RowKind::qo), kv = reduce_after_of(stages, RowKind::kv);
  return pass_program(static_cast<int>(stages.size()), qo, kv, pass);
}

namespace {

// What program_error tracks while it walks a program.
class ProgramCheck {
 public:
  ProgramCheck(int n, std::span<const int> qo_after, std::span<const int> kv_after, Pass pass)
      : n_(n), qo_after_(qo_after), kv_after_(kv_after), pass_(pass),
        cast_(static_cast<std::size_t>(n) + 1), waited_(static_cast<std::size_t>(n) + 1, false),
        reduced_(static_cast<std::size_t>(n) + 1) {}

  std::string step(const Instr& i) {
    if (merged_) return "an instruction after merge";
    if (static_cast<int>(i.kind) > 1 || static_cast<int>(i.phase) > 1) return "an unknown kind or phase";
    switch (i.op) {
      case Op::cast: return cast(i);
      case Op::wait_cast: return wait_cast(i.stage);
      case Op::compute: return compute(i.stage);
      case Op::reduce: return reduce(i);
      case Op::wait_reduces: return wait_reduces();
      case Op::merge: return merge();
    }
    return "an unknown op";
  }

  std::string finish() const { return merged_ ? std::string() : "the program does not end with merge"; }

 private:
  bool remote(int s) const { return s >= 1 && s <= n_; }
  static std::size_t at(Phase ph) { return static_cast<std::size_t>(ph); }
  static std::size_t at(RowKind k, Phase ph) { return 2 * static_cast<std::size_t>(k) + at(ph); }

  std::string cast(const Instr& i) {
    if (!remote(i.stage)) return "a cast of a stage outside 1..N";
    auto& c = cast_[static_cast<std::size_t>(i.stage)];
    if (c[at(i.phase)]) return "a second cast of the same stage and phase";
    if (i.phase == Phase::forwarding && !c[at(Phase::first)]) return "a forwarding cast before its first phase";
    c[at(i.phase)] = true;
    return {};
  }

  std::string wait_cast(int s) {
    if (!remote(s)) return "a wait for a stage outside 1..N";
    const auto& c = cast_[static_cast<std::size_t>(s)];
    if (!c[0] || !c[1]) return "a wait for a stage not cast in both phases";
    if (waited_[static_cast<std::size_t>(s)]) return "a second wait for the same stage";
    waited_[static_cast<std::size_t>(s)] = true;
    return {};
  }

  std::string compute(int s) {
    if (s != computed_ + 1) return fmt::format("compute {} where stage {} comes next", s, computed_ + 1);
    if (s > n_) return "a compute of a stage outside 0..N";
    if (s >= 1 && !waited_[static_cast<std::size_t>(s)]) return "a stage computed before its casts are waited for";
    computed_ = s;
    return {};
  }

  std::string reduce(const Instr& i) {
    if (!remote(i.stage)) return "a reduce of a stage outside 1..N";
    if (i.kind == RowKind::kv && pass_ == Pass::fwd) return "a KV reduce in the forward pass";
    const auto t = static_cast<std::size_t>(i.stage);
    const int after = (i.kind == RowKind::qo ? qo_after_ : kv_after_)[t - 1];
    if (computed_ < reduce_point(i.stage, after, n_))
      return fmt::format("a reduce before stage {} (its *_reduce_after) is computed", reduce_point(i.stage, after, n_));
    auto& r = reduced_[t];
    if (r[at(i.kind, i.phase)]) return "a second reduce of the same stage, kind and phase";
    if (i.phase == Phase::first && !r[at(i.kind, Phase::forwarding)]) return "a first-phase reduce before its forwarding phase";
    r[at(i.kind, i.phase)] = true;
    return {};
  }

  std::string wait_reduces() {
    if (waited_reduces_) return "a second wait_reduces";
    if (computed_ != n_) return "wait_reduces before every stage is computed";
    for (int t = 1; t <= n_; ++t) {
      const auto& r = reduced_[static_cast<std::size_t>(t)];
      const bool kv = pass_ == Pass::bwd;
      if (!r[0] || !r[1] || (kv && (!r[2] || !r[3])))
        return fmt::format("wait_reduces before stage {}'s outputs are reduced in both phases", t);
    }
    waited_reduces_ = true;
    return {};
  }

  std::string merge() {
    if (!waited_reduces_) return "merge before wait_reduces";
    merged_ = true;
    return {};
  }

  int n_;
  std::span<const int> qo_after_, kv_after_;
  Pass pass_;
  int computed_ = -1;
  std::vector<std::array<bool, 2>> cast_;  // [stage][phase]
  std::vector<bool> waited_;
  std::vector<std::array<bool, 4>> reduced_;  // [stage][kind x phase]
  bool waited_reduces_ = false, merged_ = false;
};

}  // namespace

std::string program_error(const Program& p, int num_stages, std::span<const int> qo_after,
                          std::span<const int> kv_after, Pass pass) {
  if (num_stages < 0) return "a negative stage count";
  if (qo_after.size() != static_cast<std::size_t>(num_stages) || kv_after.size() != qo_after.size())
    return "reduce points that do not match the stage count";
  ProgramCheck check(num_stages, qo_after, kv_after, pass);
  for (std::size_t k = 0; k < p.size(); ++k)
    if (std::string why = check.step(p[k]); !why.empty())
      return fmt::format("instruction {} ({}): {}", k, to_string(p[k]), why);
  return check.finish();
}

std::string program_error(const Program& p, const std::vector<StageComm>& stages, Pass pass) {
  const std::vector<int> qo = reduce_after_of(stages, RowKind::qo), kv = reduce_after_of(stages, RowKind::kv);
  return program_error(p, static_cast<int>(stages.size()), qo, kv, pass);
}

std::string_view to_string(Op op) {
  switch (op) {
    case Op::cast: return "cast";
    case Op::wait_cast: return "wait_cast";
    case Op::compute: return "compute";
    case Op::reduce: return "reduce";
    case Op::wait_reduces: return "wait_reduces";
    case Op::merge: return "merge";
  }
  return "?";
}

std::string_view to_string(Phase ph) { return ph == Phase::first ? "first" : "forwarding"; }

std::string to_string(const Instr& i) {
  switch (i.op) {
    case Op::cast: return fmt::format("cast {} {}", i.stage, to_string(i.phase));
    case Op::reduce:
      return fmt::format("reduce {} {} {}", i.stage, i.kind == RowKind::qo ? "qo" : "kv", to_string(i.phase));
    default: return fmt::format("{} {}", to_string(i.op), i.stage);
  }
}

}  // namespace cpsched
