#pragma once
// Named figures a plugin reports beside its result (a solver's predicted
// step, an executor's measured times): name -> number, in the order given.
// Tools read them by name; no one parses prose.
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cpsched {

class Figures {
 public:
  using Entry = std::pair<std::string, double>;
  // Sets `name` (replacing an earlier value, keeping its place).
  void set(const std::string& name, double value);
  std::optional<double> get(const std::string& name) const;
  bool has(const std::string& name) const { return get(name).has_value(); }
  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }
  friend bool operator==(const Figures&, const Figures&) = default;

 private:
  std::vector<Entry> entries_;
};

}  // namespace cpsched
