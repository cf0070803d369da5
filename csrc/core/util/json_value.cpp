#include "json_value.h"

#include <cmath>
#include <cstdlib>

#include "json_writer.h"

namespace ridgescope::detail {
namespace {

class Parser {
 public:
  Parser(std::string_view text, int max_depth) : s_(text), max_depth_(max_depth) {}

  bool parse(JsonValue* out, std::string* error) {
    if (!value(out, 0)) {
      *error = error_ + " at byte offset " + std::to_string(pos_);
      return false;
    }
    ws();
    if (pos_ != s_.size()) {
      *error = "unexpected text after the JSON value at byte offset " + std::to_string(pos_);
      return false;
    }
    return true;
  }

 private:
  bool fail(const char* message) {
    error_ = message;
    return false;
  }
  void ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return fail("invalid literal");
    pos_ += word.size();
    return true;
  }

  bool value(JsonValue* v, int depth) {
    if (depth > max_depth_) return fail("nesting too deep");
    ws();
    if (pos_ >= s_.size()) return fail("unexpected end of text");
    const char c = s_[pos_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v->type = JsonValue::Type::String;
      return string(&v->string);
    }
    if (c == 't') { v->type = JsonValue::Type::Bool; v->boolean = true; return literal("true"); }
    if (c == 'f') { v->type = JsonValue::Type::Bool; v->boolean = false; return literal("false"); }
    if (c == 'n') { v->type = JsonValue::Type::Null; return literal("null"); }
    return number(v);
  }

  bool object(JsonValue* v, int depth) {
    v->type = JsonValue::Type::Object;
    ++pos_;
    ws();
    if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return true; }
    for (;;) {
      ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') return fail("expected a string key");
      std::string key;
      if (!string(&key)) return false;
      ws();
      if (pos_ >= s_.size() || s_[pos_] != ':') return fail("expected ':'");
      ++pos_;
      JsonValue member;
      if (!value(&member, depth + 1)) return false;
      v->object.emplace_back(std::move(key), std::move(member));
      ws();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return true; }
      return fail("expected ',' or '}'");
    }
  }

  bool array(JsonValue* v, int depth) {
    v->type = JsonValue::Type::Array;
    ++pos_;
    ws();
    if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return true; }
    for (;;) {
      JsonValue item;
      if (!value(&item, depth + 1)) return false;
      v->array.push_back(std::move(item));
      ws();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return true; }
      return fail("expected ',' or ']'");
    }
  }

  static void put_utf8(std::string* out, std::uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  bool hex4(std::uint32_t* out) {
    if (pos_ + 4 > s_.size()) return fail("truncated \\u escape");
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
      else return fail("bad \\u escape");
    }
    *out = v;
    return true;
  }

  bool string(std::string* out) {
    ++pos_;  // opening quote
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          std::uint32_t cp;
          if (!hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            std::uint32_t lo;
            if (!hex4(&lo)) return false;
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else cp = 0xFFFD;
          } else if (cp >= 0xD800 && cp < 0xE000) {
            cp = 0xFFFD;
          }
          put_utf8(out, cp);
          break;
        }
        default: return fail("bad escape");
      }
    }
    return fail("unterminated string");
  }

  bool number(JsonValue* v) {
    const std::size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    bool digits = false, fraction = false;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') { ++pos_; digits = true; }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      fraction = true;
      ++pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      fraction = true;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    }
    if (!digits) return fail("invalid value");
    const std::string text(s_.substr(start, pos_ - start));
    v->type = JsonValue::Type::Number;
    v->number = std::strtod(text.c_str(), nullptr);
    if (!fraction && text.size() < 19) {
      v->is_integer = true;
      v->integer = std::strtoll(text.c_str(), nullptr, 10);
    }
    return true;
  }

  std::string_view s_;
  int max_depth_;
  std::size_t pos_ = 0;
  std::string error_;
};

}  // namespace

const JsonValue* JsonValue::get(std::string_view key) const {
  if (type != Type::Object) return nullptr;
  for (const auto& [k, v] : object)
    if (k == key) return &v;
  return nullptr;
}

std::optional<std::uint64_t> JsonValue::get_uint(std::string_view key) const {
  const JsonValue* v = get(key);
  if (v == nullptr || !v->is_integer || v->integer < 0) return std::nullopt;
  return static_cast<std::uint64_t>(v->integer);
}

std::optional<std::string> JsonValue::get_string(std::string_view key) const {
  const JsonValue* v = get(key);
  if (v == nullptr || v->type != Type::String) return std::nullopt;
  return v->string;
}

std::optional<JsonValue> parse_json(std::string_view text, std::string* error, int max_depth) {
  JsonValue v;
  Parser p(text, max_depth);
  if (!p.parse(&v, error)) return std::nullopt;
  return v;
}

void write_json_value(JsonWriter& w, const JsonValue& v) {
  switch (v.type) {
    case JsonValue::Type::Null: w.null(); break;
    case JsonValue::Type::Bool: w.value(v.boolean); break;
    case JsonValue::Type::Number:
      if (v.is_integer) w.value(static_cast<std::int64_t>(v.integer));
      else w.value(v.number);
      break;
    case JsonValue::Type::String: w.value(v.string); break;
    case JsonValue::Type::Array:
      w.begin_array();
      for (const auto& item : v.array) write_json_value(w, item);
      w.end_array();
      break;
    case JsonValue::Type::Object:
      w.begin_object();
      for (const auto& [k, item] : v.object) {
        w.key(k);
        write_json_value(w, item);
      }
      w.end_object();
      break;
  }
}

}  // namespace ridgescope::detail
