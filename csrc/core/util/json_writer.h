// json_writer.h — a minimal streaming JSON writer for reports. Internal to csrc/core.
// Strings are escaped; invalid UTF-8 bytes become U+FFFD, so output is always valid JSON.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ridgescope::detail {

class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(std::string_view k);
  JsonWriter& value(std::string_view v);
  JsonWriter& value(const char* v) { return value(std::string_view(v)); }
  JsonWriter& value(const std::string& v) { return value(std::string_view(v)); }
  JsonWriter& value(std::uint64_t v);
  JsonWriter& value(std::int64_t v);
  JsonWriter& value(std::uint32_t v) { return value(static_cast<std::uint64_t>(v)); }
  JsonWriter& value(int v) { return value(static_cast<std::int64_t>(v)); }
  JsonWriter& value(bool v);
  JsonWriter& value(double v);  // finite values; NaN and infinities are written as null
  JsonWriter& null();
  // Writes text that is already valid JSON (produced by this writer), unchanged.
  JsonWriter& raw(std::string_view json);
  template <typename T>
  JsonWriter& field(std::string_view k, const T& v) { return key(k).value(v); }
  std::string take() { return std::move(out_); }

 private:
  void separate();
  void write_string(std::string_view s);
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

}  // namespace ridgescope::detail
