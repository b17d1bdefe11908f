#include "cpsched/base/figures.hpp"

#include <algorithm>

namespace cpsched {

void Figures::set(const std::string& name, double value) {
  const auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.first == name; });
  if (it != entries_.end()) it->second = value;
  else entries_.emplace_back(name, value);
}

std::optional<double> Figures::get(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.first == name) return e.second;
  return std::nullopt;
}

}  // namespace cpsched
