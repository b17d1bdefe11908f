#include "cpsched/plan/shape.hpp"
#include "cpsched/plan/uses.hpp"

#include <fmt/format.h>

#include "cpsched/base/error.hpp"

namespace cpsched {

PlanShape PlanShape::resolve(const PlanShape& choice) const {
  PlanShape out = *this;
  if (auto_stages()) out.stages = choice.auto_stages() ? 1 : choice.stages;
  if (auto_relay()) {
    const bool on = choice.relay == Relay::on && choice.node_size >= 2;
    out.relay = on ? Relay::on : Relay::off;
    out.node_size = on ? choice.node_size : 0;
  }
  if (out.relay == Relay::off) out.node_size = 0;
  if (cut == Cut::automatic && out.stages == choice.stages) out.cut = choice.cut;
  return out;
}

void PlanShape::validate(const std::string& who) const {
  if (stages != kAutoStages && (stages < 1 || stages > kMaxStages))
    throw Error(fmt::format("{}: stages must be in [1, {}], or auto (the solver chooses), got {}", who, kMaxStages,
                            stages));
  if (node_size < 0 || node_size == 1)
    throw Error(fmt::format("{}: the relays' node size must be at least 2 ranks (0: the hardware profile's), got {}",
                            who, node_size));
}

std::string PlanShape::str() const {
  std::string s = auto_stages() ? "auto stages" : fmt::format("{} stage{}", stages, stages == 1 ? "" : "s");
  switch (relay) {
    case Relay::off: s += ", no relays"; break;
    case Relay::on: s += node_size >= 2 ? fmt::format(", relays on nodes of {}", node_size) : ", relays on"; break;
    case Relay::automatic: s += ", relays auto"; break;
  }
  if (cut == Cut::receivers) s += ", the receivers' cut";
  if (cut == Cut::ports) s += ", the ports' cut";
  return s;
}

void PlanUses::validate(const std::string& who) const {
  if (uses < 0)
    throw Error(fmt::format("{}: uses must be at least 1 (attention calls that run the plan), or ahead, got {}", who,
                            uses));
}

}  // namespace cpsched
