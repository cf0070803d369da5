// json_value.h — a small, strict JSON reader for the run metadata a trace carries. Internal to
// csrc/core. Hostile input is bounded: nesting depth and text size are limited, and every
// error is a message, never an exception or a crash.
// Thread-safety: values are plain data.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ridgescope::detail {

class JsonWriter;

struct JsonValue {
  enum class Type { Null, Bool, Number, String, Array, Object };
  Type type = Type::Null;
  bool boolean = false;
  double number = 0;             // every number, as a double
  bool is_integer = false;       // the text was an integer that fits in int64
  std::int64_t integer = 0;      // its value when is_integer
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  // in text order

  const JsonValue* get(std::string_view key) const;  // nullptr when absent or not an object
  std::optional<std::uint64_t> get_uint(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
};

// Parses `text`; on failure returns std::nullopt and sets *error (with the byte offset).
std::optional<JsonValue> parse_json(std::string_view text, std::string* error,
                                    int max_depth = 32);

// Writes a parsed value back out.
void write_json_value(JsonWriter& w, const JsonValue& v);

}  // namespace ridgescope::detail
