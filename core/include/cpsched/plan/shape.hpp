#pragma once
// The shape of the plan the host builds from an assignment: how many remote
// stages follow the local stage 0, whether the collectives relay across
// nodes (plan.hpp), and which stage cut a plan of two or more stages on a
// cluster takes. Stages and relays may be fixed by the user or left to the
// solver (`auto`); the host resolves what the solver left open (stages: 1,
// relays: off, the cut: the faster of the two). One type for the config, the
// Session, the solver's input and its answer.
#include <cstdint>
#include <string>

namespace cpsched {

struct PlanShape {
  enum class Relay : std::uint8_t { off = 0, on = 1, automatic = 2 };
  static constexpr int kAutoStages = 0;
  static constexpr int kMaxStages = 64;

  int stages = 1;           // remote stages N in [1, kMaxStages], or kAutoStages
  Relay relay = Relay::off;
  // Ranks per node that relays group by (relay on or auto); 0: the cost
  // model's hardware profile's GPUs per node, filled in by the host.
  int node_size = 0;
  // With 2+ stages on a hardware profile (PlanOptions::stage_cut): automatic
  // prices the receivers' and the ports' cut with the timing model (two
  // price sheets of every rank, on each rank that builds its plan) and
  // takes the faster; a solver that knows which is faster says so. Not a
  // config key: the user's shape leaves it automatic.
  enum class Cut : std::uint8_t { automatic = 0, receivers = 1, ports = 2 };
  Cut cut = Cut::automatic;

  static PlanShape fixed(int stages, int relay_node_size = 0, Cut cut = Cut::automatic) {
    return {stages, relay_node_size >= 2 ? Relay::on : Relay::off, relay_node_size >= 2 ? relay_node_size : 0, cut};
  }
  bool auto_stages() const { return stages == kAutoStages; }
  bool auto_relay() const { return relay == Relay::automatic; }
  // Nothing left to choose: N stages, relays on (with a node size) or off.
  bool resolved() const { return !auto_stages() && !auto_relay() && (relay == Relay::off || node_size >= 2); }
  // The node size of a resolved shape's relays, 0 without relays (PlanOptions::relay_node_size).
  int relay_node_size() const { return relay == Relay::on && node_size >= 2 ? node_size : 0; }
  // This shape with what it leaves open taken from `choice` (the solver's
  // answer) and, where that leaves it open too, the defaults: 1 stage, no
  // relays. Fixed parts stay as they are. The choice's cut is taken only
  // with its stage count (it was chosen for that count).
  PlanShape resolve(const PlanShape& choice) const;
  // Checks the ranges; `who` prefixes the message. Throws cpsched::Error.
  void validate(const std::string& who) const;
  // "3 stages, relays on nodes of 8"; "auto stages, relays auto"; "2 stages,
  // no relays, the ports' cut".
  std::string str() const;
  friend bool operator==(const PlanShape&, const PlanShape&) = default;
};

}  // namespace cpsched
