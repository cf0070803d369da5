// allocator_model.cpp — the CUDA caching allocator model (see include/ridgescope/allocator_model.h
// and docs/fit.md "The allocator model"). The structure follows torch's DeviceCachingAllocator
// (c10/cuda/CUDACachingAllocator.cpp) rule by rule, written independently: per-pool free sets
// ordered by (stream, size, address), blocks chained to their segment neighbours, segments at
// synthetic addresses.
#include "ridgescope/allocator_model.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "ridgescope/event.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope {

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();
// Address space given to one expandable segment when no capacity is set (torch reserves
// 1 1/8 of the device's memory).
constexpr std::uint64_t kUnlimitedVaBytes = 1ull << 40;
// Alignment of the synthetic segment addresses (cudaMalloc returns 2 MiB-aligned ranges for
// the sizes the allocator asks for).
constexpr std::uint64_t kVaAlignment = 2ull << 20;
// Requests above this (1 EiB) fail as out of memory, as cudaMalloc would on any device: it
// keeps every rounding and address sum below 2^64.
constexpr std::uint64_t kMaxRequestBytes = 1ull << 60;

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

std::string_view allocator_segment_event_name(AllocatorSegmentEvent::Kind kind) noexcept {
  switch (kind) {
    case AllocatorSegmentEvent::Kind::Alloc: return "segment_alloc";
    case AllocatorSegmentEvent::Kind::Free: return "segment_free";
    case AllocatorSegmentEvent::Kind::Map: return "segment_map";
    case AllocatorSegmentEvent::Kind::Unmap: return "segment_unmap";
  }
  return "segment_unknown";
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

// --- The model ----------------------------------------------------------------------------

namespace {

struct Segment;
struct Pool;

struct Block {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested = 0;
  std::uint64_t stream = 0;
  Block* prev = nullptr;
  Block* next = nullptr;
  Segment* segment = nullptr;
  Pool* pool = nullptr;
  std::int64_t gc_count_base = 0;
  bool allocated = false;
  bool mapped = true;
  bool is_split() const { return prev != nullptr || next != nullptr; }
  bool expandable() const;
};

struct Segment {
  std::uint64_t base = 0;
  std::uint64_t size = 0;       // cudaMalloc size; expandable: the address space
  std::uint64_t page = 0;       // expandable: the mapping granularity
  std::uint64_t stream = 0;
  bool small = false;
  bool expandable = false;
};

bool Block::expandable() const { return segment->expandable; }

struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
  }
};
struct ByAddress {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->addr < b->addr;
  }
};

struct Pool {
  explicit Pool(bool s) : small(s) {}
  bool small;
  std::set<Block*, BySize> blocks;       // free, mapped
  std::set<Block*, ByAddress> unmapped;  // expandable address space not backed by pages
  std::int64_t get_free_blocks_call_count = 0;
  void insert(Block* b) {
    b->gc_count_base = get_free_blocks_call_count;
    blocks.insert(b);
  }
};

}  // namespace

struct AllocatorModel::Impl {
  explicit Impl(AllocatorSettings s)
      : settings(std::move(s)),
        rules(allocator_rounding_rules(settings)),
        max_split(rules.max_split_size) {
    if (settings.large_segment_bytes == 0) settings.large_segment_bytes = kAllocLargeBuffer;
    if (settings.capacity_bytes != 0 && settings.per_process_memory_fraction > 0) {
      allowed_max = static_cast<std::uint64_t>(settings.per_process_memory_fraction *
                                               static_cast<double>(settings.capacity_bytes));
      fraction_set = true;
    }
    gc_enabled = fraction_set && settings.garbage_collection_threshold > 0;
  }
  ~Impl() {
    for (auto& [id, b] : live) delete b;
    for (Pool* p : {&small, &large}) {
      for (Block* b : p->blocks) delete b;
      for (Block* b : p->unmapped) delete b;
    }
  }

  AllocatorSettings settings;
  CudaRoundingRules rules;
  std::uint64_t max_split;
  std::uint64_t allowed_max = 0;
  bool fraction_set = false;
  bool gc_enabled = false;

  Pool small{true};
  Pool large{false};
  absl::flat_hash_map<std::uint64_t, Block*> live;  // alloc_id -> block (nullptr: 0 bytes)
  std::map<std::uint64_t, std::unique_ptr<Segment>> segments;  // by base address
  std::uint64_t next_va = kModelBaseAddress;
  std::uint64_t segment_hint = 0;  // where the next new segment goes (0: synthetic)

  AllocatorStats st;
  bool record_events = false;
  std::vector<AllocatorSegmentEvent> events;

  // Per-call scratch for the result.
  std::uint64_t call_segment_bytes = 0;
  std::uint64_t call_released_bytes = 0;

