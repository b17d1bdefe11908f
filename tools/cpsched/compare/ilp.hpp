#pragma once
// What `cpsched compare` reads from the `ilp` solver: its proven bound and
// whether it proved its placement optimal, parsed from the head of its
// Assignment.note, whose format the plugin documents as stable
// (plugins/ilp/ilp_solver.cpp):
//
//   ilp (OBJECTIVE forward bytes, mu MU): STATUS; incumbent N B (ORIGIN), bound N B, gap G %; ...
//
// STATUS is `optimal` or `not proven optimal` (or a no-placement sentence,
// then no incumbent clause follows); N are whole bytes.
#include <optional>
#include <string>

namespace cpsched::cli {

struct IlpNote {
  bool total_objective = false;  // objective `total`: the bound bounds the forward total send
  bool proven = false;           // the incumbent is proven optimal
  double incumbent_bytes = 0;
  double bound_bytes = 0;
};

// nullopt when the note does not start with that head (another solver, a
// changed format, or no placement met the balance cap).
std::optional<IlpNote> parse_ilp_note(const std::string& note);

// The solver whose forward send the "gap to ilp" columns compare with.
inline constexpr const char* kIlpSolver = "ilp";

// 100 x (value / ilp - 1): how many percent more forward bytes than ilp.
std::optional<double> gap_to_ilp_pct(double value, std::optional<double> ilp);

}  // namespace cpsched::cli
