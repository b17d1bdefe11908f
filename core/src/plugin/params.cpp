// Typed plugin parameters: scalar parsing, formatting and checked access.
#include "cpsched/plugin/params.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "cpsched/base/error.hpp"

namespace cpsched {

std::string_view to_string(ParamType t) {
  switch (t) {
    case ParamType::boolean: return "bool";
    case ParamType::integer: return "int";
    case ParamType::real: return "real";
    case ParamType::string: return "string";
  }
  return "unknown";
}

namespace {

std::string_view trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

// YAML 1.2 core-schema booleans.
bool parse_bool(std::string_view s, bool& out) {
  if (s == "true" || s == "True" || s == "TRUE") {
    out = true;
    return true;
  }
  if (s == "false" || s == "False" || s == "FALSE") {
    out = false;
    return true;
  }
  return false;
}

// Decimal only, optional sign; the whole text must be consumed and fit.
bool parse_int(std::string_view s, std::int64_t& out) {
  if (!s.empty() && s.front() == '+') {
    s.remove_prefix(1);
    if (!s.empty() && s.front() == '-') return false;  // "+-1"
  }
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && end == s.data() + s.size();
}

// Finite reals only: a scheduling parameter of inf or nan is a typo, not a value.
bool parse_real(std::string_view s, double& out) {
  if (!s.empty() && s.front() == '+') {
    s.remove_prefix(1);
    if (!s.empty() && s.front() == '-') return false;  // "+-1"
  }
  if (s.empty()) return false;
  const auto [end, ec] =
      std::from_chars(s.data(), s.data() + s.size(), out, std::chars_format::general);
  return ec == std::errc{} && end == s.data() + s.size() && std::isfinite(out);
}

// A quoted YAML scalar stands for its contents.
std::string_view unquote(std::string_view s) {
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) {
    return s.substr(1, s.size() - 2);
  }
  return s;
}

const char* type_of(const ParamValue& v) {
  switch (v.index()) {
    case 0: return "bool";
    case 1: return "int";
    case 2: return "real";
    default: return "string";
  }
}

std::string with_article(std::string_view type) {
  return (type == "int" ? "an " : "a ") + std::string(type);
}

[[noreturn]] void wrong_type(const std::string& name, const ParamValue& v, ParamType want) {
  throw Error("parameter '" + name + "' is " + with_article(type_of(v)) + " (" + format_param(v) +
              "), not " + with_article(to_string(want)));
}

}  // namespace

bool parse_param(std::string_view text, ParamType type, ParamValue& out) {
  if (type == ParamType::string) {
    out = std::string(unquote(trim(text)));
    return true;
  }
  const std::string_view s = trim(text);
  switch (type) {
    case ParamType::boolean: {
      bool b = false;
      if (!parse_bool(s, b)) return false;
      out = b;
      return true;
    }
    case ParamType::integer: {
      std::int64_t i = 0;
      if (!parse_int(s, i)) return false;
      out = i;
      return true;
    }
    case ParamType::real: {
      double d = 0;
      if (!parse_real(s, d)) return false;
      out = d;
      return true;
    }
    case ParamType::string: break;
  }
  return false;
}

std::string format_param(const ParamValue& v) {
  switch (v.index()) {
    case 0: return std::get<bool>(v) ? "true" : "false";
    case 1: return std::to_string(std::get<std::int64_t>(v));
    case 2: {
      // Shortest text that reads back to the same double; keep a real looking real.
      char buf[64];
      const double d = std::get<double>(v);
      const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
      std::string s(buf, ec == std::errc{} ? end : buf);
      if (std::isfinite(d) && s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
    default: return std::get<std::string>(v);
  }
}

const ParamValue& Params::at(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) throw Error("parameter '" + name + "' is not set");
  return it->second;
}

bool Params::get_bool(const std::string& name) const {
  const ParamValue& v = at(name);
  if (const bool* b = std::get_if<bool>(&v)) return *b;
  wrong_type(name, v, ParamType::boolean);
}

std::int64_t Params::get_int(const std::string& name) const {
  const ParamValue& v = at(name);
  if (const std::int64_t* i = std::get_if<std::int64_t>(&v)) return *i;
  wrong_type(name, v, ParamType::integer);
}

double Params::get_real(const std::string& name) const {
  const ParamValue& v = at(name);
  if (const double* d = std::get_if<double>(&v)) return *d;
  if (const std::int64_t* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  wrong_type(name, v, ParamType::real);
}

const std::string& Params::get_string(const std::string& name) const {
  const ParamValue& v = at(name);
  if (const std::string* s = std::get_if<std::string>(&v)) return *s;
  wrong_type(name, v, ParamType::string);
}

std::string spec_plugin(std::string_view spec) { return std::string(spec.substr(0, spec.find(':'))); }

Params spec_params(std::string_view spec, const std::vector<ParamSpec>& schema) {
  Params given;
  const auto colon = spec.find(':');
  std::string_view rest = colon == std::string_view::npos ? std::string_view() : spec.substr(colon + 1);
  while (!rest.empty()) {
    const auto plus = rest.find('+');
    const std::string_view kv = rest.substr(0, plus);
    rest = plus == std::string_view::npos ? std::string_view() : rest.substr(plus + 1);
    const auto eq = kv.find('=');
    if (eq == std::string_view::npos) throw Error(fmt::format("'{}': parameter '{}' needs name=value", spec, kv));
    const std::string k(kv.substr(0, eq));
    const std::string_view v = kv.substr(eq + 1);
    const ParamSpec* ps = nullptr;
    for (const ParamSpec& p : schema)
      if (p.name == k) ps = &p;
    if (ps == nullptr) throw Error(fmt::format("'{}': {} has no parameter '{}'", spec, spec_plugin(spec), k));
    ParamValue value;
    if (!parse_param(v, ps->type, value))
      throw Error(fmt::format("'{}': '{}' is not a valid {} for {}", spec, v, to_string(ps->type), k));
    given.set(k, value);
  }
  return given;
}

}  // namespace cpsched
