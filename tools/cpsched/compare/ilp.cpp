#include "compare/ilp.hpp"

#include <cstdlib>
#include <string_view>

namespace cpsched::cli {

namespace {

// The number right after `key` at `pos` in `s`, followed by " B"; advances pos.
bool read_bytes(const std::string& s, const std::string& key, std::size_t& pos, double& out) {
  if (s.compare(pos, key.size(), key) != 0) return false;
  const char* begin = s.c_str() + pos + key.size();
  char* end = nullptr;
  out = std::strtod(begin, &end);
  if (end == begin || std::string_view(end).substr(0, 2) != " B") return false;
  pos = static_cast<std::size_t>(end - s.c_str()) + 2;
  return true;
}

}  // namespace

std::optional<IlpNote> parse_ilp_note(const std::string& note) {
  const std::string head = "ilp (";
  if (note.compare(0, head.size(), head) != 0) return std::nullopt;
  const std::size_t colon = note.find("): ");
  if (colon == std::string::npos) return std::nullopt;
  IlpNote n;
  n.total_objective = note.compare(head.size(), 6, "total ") == 0;
  std::size_t pos = colon + 3;
  const std::string optimal = "optimal; ", unproven = "not proven optimal; ";
  if (note.compare(pos, optimal.size(), optimal) == 0) {
    n.proven = true;
    pos += optimal.size();
  } else if (note.compare(pos, unproven.size(), unproven) == 0) {
    pos += unproven.size();
  } else {
    return std::nullopt;  // no placement met the cap: no incumbent, no bound
  }
  if (!read_bytes(note, "incumbent ", pos, n.incumbent_bytes)) return std::nullopt;
  // The origin in parentheses is free text without ';': the bound follows it
  // before the clause ends.
  const std::size_t clause_end = note.find("; ", pos);
  const std::size_t b = note.rfind("), bound ", clause_end);
  if (b == std::string::npos || b < pos) return std::nullopt;
  pos = b + 3;
  if (!read_bytes(note, "bound ", pos, n.bound_bytes)) return std::nullopt;
  return n;
}

std::optional<double> gap_to_ilp_pct(double value, std::optional<double> ilp) {
  if (!ilp || *ilp <= 0) return std::nullopt;
  return 100.0 * (value / *ilp - 1.0);
}

}  // namespace cpsched::cli
