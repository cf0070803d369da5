// allocator_settings.cpp — the allocator settings (see include/ridgescope/allocator_settings.h):
// the rules they imply (block rounding of cuda_rounding.h, segment sizes), the
// PYTORCH_CUDA_ALLOC_CONF parser (torch's CachingAllocatorConfig, its messages naming the
// option) and the canonical text of a settings value.
#include "ridgescope/allocator_settings.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <vector>

namespace ridgescope {

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();

std::uint64_t round_up(std::uint64_t v, std::uint64_t m) { return (v + m - 1) / m * m; }

unsigned floor_log2(std::uint64_t v) { return 63u - static_cast<unsigned>(std::countl_zero(v)); }

}  // namespace

// --- Rounding rules -----------------------------------------------------------------------

CudaRoundingRules allocator_rounding_rules(const AllocatorSettings& s) noexcept {
  CudaRoundingRules r;
  r.roundup_power2_divisions = s.roundup_power2_divisions;
  r.max_split_size = s.max_split_size_bytes == 0 ? kNoLimit : s.max_split_size_bytes;
  r.expandable_segments = s.expandable_segments;
  return r;
}

std::uint64_t allocator_segment_size(std::uint64_t block_bytes,
                                     const AllocatorSettings& s) noexcept {
  if (block_bytes <= kCudaSmallSize) return kAllocSmallBuffer;
  if (block_bytes < kAllocMinLargeAlloc) return s.large_segment_bytes;
  return round_up(block_bytes, kAllocRoundLarge);
}

// --- Settings parsing ---------------------------------------------------------------------

