// Specification of the metadata JSON reader: strict, bounded, never crashing.
#include <string>

#include "catch.h"
#include "json_value.h"
#include "json_writer.h"

using ridgescope::detail::JsonValue;
using ridgescope::detail::parse_json;

SCENARIO("well-formed JSON is read with its types", "[core][json]") {
  std::string error;
  auto v = parse_json(R"( {"a": 1, "b": -2.5e1, "c": "x\"\u00e9\ud83d\ude00", "d": [true, null], "e": {}} )", &error);
  REQUIRE(v.has_value());
  CHECK(v->get_uint("a") == 1u);
  CHECK(v->get("b")->number == -25.0);
  CHECK_FALSE(v->get("b")->is_integer);
  CHECK(v->get_string("c") == std::string("x\"\xC3\xA9\xF0\x9F\x98\x80"));
  CHECK(v->get("d")->array.size() == 2);
  CHECK(v->get("missing") == nullptr);
  CHECK_FALSE(v->get_uint("c").has_value());
}

SCENARIO("malformed or hostile JSON is an error with an offset", "[core][json]") {
  for (const char* text : {"", "{", "{\"a\" 1}", "[1,]", "{\"a\":tru}", "\"\\x\"", "1 2", "{\"a\":\"\x01\"}"}) {
    std::string error;
    CHECK_FALSE(parse_json(text, &error).has_value());
    CHECK_THAT(error, Catch::Matchers::Contains("byte offset"));
  }
  std::string deep(100000, '[');
  std::string error;
  CHECK_FALSE(parse_json(deep, &error).has_value());
  CHECK_THAT(error, Catch::Matchers::Contains("nesting too deep"));
}