  // --- helpers -----------------------------------------------------------------------------
  Pool& pool_for(std::uint64_t size) { return cuda_is_small_pool(size) ? small : large; }

  void add_reserved(const Block* b, std::uint64_t bytes) {
    st.reserved_bytes += bytes;
    (b->pool->small ? st.small_reserved_bytes : st.large_reserved_bytes) += bytes;
    st.peak_reserved_bytes = std::max(st.peak_reserved_bytes, st.reserved_bytes);
    call_segment_bytes += bytes;
  }
  void sub_reserved(const Block* b, std::uint64_t bytes) {
    st.reserved_bytes -= bytes;
    (b->pool->small ? st.small_reserved_bytes : st.large_reserved_bytes) -= bytes;
    call_released_bytes += bytes;
  }
  void event(AllocatorSegmentEvent::Kind kind, std::uint64_t addr, std::uint64_t bytes,
             std::uint64_t stream) {
    if (!record_events) return;
    events.push_back({kind, addr, bytes, stream, st.reserved_bytes});
  }
  bool device_has_room(std::uint64_t bytes) const {
    return settings.capacity_bytes == 0 || st.reserved_bytes + bytes <= settings.capacity_bytes;
  }
  // The address of a new segment of `bytes`: the hinted (recorded) one when it overlaps no
  // live segment, else the next synthetic one. Synthetic addresses stay above every segment.
  std::uint64_t take_va(std::uint64_t bytes) {
    std::uint64_t addr = next_va;
    if (segment_hint != 0 && !overlaps(segment_hint, bytes)) addr = segment_hint;
    segment_hint = 0;
    next_va = std::max(next_va, round_up(addr + bytes, kVaAlignment));
    return addr;
  }
  bool overlaps(std::uint64_t addr, std::uint64_t bytes) const {
    if (addr > kNoLimit - bytes) return true;
    auto it = segments.lower_bound(addr + bytes);  // first segment starting at or after the end
    if (it == segments.begin()) return false;
    --it;
    return it->first + it->second->size > addr;
  }

  // try_merge_blocks: folds `src` into `dst` when it is a free neighbour in the same mapping
  // state. Returns the bytes subsumed.
  std::uint64_t try_merge(Block* dst, Block* src) {
    if (!src || src->allocated || dst->mapped != src->mapped) return 0;
    if (dst->prev == src) {
      dst->addr = src->addr;
      dst->prev = src->prev;
      if (dst->prev) dst->prev->next = dst;
    } else {
      dst->next = src->next;
      if (dst->next) dst->next->prev = dst;
    }
    const std::uint64_t subsumed = src->size;
    dst->size += subsumed;
    if (src->mapped) {
      src->pool->blocks.erase(src);
    } else {
      src->pool->unmapped.erase(src);
    }
    delete src;
    return subsumed;
  }

  // get_free_block: best fit from the cached blocks of the request's stream.
  Block* get_free_block(Pool& pool, std::uint64_t size, std::uint64_t stream) {
    if (gc_enabled) ++pool.get_free_blocks_call_count;
    Block key;
    key.stream = stream;
    key.size = size;
    key.addr = 0;
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
    if ((*it)->expandable()) {
      // The expandable block that can grow the least beyond its size is the best fit.
      auto expandable_size = [](const Block* b) {
        return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
      };
      auto next = std::next(it);
      while ((*it)->expandable() && next != pool.blocks.end() && (*next)->stream == stream &&
             expandable_size(*next) < expandable_size(*it)) {
        it = next++;
      }
    }
    if (size < max_split && (*it)->size >= max_split) return nullptr;
    if (size >= max_split && (*it)->size >= size + settings.max_non_split_rounding_bytes) {
      return nullptr;
    }
    Block* b = *it;
    pool.blocks.erase(it);
    return b;
  }

  bool should_split(const Block* b, std::uint64_t size) const {
    return cuda_should_split(b->size, size, rules);
  }

  // alloc_block: a new segment (cudaMalloc) or new pages of an expandable segment.
  Block* alloc_block(Pool& pool, std::uint64_t size, std::uint64_t alloc_size,
                     std::uint64_t stream, bool is_retry) {
    if (is_retry) ++st.alloc_retries;
    if (fraction_set && st.reserved_bytes + alloc_size > allowed_max) return nullptr;
    if (settings.expandable_segments) return try_allocate_expandable(pool, size, stream);
    if (!device_has_room(alloc_size)) return nullptr;
    auto seg = std::make_unique<Segment>();
    seg->base = take_va(alloc_size);
    seg->size = alloc_size;
    seg->stream = stream;
    seg->small = pool.small;
    auto* b = new Block;
    b->addr = seg->base;
    b->size = alloc_size;
    b->stream = stream;
    b->segment = seg.get();
    b->pool = &pool;
    segments.emplace(seg->base, std::move(seg));
    ++st.device_alloc_count;
    add_reserved(b, alloc_size);
    event(AllocatorSegmentEvent::Kind::Alloc, b->addr, alloc_size, stream);
    return b;
  }

