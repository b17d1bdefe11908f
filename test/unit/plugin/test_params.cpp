// Typed plugin parameters: scalar parsing, formatting and checked access.
#include <optional>
#include <string_view>

#include <doctest/doctest.h>

#include "cpsched/base/error.hpp"
#include "cpsched/plugin/params.hpp"

using namespace cpsched;

namespace {

std::optional<ParamValue> parsed(std::string_view text, ParamType type) {
  ParamValue v;
  if (!parse_param(text, type, v)) return std::nullopt;
  return v;
}

}  // namespace

TEST_CASE("parse_param reads YAML-like scalars as the declared type") {
  CHECK(parsed("true", ParamType::boolean) == ParamValue{true});
  CHECK(parsed("False", ParamType::boolean) == ParamValue{false});
  CHECK(parsed(" TRUE ", ParamType::boolean) == ParamValue{true});
  CHECK_FALSE(parsed("yes", ParamType::boolean));
  CHECK_FALSE(parsed("1", ParamType::boolean));

  CHECK(parsed("8", ParamType::integer) == ParamValue{std::int64_t{8}});
  CHECK(parsed("-12", ParamType::integer) == ParamValue{std::int64_t{-12}});
  CHECK(parsed("+7", ParamType::integer) == ParamValue{std::int64_t{7}});
  CHECK(parsed("9223372036854775807", ParamType::integer) ==
        ParamValue{std::int64_t{9223372036854775807}});
  CHECK_FALSE(parsed("9223372036854775808", ParamType::integer));  // overflow
  CHECK_FALSE(parsed("1.5", ParamType::integer));
  CHECK_FALSE(parsed("abc", ParamType::integer));
  CHECK_FALSE(parsed("", ParamType::integer));
  CHECK_FALSE(parsed("+-1", ParamType::integer));
  CHECK_FALSE(parsed("3 4", ParamType::integer));

  CHECK(parsed("1.10", ParamType::real) == ParamValue{1.10});
  CHECK(parsed("8", ParamType::real) == ParamValue{8.0});
  CHECK(parsed("-2.5e-3", ParamType::real) == ParamValue{-2.5e-3});
  CHECK_FALSE(parsed("inf", ParamType::real));
  CHECK_FALSE(parsed("nan", ParamType::real));
  CHECK_FALSE(parsed("1.1x", ParamType::real));
  CHECK_FALSE(parsed("", ParamType::real));

  CHECK(parsed("abc", ParamType::string) == ParamValue{std::string("abc")});
  CHECK(parsed("\"two words\"", ParamType::string) == ParamValue{std::string("two words")});
  CHECK(parsed("'1.5'", ParamType::string) == ParamValue{std::string("1.5")});
  CHECK(parsed("", ParamType::string) == ParamValue{std::string()});
}

TEST_CASE("format_param writes text that parses back to the same value") {
  CHECK(format_param(true) == "true");
  CHECK(format_param(std::int64_t{-3}) == "-3");
  CHECK(format_param(1.1) == "1.1");
  CHECK(format_param(2.0) == "2.0");  // a real stays visibly real
  CHECK(format_param(1e300) == "1e+300");
  CHECK(format_param(std::string("x y")) == "x y");
  for (double d : {0.1, 1.0 / 3.0, 123456.789, -7.25e-12}) {
    CHECK(parsed(format_param(d), ParamType::real) == ParamValue{d});
  }
}

TEST_CASE("Params getters check presence and type, naming the parameter") {
  Params p({{"mu", 1.1}, {"passes", std::int64_t{5}}, {"on", true}, {"name", std::string("x")}});
  CHECK(p.has("mu"));
  CHECK_FALSE(p.has("nu"));
  CHECK(p.get_real("mu") == 1.1);
  CHECK(p.get_real("passes") == 5.0);  // an integer reads as a real
  CHECK(p.get_int("passes") == 5);
  CHECK(p.get_bool("on"));
  CHECK(p.get_string("name") == "x");
  CHECK_THROWS_WITH_AS(p.get_real("nu"), "parameter 'nu' is not set", Error);
  CHECK_THROWS_WITH_AS(p.get_int("mu"), "parameter 'mu' is a real (1.1), not an int", Error);
  CHECK_THROWS_WITH_AS(p.get_bool("name"), "parameter 'name' is a string (x), not a bool", Error);
  CHECK_THROWS_WITH_AS(p.get_string("on"), "parameter 'on' is a bool (true), not a string", Error);
  p.set("mu", 1.2);
  CHECK(p.get_real("mu") == 1.2);
}

TEST_CASE("parameter types have stable names") {
  CHECK(to_string(ParamType::boolean) == "bool");
  CHECK(to_string(ParamType::integer) == "int");
  CHECK(to_string(ParamType::real) == "real");
  CHECK(to_string(ParamType::string) == "string");
}

TEST_CASE("a plugin spec with parameters: name:key=value+key=value, typed by the schema") {
  const std::vector<ParamSpec> schema = {{"chunk", ParamType::integer, std::int64_t{0}, ""},
                                         {"mode", ParamType::string, std::string("a"), ""}};
  CHECK(spec_plugin("static:chunk=2048+mode=b") == "static");
  CHECK(spec_plugin("owner") == "owner");
  const Params p = spec_params("static:chunk=2048+mode=b", schema);
  CHECK(p.get_int("chunk") == 2048);
  CHECK(p.get_string("mode") == "b");
  CHECK_FALSE(spec_params("owner", schema).has("chunk"));
  CHECK_THROWS_WITH_AS(spec_params("static:chunk=many", schema), doctest::Contains("'many' is not a valid"), Error);
  CHECK_THROWS_WITH_AS(spec_params("static:size=1", schema), doctest::Contains("static has no parameter 'size'"), Error);
  CHECK_THROWS_WITH_AS(spec_params("static:chunk", schema), doctest::Contains("needs name=value"), Error);
}