namespace {

std::vector<std::string> tokenize(std::string_view text) {
  std::vector<std::string> out;
  std::string buf;
  for (char ch : text) {
    if (ch == ',' || ch == ':' || ch == '[' || ch == ']') {
      if (!buf.empty()) out.push_back(std::move(buf));
      buf.clear();
      out.emplace_back(1, ch);
    } else if (!std::isspace(static_cast<unsigned char>(ch))) {
      buf += ch;
    }
  }
  if (!buf.empty()) out.push_back(std::move(buf));
  return out;
}

bool parse_uint(const std::string& t, std::uint64_t* out) {
  if (t.empty() || !std::isdigit(static_cast<unsigned char>(t[0]))) return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(t.c_str(), &end, 10);
  if (errno != 0 || end != t.c_str() + t.size()) return false;
  *out = v;
  return true;
}

bool parse_double(const std::string& t, double* out) {
  if (t.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (errno != 0 || end != t.c_str() + t.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

class SettingsParser {
 public:
  SettingsParser(std::vector<std::string> tokens, AllocatorSettings* out)
      : t_(std::move(tokens)), s_(out) {}

  bool run(std::string* error) {
    while (i_ < t_.size()) {
      const std::string key = t_[i_++];
      if (key == "," || key == ":" || key == "[" || key == "]") {
        err_ = "expected an option name, found '" + key + "'";
        return fail(error);
      }
      if (!expect(":", "after option '" + key + "'")) return fail(error);
      if (!option(key)) return fail(error);
      if (i_ < t_.size() && !expect(",", "after the value of '" + key + "'")) return fail(error);
    }
    return true;
  }

 private:
  bool fail(std::string* error) {
    if (error) *error = "PYTORCH_CUDA_ALLOC_CONF: " + err_;
    return false;
  }
  bool expect(const char* tok, const std::string& where) {
    if (i_ < t_.size() && t_[i_] == tok) {
      ++i_;
      return true;
    }
    err_ = std::string("expected '") + tok + "' " + where +
           (i_ < t_.size() ? ", found '" + t_[i_] + "'" : ", found the end");
    return false;
  }
  bool value(const std::string& key, std::string* v) {
    if (i_ >= t_.size() || t_[i_] == "," || t_[i_] == ":" || t_[i_] == "[" || t_[i_] == "]") {
      err_ = "option '" + key + "' needs a value";
      return false;
    }
    *v = t_[i_++];
    return true;
  }
  bool megabytes(const std::string& key, std::uint64_t min_mb, bool strictly_above,
                 std::uint64_t* bytes) {
    std::string v;
    if (!value(key, &v)) return false;
    std::uint64_t mb = 0;
    if (!parse_uint(v, &mb)) {
      err_ = "option '" + key + "' takes a whole number of MiB, got '" + v + "'";
      return false;
    }
    if (strictly_above ? mb <= min_mb : mb < min_mb) {
      err_ = "option '" + key + "' must be " + (strictly_above ? "> " : ">= ") +
             std::to_string(min_mb) + " (MiB), got " + v;
      return false;
    }
    *bytes = mb >= kNoLimit / kMiB ? kNoLimit : mb * kMiB;
    return true;
  }
  bool boolean(const std::string& key, bool* out) {
    std::string v;
    if (!value(key, &v)) return false;
    if (v != "True" && v != "False") {
      err_ = "option '" + key + "' takes True or False (as torch spells them), got '" + v + "'";
      return false;
    }
    *out = v == "True";
    return true;
  }
  bool divisions_value(const std::string& v, std::uint64_t* out, bool allow_zero) {
    std::uint64_t d = 0;
    if (!parse_uint(v, &d) || d > (1u << 30) || (d == 0 && !allow_zero) ||
        (d != 0 && !std::has_single_bit(d))) {
      err_ = "roundup_power2_divisions: divisions must be a power of 2" +
             std::string(allow_zero ? " or 0" : "") + ", got '" + v + "'";
      return false;
    }
    *out = d;
    return true;
  }
  bool roundup(const std::string& key) {
    auto& table = s_->roundup_power2_divisions;
    table.fill(0);
    if (i_ < t_.size() && t_[i_] == "[") {
      ++i_;
      bool first = true;
      std::size_t last_index = 0;
      while (true) {
        if (i_ >= t_.size()) {
          err_ = "roundup_power2_divisions: missing ']'";
          return false;
        }
        if (t_[i_] == "]") {
          ++i_;
          break;
        }
        const std::string interval = t_[i_++];
        if (!expect(":", "after interval '" + interval + "' in roundup_power2_divisions")) {
          return false;
        }
        std::string v;
        if (!value(key, &v)) return false;
        std::uint64_t d = 0;
        if (!divisions_value(v, &d, /*allow_zero=*/true)) return false;
        if (interval == ">") {
          // torch fills from the entry after the last interval named (entry 1 when none
          // was: "[>:16]" leaves entry 0 at 0, as torch 2.14 does).
          for (std::size_t k = last_index + 1; k < table.size(); ++k) table[k] = d;
        } else {
          std::uint64_t mb = 0;
          if (!parse_uint(interval, &mb) || !std::has_single_bit(mb)) {
            err_ = "roundup_power2_divisions: intervals must be powers of 2 (MiB) or '>', got '" +
                   interval + "'";
            return false;
          }
          const std::size_t index = std::min<std::size_t>(floor_log2(mb), table.size() - 1);
          if (first) {
            for (std::size_t k = 0; k < index; ++k) table[k] = d;
          }
          table[index] = d;
          last_index = index;
          first = false;
        }
        if (i_ < t_.size() && t_[i_] == ",") ++i_;
      }
      return true;
    }
    std::string v;
    if (!value(key, &v)) return false;
    std::uint64_t d = 0;
    if (!divisions_value(v, &d, /*allow_zero=*/false)) return false;
    table.fill(d);
    return true;
  }
  bool fraction(const std::string& key, double lo, bool lo_open, double hi, bool hi_open,
                double* out) {
    std::string v;
    if (!value(key, &v)) return false;
    double d = 0;
    const bool ok = parse_double(v, &d) && (lo_open ? d > lo : d >= lo) &&
                    (hi_open ? d < hi : d <= hi);
    if (!ok) {
      std::ostringstream os;
      os << "option '" << key << "' must be a number in " << (lo_open ? "(" : "[") << lo << ", "
         << hi << (hi_open ? ")" : "]") << ", got '" << v << "'";
      err_ = os.str();
      return false;
    }
    *out = d;
    return true;
  }
  bool option(const std::string& key) {
    if (key == "max_split_size_mb") {
      return megabytes(key, kAllocLargeBuffer / kMiB, false, &s_->max_split_size_bytes);
    }
    if (key == "max_non_split_rounding_mb") {
      return megabytes(key, kAllocLargeBuffer / kMiB, false, &s_->max_non_split_rounding_bytes);
    }
    if (key == "large_segment_size_mb") {
      return megabytes(key, kAllocMinLargeAlloc / kMiB, true, &s_->large_segment_bytes);
    }
    if (key == "garbage_collection_threshold") {
      return fraction(key, 0.0, true, 1.0, true, &s_->garbage_collection_threshold);
    }
    if (key == "per_process_memory_fraction") {
      return fraction(key, 0.0, false, 1.0, false, &s_->per_process_memory_fraction);
    }
    if (key == "roundup_power2_divisions") return roundup(key);
    if (key == "expandable_segments") return boolean(key, &s_->expandable_segments);
    if (key == "backend") {
      std::string v;
      if (!value(key, &v)) return false;
      if (v == "native") return true;
      err_ = v == "cudaMallocAsync"
                 ? "backend:cudaMallocAsync is not modelled (only the native caching allocator)"
                 : "unknown backend '" + v + "' (native or cudaMallocAsync)";
      return false;
    }
    static const char* const kIgnored[] = {
        "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
        "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
        "pinned_num_register_threads", "pinned_use_background_threads",
        "pinned_max_round_threshold_mb", "pinned_max_cached_size_mb",
        "pinned_reserve_segment_size_mb", "pinned_free_catch_all",
        "graph_capture_record_stream_reuse", "throw_on_cudamalloc_oom"};
    for (const char* k : kIgnored) {
      if (key == k) {
        std::string v;
        return value(key, &v);  // no effect on device blocks and segments
      }
    }
    err_ = "unknown option '" + key +
           "' (modelled: max_split_size_mb, max_non_split_rounding_mb, large_segment_size_mb, "
           "roundup_power2_divisions, expandable_segments, garbage_collection_threshold, "
           "per_process_memory_fraction)";
    return false;
  }

  std::vector<std::string> t_;
  AllocatorSettings* s_;
  std::size_t i_ = 0;
  std::string err_;
};

}  // namespace

bool parse_allocator_settings(std::string_view text, AllocatorSettings* out, std::string* error) {
  AllocatorSettings s;
  s.capacity_bytes = out ? out->capacity_bytes : 0;
  SettingsParser parser(tokenize(text), &s);
  if (!parser.run(error)) return false;
  s.source = std::string(text);
  if (out) *out = std::move(s);
  return true;
}

std::string format_allocator_settings(const AllocatorSettings& s) {
  std::vector<std::string> items;
  if (s.expandable_segments) items.push_back("expandable_segments:True");
  if (s.max_split_size_bytes != 0) {
    items.push_back("max_split_size_mb:" + std::to_string(s.max_split_size_bytes / kMiB));
  }
  if (s.max_non_split_rounding_bytes != kAllocLargeBuffer) {
    items.push_back("max_non_split_rounding_mb:" +
                    std::to_string(s.max_non_split_rounding_bytes / kMiB));
  }
  if (s.large_segment_bytes != kAllocLargeBuffer) {
    items.push_back("large_segment_size_mb:" + std::to_string(s.large_segment_bytes / kMiB));
  }
  const auto& d = s.roundup_power2_divisions;
  if (std::any_of(d.begin(), d.end(), [](std::uint64_t v) { return v != 0; })) {
    if (std::all_of(d.begin(), d.end(), [&](std::uint64_t v) { return v == d.front(); })) {
      items.push_back("roundup_power2_divisions:" + std::to_string(d.front()));
    } else {
      std::string list = "roundup_power2_divisions:[";
      for (std::size_t i = 0; i < d.size(); ++i) {
        if (i) list += ",";
        list += std::to_string(1ull << i) + ":" + std::to_string(d[i]);
      }
      items.push_back(list + "]");
    }
  }
  std::ostringstream os;
  if (s.garbage_collection_threshold > 0) {
    os << "garbage_collection_threshold:" << s.garbage_collection_threshold;
    items.push_back(os.str());
    os.str("");
  }
  if (s.per_process_memory_fraction > 0) {
    os << "per_process_memory_fraction:" << s.per_process_memory_fraction;
    items.push_back(os.str());
  }
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ",";
    out += item;
  }
  return out;
}

}  // namespace ridgescope