  // --- expandable segments -----------------------------------------------------------------
  Block* find_expandable_block(Pool& pool, std::uint64_t size, std::uint64_t stream) {
    auto allocatable = [](const Block* b) { return b && !b->allocated; };
    auto has_room = [&](const Block* b) {
      std::uint64_t bytes = 0;
      while (bytes < size && allocatable(b)) {
        bytes += b->size;
        b = b->next;
      }
      return bytes >= size;
    };
    Block key;
    key.stream = stream;
    key.addr = 0;
    for (auto it = pool.unmapped.lower_bound(&key);
         it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
      Block* c = *it;
      if (allocatable(c->prev)) c = c->prev;
      if (has_room(c)) return c;
    }
    const std::uint64_t page = pool.small ? kAllocSmallBuffer : settings.large_segment_bytes;
    // Capped so that the sum and the rounding below cannot wrap past 2^64.
    const std::uint64_t total =
        std::min(settings.capacity_bytes ? settings.capacity_bytes : kUnlimitedVaBytes, kMaxRequestBytes);
    const std::uint64_t va = round_up(total + total / 8, page);
    if (va < size) return nullptr;  // larger than the address space torch reserves: cannot map
    auto seg = std::make_unique<Segment>();
    seg->base = take_va(va);
    seg->size = va;
    seg->page = page;
    seg->stream = stream;
    seg->small = pool.small;
    seg->expandable = true;
    auto* b = new Block;
    b->addr = seg->base;
    b->size = va;
    b->stream = stream;
    b->segment = seg.get();
    b->pool = &pool;
    b->mapped = false;
    segments.emplace(seg->base, std::move(seg));
    pool.unmapped.insert(b);
    return b;
  }

  bool map_block(Block* to_map, std::uint64_t size) {
    const Segment& seg = *to_map->segment;
    const std::uint64_t begin = (to_map->addr - seg.base) / seg.page;
    const std::uint64_t end = (to_map->addr + size - seg.base + seg.page - 1) / seg.page;
    const std::uint64_t mapped = (end - begin) * seg.page;
    if (mapped == 0) return true;
    if (!device_has_room(mapped)) return false;  // cuMemCreate fails: nothing is mapped
    Pool& pool = *to_map->pool;
    pool.unmapped.erase(to_map);
    to_map->mapped = true;
    if (mapped < to_map->size) {
      auto* rest = new Block;
      rest->addr = to_map->addr + mapped;
      rest->size = to_map->size - mapped;
      rest->stream = to_map->stream;
      rest->segment = to_map->segment;
      rest->pool = &pool;
      rest->mapped = false;
      rest->prev = to_map;
      rest->next = to_map->next;
      if (rest->next) rest->next->prev = rest;
      to_map->next = rest;
      pool.unmapped.insert(rest);
      to_map->size = mapped;
    }
    try_merge(to_map, to_map->prev);
    try_merge(to_map, to_map->next);
    pool.insert(to_map);
    ++st.device_alloc_count;
    add_reserved(to_map, mapped);
    event(AllocatorSegmentEvent::Kind::Map, seg.base + begin * seg.page, mapped, to_map->stream);
    return true;
  }

  Block* try_allocate_expandable(Pool& pool, std::uint64_t size, std::uint64_t stream) {
    Block* c = find_expandable_block(pool, size, stream);
    if (c == nullptr) return nullptr;
    if (!c->mapped && !map_block(c, std::min(c->size, size))) return nullptr;
    while (c->size < size) {
      Block* next = c->next;
      if (!map_block(next, std::min(size - c->size, next->size))) return nullptr;
      c = next;  // map_block merged the free block before it into `next`
    }
    pool.blocks.erase(c);
    return c;
  }

