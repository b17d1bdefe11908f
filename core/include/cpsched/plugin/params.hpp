#pragma once
// Named, typed plugin parameters: the schema a plugin declares and the values
// the host hands to its factory (defaults filled in, types checked).
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace cpsched {

enum class ParamType : int { boolean = 0, integer = 1, real = 2, string = 3 };
std::string_view to_string(ParamType t);

using ParamValue = std::variant<bool, std::int64_t, double, std::string>;
std::string format_param(const ParamValue& v);

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::real;
  ParamValue default_value;
  std::string doc;
};

// Parses YAML-ish scalar text as `type` ("1.1", "true", "8", "abc").
// Returns false when the text is not of that type.
bool parse_param(std::string_view text, ParamType type, ParamValue& out);

class Params {
 public:
  Params() = default;
  explicit Params(std::map<std::string, ParamValue> values) : values_(std::move(values)) {}

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  // Typed access; throws cpsched::Error naming the parameter when it is
  // missing or of another type (an integer reads as a real).
  bool get_bool(const std::string& name) const;
  std::int64_t get_int(const std::string& name) const;
  double get_real(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;

  void set(const std::string& name, ParamValue v) { values_[name] = std::move(v); }
  const std::map<std::string, ParamValue>& values() const { return values_; }

 private:
  const ParamValue& at(const std::string& name) const;
  std::map<std::string, ParamValue> values_;
};

// A plugin named with parameters in one string, as the portfolio's members
// and the benchmarks take them: "static:chunk_tokens=2048+node_ranks=-1".
// spec_plugin gives the plugin name; spec_params parses the values against
// the plugin's schema (an unknown name or a value of the wrong type throws
// cpsched::Error quoting the spec).
std::string spec_plugin(std::string_view spec);
Params spec_params(std::string_view spec, const std::vector<ParamSpec>& schema);

}  // namespace cpsched