  // unmap_block: returns the whole pages inside a free expandable block to the device.
  void unmap_block(Block* b) {
    const Segment& seg = *b->segment;
    const std::uint64_t begin = (b->addr - seg.base + seg.page - 1) / seg.page;
    const std::uint64_t end = (b->addr + b->size - seg.base) / seg.page;
    if (begin >= end) return;
    Pool& pool = *b->pool;
    pool.blocks.erase(b);
    const std::uint64_t un_addr = seg.base + begin * seg.page;
    const std::uint64_t un_size = (end - begin) * seg.page;
    const std::uint64_t before = un_addr - b->addr;
    if (before > 0) {
      auto* f = new Block;
      f->addr = b->addr;
      f->size = before;
      f->stream = b->stream;
      f->segment = b->segment;
      f->pool = &pool;
      f->prev = b->prev;
      f->next = b;
      if (f->prev) f->prev->next = f;
      b->prev = f;
      pool.insert(f);
    }
    const std::uint64_t after = b->size - before - un_size;
    if (after > 0) {
      auto* f = new Block;
      f->addr = un_addr + un_size;
      f->size = after;
      f->stream = b->stream;
      f->segment = b->segment;
      f->pool = &pool;
      f->prev = b;
      f->next = b->next;
      if (f->next) f->next->prev = f;
      b->next = f;
      pool.insert(f);
    }
    b->addr = un_addr;
    b->size = un_size;
    b->mapped = false;
    try_merge(b, b->prev);
    try_merge(b, b->next);
    pool.unmapped.insert(b);
    sub_reserved(b, un_size);
    ++st.device_free_count;
    event(AllocatorSegmentEvent::Kind::Unmap, un_addr, un_size, b->stream);
  }

  void release_expandable_segment(Block* b) {
    b->pool->unmapped.erase(b);
    segments.erase(b->segment->base);
    delete b;
  }

  // release_block: cudaFree of a wholly free, unsplit, non-expandable segment.
  void release_block(Block* b) {
    ++st.device_free_count;
    b->pool->blocks.erase(b);
    sub_reserved(b, b->size);
    event(AllocatorSegmentEvent::Kind::Free, b->addr, b->size, b->stream);
    segments.erase(b->segment->base);
    delete b;
  }
  static bool releasable(const Block* b) { return !b->is_split() && !b->expandable(); }

  // release_available_cached_blocks: frees oversize cached blocks, enough for the request.
  bool release_available(Pool& pool, std::uint64_t size, std::uint64_t stream) {
    if (max_split == kNoLimit) return false;
    Block key;
    key.stream = stream;
    key.size = std::max(size, max_split);
    key.addr = 0;
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) {
      if (it == pool.blocks.begin()) return false;
      std::uint64_t released = 0;
      --it;
      while (released < key.size && (*it)->size >= max_split && (*it)->stream == stream) {
        auto cur = it;
        const bool at_begin = it == pool.blocks.begin();
        if (!at_begin) --it;
        if (releasable(*cur)) {
          released += (*cur)->size;
          release_block(*cur);
        }
        if (at_begin) break;
      }
      return released >= key.size;
    }
    if (!releasable(*it)) return false;
    release_block(*it);
    return true;
  }

  void release_blocks(Pool& pool) {
    std::vector<Block*> to_unmap;
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* b = *it++;
      if (b->expandable()) {
        to_unmap.push_back(b);
      } else if (!b->is_split()) {
        release_block(b);
      }
    }
    for (Block* b : to_unmap) {
      unmap_block(b);
      if (!b->mapped && !b->prev && !b->next) release_expandable_segment(b);
    }
  }

  bool release_cached() {
    release_blocks(large);
    release_blocks(small);
    return true;
  }

  // garbage_collect_cached_blocks: frees the least recently reused unsplit large blocks once
  // reserved memory passes threshold * allowed maximum.
  void garbage_collect() {
    const auto threshold = static_cast<std::uint64_t>(settings.garbage_collection_threshold *
                                                      static_cast<double>(allowed_max));
    if (st.reserved_bytes <= threshold) return;
    const std::uint64_t target = st.reserved_bytes - threshold;
    std::uint64_t reclaimed = 0;
    double total_age = 0;
    int count = 0;
    auto age = [&](const Block* b) {
      return static_cast<double>(large.get_free_blocks_call_count - b->gc_count_base);
    };
    for (Block* b : large.blocks) {
      if (releasable(b)) {
        total_age += age(b);
        ++count;
      }
    }
    if (count == 0) return;
    bool freed = true;
    while (reclaimed < target && freed && count > 0) {
      const double threshold_age = total_age / count;
      freed = false;
      for (auto it = large.blocks.begin(); it != large.blocks.end();) {
        Block* b = *it++;
        if (releasable(b) && age(b) >= threshold_age) {
          freed = true;
          reclaimed += b->size;
          total_age -= age(b);
          --count;
          release_block(b);
        }
      }
    }
  }

  Block* alloc_found_block(Block* b, Pool& pool, std::uint64_t size, std::uint64_t requested,
                           std::uint64_t stream) {
    const bool already_split = b->is_split();
    const bool track_split = !b->expandable();
    if (should_split(b, size)) {
      Block* rest = b;
      b = new Block;
      b->addr = rest->addr;
      b->size = size;
      b->stream = stream;
      b->segment = rest->segment;
      b->pool = &pool;
      b->prev = rest->prev;
      if (b->prev) b->prev->next = b;
      b->next = rest;
      rest->prev = b;
      rest->addr += size;
      rest->size -= size;
      pool.insert(rest);
      if (track_split) {
        if (already_split) {
          st.inactive_split_bytes -= size;
        } else {
          st.inactive_split_bytes += rest->size;
          ++st.inactive_split_count;
        }
      }
    } else if (already_split && track_split) {
      st.inactive_split_bytes -= b->size;
      --st.inactive_split_count;
    }
    b->allocated = true;
    b->requested = requested;
    st.allocated_bytes += b->size;
    st.requested_bytes += requested;
    (pool.small ? st.small_allocated_bytes : st.large_allocated_bytes) += b->size;
    ++st.active_count;
    st.peak_allocated_bytes = std::max(st.peak_allocated_bytes, st.allocated_bytes);
    st.peak_requested_bytes = std::max(st.peak_requested_bytes, st.requested_bytes);
    return b;
  }

  void free_block(Block* b) {
    Pool& pool = *b->pool;
    b->allocated = false;
    st.allocated_bytes -= b->size;
    st.requested_bytes -= b->requested;
    (pool.small ? st.small_allocated_bytes : st.large_allocated_bytes) -= b->size;
    --st.active_count;
    b->requested = 0;
    std::int64_t net_blocks = 0;
    std::int64_t net_bytes = 0;
    for (Block* candidate : {b->prev, b->next}) {
      const std::uint64_t subsumed = try_merge(b, candidate);
      if (subsumed > 0) {
        net_blocks -= 1;
        net_bytes -= static_cast<std::int64_t>(subsumed);
      }
    }
    pool.insert(b);
    if (b->is_split()) {
      net_blocks += 1;
      net_bytes += static_cast<std::int64_t>(b->size);
    }
    if (!b->expandable()) {
      st.inactive_split_count =
          static_cast<std::uint64_t>(static_cast<std::int64_t>(st.inactive_split_count) + net_blocks);
      st.inactive_split_bytes =
          static_cast<std::uint64_t>(static_cast<std::int64_t>(st.inactive_split_bytes) + net_bytes);
    }
  }

  MallocResult malloc(std::uint64_t id, std::uint64_t requested, std::uint64_t stream) {
    MallocResult r = malloc_inner(id, requested, stream);
    segment_hint = 0;  // a hint serves only the request right after it
    return r;
  }

  MallocResult malloc_inner(std::uint64_t id, std::uint64_t requested, std::uint64_t stream) {
    MallocResult r;
    r.requested_bytes = requested;
    if (live.contains(id)) {
      r.status = MallocStatus::DuplicateId;
      return r;
    }
    if (requested == 0) {  // torch hands out a null pointer without touching the pools
      live.emplace(id, nullptr);
      return r;
    }
    call_segment_bytes = 0;
    call_released_bytes = 0;
    if (requested > kMaxRequestBytes) {  // no device has it; rounding it would wrap past 2^64
      ++st.oom_count;
      r.status = MallocStatus::OutOfMemory;
      return r;
    }
    const std::uint64_t size = cuda_round_size(requested, rules);
    Pool& pool = pool_for(size);
    const std::uint64_t alloc_size = allocator_segment_size(size, settings);
    r.small_pool = pool.small;
    Block* b = get_free_block(pool, size, stream);
    if (!b) {
      if (gc_enabled) garbage_collect();
      b = alloc_block(pool, size, alloc_size, stream, false);
      if (!b && release_available(pool, size, stream)) {
        b = alloc_block(pool, size, alloc_size, stream, false);
      }
      if (!b && release_cached()) b = alloc_block(pool, size, alloc_size, stream, true);
    }
    r.segment_bytes = call_segment_bytes;
    r.released_bytes = call_released_bytes;
    r.segment_created = call_segment_bytes > 0;
    if (!b) {
      ++st.oom_count;
      r.status = MallocStatus::OutOfMemory;
      return r;
    }
    b = alloc_found_block(b, pool, size, requested, stream);
    live.emplace(id, b);
    r.block_bytes = b->size;
    r.address = b->addr;
    return r;
  }

  bool free(std::uint64_t id) {
    auto it = live.find(id);
    if (it == live.end()) return false;
    Block* b = it->second;
    live.erase(it);
    if (b) free_block(b);
    return true;
  }

  std::uint64_t empty_cache() {
    call_released_bytes = 0;
    release_cached();
    return call_released_bytes;
  }

  std::uint64_t release_at(std::uint64_t address) {
    call_released_bytes = 0;
    for (Pool* p : {&small, &large}) {
      Block* found = nullptr;
      for (Block* b : p->blocks) {
        // torch records a segment's base for cudaFree, the first unmapped page for an unmap
        const bool hit = b->expandable() ? (b->addr <= address && address - b->addr < b->size)
                                         : b->addr == address;
        if (hit) {
          found = b;
          break;
        }
      }
      if (!found) continue;
      if (found->expandable()) {
        unmap_block(found);
        if (!found->mapped && !found->prev && !found->next) release_expandable_segment(found);
      } else if (!found->is_split()) {
        release_block(found);
      }
      break;
    }
    return call_released_bytes;
  }

  // All blocks grouped by segment, in address order.
  std::vector<AllocatorSegmentInfo> snapshot() const {
    std::vector<const Block*> all;
    all.reserve(live.size() + small.blocks.size() + large.blocks.size());
    for (const auto& [id, b] : live) {
      if (b) all.push_back(b);
    }
    for (const Pool* p : {&small, &large}) {
      all.insert(all.end(), p->blocks.begin(), p->blocks.end());
      all.insert(all.end(), p->unmapped.begin(), p->unmapped.end());
    }
    std::sort(all.begin(), all.end(),
              [](const Block* a, const Block* b) { return a->addr < b->addr; });
    std::vector<AllocatorSegmentInfo> out;
    const Block* prev = nullptr;
    for (const Block* b : all) {
      if (!b->mapped) {
        prev = b;
        continue;
      }
      // A new snapshot segment starts at a segment head or after an unmapped range.
      if (!prev || prev->segment != b->segment || !prev->mapped || b->prev == nullptr) {
        AllocatorSegmentInfo s;
        s.address = b->addr;
        s.stream = b->stream;
        s.is_large = !b->pool->small;
        s.is_expandable = b->expandable();
        out.push_back(std::move(s));
      }
      AllocatorSegmentInfo& s = out.back();
      s.blocks.push_back({b->addr, b->size, b->requested, b->allocated});
      s.total_bytes += b->size;
      if (b->allocated) {
        s.allocated_bytes += b->size;
        s.requested_bytes += b->requested;
      }
      prev = b;
    }
    return out;
  }

  std::uint64_t count_segments() const {
    std::uint64_t n = 0;
    for (const auto& [base, seg] : segments) {
      if (!seg->expandable) ++n;
    }
    // Expandable segments: one per contiguous mapped range, as the snapshot lists them.
    auto run_start = [](const Block* b) {
      return b->expandable() && b->mapped && (!b->prev || !b->prev->mapped);
    };
    for (const Pool* p : {&small, &large}) {
      for (const Block* b : p->blocks) n += run_start(b) ? 1 : 0;
    }
    for (const auto& [id, b] : live) n += (b && run_start(b)) ? 1 : 0;
    return n;
  }
};

AllocatorModel::AllocatorModel(AllocatorSettings settings)
    : impl_(std::make_unique<Impl>(std::move(settings))) {}
AllocatorModel::~AllocatorModel() = default;
AllocatorModel::AllocatorModel(AllocatorModel&&) noexcept = default;
AllocatorModel& AllocatorModel::operator=(AllocatorModel&&) noexcept = default;

MallocResult AllocatorModel::malloc(std::uint64_t alloc_id, std::uint64_t requested_bytes,
                                    std::uint64_t stream) noexcept {
  try {
    return impl_->malloc(alloc_id, requested_bytes, stream);
  } catch (...) {  // std::bad_alloc of the model's own bookkeeping
    MallocResult r;
    r.status = MallocStatus::OutOfMemory;
    r.requested_bytes = requested_bytes;
    return r;
  }
}
bool AllocatorModel::free(std::uint64_t alloc_id) noexcept {
  try {
    return impl_->free(alloc_id);
  } catch (...) {
    return false;
  }
}
std::uint64_t AllocatorModel::empty_cache() noexcept {
  try {
    return impl_->empty_cache();
  } catch (...) {
    return 0;
  }
}
void AllocatorModel::reset_peaks() noexcept {
  impl_->st.peak_allocated_bytes = impl_->st.allocated_bytes;
  impl_->st.peak_reserved_bytes = impl_->st.reserved_bytes;
  impl_->st.peak_requested_bytes = impl_->st.requested_bytes;
}
std::uint64_t AllocatorModel::allocated_bytes() const noexcept { return impl_->st.allocated_bytes; }
std::uint64_t AllocatorModel::reserved_bytes() const noexcept { return impl_->st.reserved_bytes; }
std::uint64_t AllocatorModel::peak_allocated_bytes() const noexcept {
  return impl_->st.peak_allocated_bytes;
}
std::uint64_t AllocatorModel::peak_reserved_bytes() const noexcept {
  return impl_->st.peak_reserved_bytes;
}
std::uint64_t AllocatorModel::segment_count() const noexcept { return impl_->count_segments(); }

AllocatorStats AllocatorModel::stats() const {
  AllocatorStats s = impl_->st;
  s.segment_count = impl_->count_segments();
  for (const Pool* p : {&impl_->small, &impl_->large}) {
    std::uint64_t largest = 0;
    for (const Block* b : p->blocks) largest = std::max(largest, b->size);
    (p->small ? s.largest_free_small_bytes : s.largest_free_large_bytes) = largest;
  }
  return s;
}
std::vector<AllocatorSegmentInfo> AllocatorModel::segments() const { return impl_->snapshot(); }
AllocatorBlockInfo AllocatorModel::block_of(std::uint64_t alloc_id) const noexcept {
  auto it = impl_->live.find(alloc_id);
  if (it == impl_->live.end() || !it->second) return {};
  const Block* b = it->second;
  return {b->addr, b->size, b->requested, true};
}
const AllocatorSettings& AllocatorModel::settings() const noexcept { return impl_->settings; }
void AllocatorModel::record_segment_events(bool enabled) noexcept { impl_->record_events = enabled; }
void AllocatorModel::hint_next_segment_address(std::uint64_t address) noexcept {
  impl_->segment_hint = address;
}
std::uint64_t AllocatorModel::release_cached_segment(std::uint64_t address) noexcept {
  try {
    return impl_->release_at(address);
  } catch (...) {
    return 0;
  }
}
const std::vector<AllocatorSegmentEvent>& AllocatorModel::segment_events() const noexcept {
  return impl_->events;
}

// --- Replay -------------------------------------------------------------------------------

namespace {

// Keeps at most `max_points` buckets of consecutive actions; when full, neighbouring buckets
// are merged and the bucket width doubles, so memory stays bounded for any length.
class TimelineBuilder {
 public:
  explicit TimelineBuilder(std::size_t max_points) : max_(max_points) {}
  void add(std::uint64_t index, std::uint64_t time_ns, std::uint64_t allocated,
           std::uint64_t reserved) {
    const std::uint64_t bucket = index / width_;
    if (bucket >= points_.size()) {
      points_.push_back({index, time_ns, allocated, reserved});
      if (max_ != 0 && points_.size() > max_) halve();
      return;
    }
    ReplayPoint& p = points_.back();
    p.allocated_bytes = std::max(p.allocated_bytes, allocated);
    p.reserved_bytes = std::max(p.reserved_bytes, reserved);
  }
  std::vector<ReplayPoint> take() { return std::move(points_); }

 private:
  void halve() {
    std::vector<ReplayPoint> merged;
    merged.reserve(points_.size() / 2 + 1);
    for (std::size_t i = 0; i < points_.size(); i += 2) {
      ReplayPoint p = points_[i];
      if (i + 1 < points_.size()) {
        p.allocated_bytes = std::max(p.allocated_bytes, points_[i + 1].allocated_bytes);
        p.reserved_bytes = std::max(p.reserved_bytes, points_[i + 1].reserved_bytes);
      }
      merged.push_back(p);
    }
    points_ = std::move(merged);
    width_ *= 2;
  }
  std::size_t max_;
  std::uint64_t width_ = 1;
  std::vector<ReplayPoint> points_;
};

class Replayer {
 public:
  Replayer(const AllocatorSettings& settings, const ReplayOptions& options)
      : model_(settings), options_(options), timeline_(options.timeline_points) {
    result_.settings = settings;
    model_.record_segment_events(options.keep_segment_events);
  }

  void apply(const AllocatorAction& a) {
    const std::uint64_t index = result_.actions++;
    switch (a.kind) {
      case AllocatorAction::Kind::Alloc: {
        ++result_.allocs;
        if (model_.block_of(a.address).bytes != 0 || failed_.contains(a.address)) {
          // The recording says this address is live again: its free was not recorded.
          ++result_.duplicate_allocs;
          failed_.erase(a.address);
          model_.free(a.address);
        }
        const MallocResult r = model_.malloc(a.address, a.bytes, a.stream);
        if (r.status == MallocStatus::DuplicateId) {
          ++result_.duplicate_allocs;
          model_.free(a.address);
          model_.malloc(a.address, a.bytes, a.stream);
        } else if (!r.ok()) {
          if (result_.failed_allocs++ == 0) result_.first_failure_index = index;
          failed_.insert(a.address);
        }
        break;
      }
      case AllocatorAction::Kind::Free:
        ++result_.frees;
        if (!model_.free(a.address) && !failed_.erase(a.address)) ++result_.unmatched_frees;
        break;
      case AllocatorAction::Kind::EmptyCache:
        model_.empty_cache();
        break;
      case AllocatorAction::Kind::SegmentHint:
        model_.hint_next_segment_address(a.address);
        break;
      case AllocatorAction::Kind::ReleaseSegment:
        model_.release_cached_segment(a.address);
        break;
    }
    const std::uint64_t alloc = model_.allocated_bytes();
    const std::uint64_t res = model_.reserved_bytes();
    if (alloc > last_peak_alloc_) {
      last_peak_alloc_ = alloc;
      result_.peak_allocated_time_ns = a.time_ns;
    }
    if (res > last_peak_res_) {
      last_peak_res_ = res;
      result_.peak_reserved_time_ns = a.time_ns;
    }
    timeline_.add(index, a.time_ns, alloc, res);
  }

  ReplayResult finish() {
    result_.final_stats = model_.stats();
    result_.timeline = timeline_.take();
    if (options_.keep_segment_events) result_.segment_events = model_.segment_events();
    return std::move(result_);
  }
  ReplayResult& result() { return result_; }

 private:
  AllocatorModel model_;
  ReplayOptions options_;
  TimelineBuilder timeline_;
  ReplayResult result_;
  absl::flat_hash_set<std::uint64_t> failed_;
  std::uint64_t last_peak_alloc_ = 0;
  std::uint64_t last_peak_res_ = 0;
};

}  // namespace

ReplayResult replay_allocator_actions(const std::vector<AllocatorAction>& actions,
                                      const AllocatorSettings& settings,
                                      const ReplayOptions& options) {
  Replayer r(settings, options);
  for (const AllocatorAction& a : actions) r.apply(a);
  return r.finish();
}

ReplayResult replay_trace_through_allocator(const std::string& trace_path,
                                            const AllocatorSettings& settings,
                                            const ReplayOptions& options) {
  TraceReader reader(trace_path);
  Replayer r(settings, options);
  bool have_device = options.device != -2;
  Device device = options.device >= 0 ? Device{DeviceType::CUDA, static_cast<std::int16_t>(options.device)}
                                      : Device{};
  if (!have_device) {  // the first CUDA device seen, else the CPU
    Event e;
    while (reader.next(e)) {
      if ((e.kind == EventKind::Alloc) && e.device.type == DeviceType::CUDA) {
        device = e.device;
        break;
      }
    }
    reader.rewind();
  }
  absl::flat_hash_map<std::uint64_t, std::uint64_t> recorded;  // addr -> recorded bytes
  std::uint64_t recorded_live = 0;
  // What-if replay: a run of recorded segment releases not followed by a segment allocation
  // (which would make it the release-and-retry of a request) is an empty_cache() call.
  bool pending_release = false;
  std::uint64_t pending_time = 0;
  auto flush_release = [&] {
    if (!pending_release) return;
    pending_release = false;
    AllocatorAction a;
    a.kind = AllocatorAction::Kind::EmptyCache;
    a.time_ns = pending_time;
    r.apply(a);
  };
  Event e;
  while (reader.next(e)) {
    if (e.device != device) continue;
    if (!options.use_recorded_segment_addresses) {
      if (e.kind == EventKind::SegmentFree) {
        pending_release = true;
        pending_time = e.time_ns;
        continue;
      }
      if (e.kind == EventKind::SegmentAlloc || e.kind == EventKind::Oom) pending_release = false;
      if (e.kind == EventKind::Alloc || e.kind == EventKind::Free) flush_release();
    }
    if ((e.kind == EventKind::SegmentAlloc || e.kind == EventKind::SegmentFree) &&
        options.use_recorded_segment_addresses) {
      AllocatorAction hint;
      hint.kind = e.kind == EventKind::SegmentAlloc ? AllocatorAction::Kind::SegmentHint
                                                    : AllocatorAction::Kind::ReleaseSegment;
      hint.address = e.addr;
      hint.time_ns = e.time_ns;
      r.apply(hint);
      continue;
    }
    if (e.kind != EventKind::Alloc && e.kind != EventKind::Free) continue;
    AllocatorAction a;
    a.address = e.addr;
    a.stream = e.stream;
    a.time_ns = e.time_ns;
    if (e.kind == EventKind::Alloc) {
      a.kind = AllocatorAction::Kind::Alloc;
      a.bytes = e.requested_bytes != 0 ? e.requested_bytes : e.bytes;
      auto [it, inserted] = recorded.try_emplace(e.addr, e.bytes);
      if (!inserted) {
        recorded_live -= it->second;
        it->second = e.bytes;
      }
      recorded_live += e.bytes;
      r.result().recorded_peak_bytes = std::max(r.result().recorded_peak_bytes, recorded_live);
    } else {
      a.kind = AllocatorAction::Kind::Free;
      auto it = recorded.find(e.addr);
      if (it != recorded.end()) {
        recorded_live -= it->second;
        recorded.erase(it);
      }
    }
    r.apply(a);
  }
  flush_release();
  ReplayResult out = r.finish();
  out.truncated = reader.truncated();
  out.problem = reader.problem();
  return out;
}

}  // namespace ridgescope
