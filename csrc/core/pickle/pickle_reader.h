// pickle_reader.h — a restricted Python unpickler for plain data (internal to the core).
//
// Reads protocol 2-5 pickles into a tree of None, bool, int, float, str, bytes, list, tuple,
// set and dict. It is a whitelist: an opcode outside that set (GLOBAL, STACK_GLOBAL, REDUCE,
// BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID, EXT1-4, LONG4, protocol 0/1 text
// opcodes, and protocol 5's out-of-band buffers NEXT_BUFFER and READONLY_BUFFER) is refused with
// an error naming it and its byte offset. Nothing is ever called or constructed beyond those
// plain values, so a hostile file cannot run code.
//
// Limits, all checked before anything is allocated:
//   * every length field (strings, bytes, LONG1, FRAME) must fit in the bytes that remain;
//   * nesting depth of containers (default 256): deeper input is refused, so nothing that walks
//     the tree recurses deeper than the limit (the parser itself never recurses);
//   * entries on the unpickling stack (default 8 Mi), bounded before the depth is known;
//   * values created in total (default 64 Mi): memo references share containers, never copy;
//   * a container fetched from the memo is frozen: adding to it later (only a recursive,
//     self-referencing pickle does that) is refused, so the tree never has a cycle;
//   * a truncated file, a missing STOP, trailing bytes after STOP, a protocol outside 2-5.
//
// Memory. A value is 16 bytes. Strings and bytes are not copied: they point into the input,
// which must outlive the result (the rvalue overload is deleted for that reason). Containers
// live in the result's arena; a value refers to its container by pointer, so memo references
// share it and destroying the tree is one pass over the arena, never a recursion.
//
// Thread-safety: parse_pickle() is reentrant; a PickleResult is immutable once returned and may
// be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace ridgescope::detail {

class PickleError : public std::runtime_error {
 public:
  PickleError(const std::string& message, std::uint64_t offset)
      : std::runtime_error(message), offset_(offset) {}
  std::uint64_t offset() const noexcept { return offset_; }  // byte offset of the problem

 private:
  std::uint64_t offset_;
};

struct PickleContainer;  // list, tuple, set or dict items (shared by memo references)
class PickleDictView;
struct PickleValue;

class PickleSpan;

struct PickleValue {
  enum class Type : std::uint8_t { None, Bool, Int, Float, Str, Bytes, List, Tuple, Set, Dict };

  Type type = Type::None;
  bool boolean = false;   // Bool
  bool negative = false;  // Int: sign and magnitude, so every LONG1 up to 9 bytes (-2^64..2^64-1) fits
  std::uint32_t length = 0;  // Str, Bytes: bytes of text
  union {
    std::uint64_t magnitude = 0;  // Int
    double real;                  // Float
    const char* chars;            // Str, Bytes: into the parsed input
    PickleContainer* items;       // List, Tuple, Set, Dict: in the result's arena
  };

  bool is_int() const noexcept { return type == Type::Int; }
  bool is_str() const noexcept { return type == Type::Str; }
  bool is_list_like() const noexcept { return type == Type::List || type == Type::Tuple; }
  bool is_dict() const noexcept { return type == Type::Dict; }
  bool is_container() const noexcept {
    return type == Type::List || type == Type::Tuple || type == Type::Set || type == Type::Dict;
  }

  // Int as int64 / uint64; false when it does not fit.
  bool to_int64(std::int64_t* out) const noexcept;
  bool to_uint64(std::uint64_t* out) const noexcept;
  // Str: its UTF-8 text; "" for other types.
  std::string_view str() const noexcept { return type == Type::Str ? std::string_view(chars, length) : std::string_view(); }
  // Bytes: its bytes; "" for other types.
  std::string_view bytes() const noexcept {
    return type == Type::Bytes ? std::string_view(chars, length) : std::string_view();
  }
  PickleSpan list() const noexcept;  // List or Tuple (empty for other types)
  PickleSpan set() const noexcept;   // Set (a frozenset too; empty for other types)
  PickleDictView dict() const noexcept;                   // Dict (empty for other types)
  // The container's identity (equal for memo references to one container); nullptr for scalars.
  const void* identity() const noexcept { return is_container() ? items : nullptr; }
  // 1 + the deepest child container; 0 for scalars.
  std::uint32_t depth() const noexcept;

  // Dict lookup by string key (the first match); nullptr when absent or not a dict.
  const PickleValue* get(std::string_view key) const noexcept;
};
static_assert(sizeof(PickleValue) == 16, "a pickle value is 16 bytes");
static_assert(std::is_trivially_copyable_v<PickleValue> && std::is_trivially_destructible_v<PickleValue>);

// A container's values: a contiguous, read-only range.
class PickleSpan {
 public:
  PickleSpan() = default;
  PickleSpan(const PickleValue* data, std::size_t size) : data_(data), size_(size) {}
  const PickleValue* begin() const { return data_; }
  const PickleValue* end() const { return data_ + size_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const PickleValue& operator[](std::size_t i) const { return data_[i]; }
  const PickleValue& back() const { return data_[size_ - 1]; }

 private:
  const PickleValue* data_ = nullptr;
  std::size_t size_ = 0;
};

struct PickleContainer {
  PickleValue* values = nullptr;  // dicts: key, value, key, value, ... in file order; in the arena
  std::uint32_t size = 0, capacity = 0;
  std::uint32_t depth = 1;  // 1 + the deepest child container
  bool frozen = false;      // fetched from the memo: no more items may be added
  PickleSpan span() const { return PickleSpan(values, size); }
};

// Where a tree's containers and their values live: containers in a deque (they never move),
// values in large chunks handed out in order (a container's values are contiguous; one that
// grows past its block moves to a block twice as large). Freed all at once.
class PickleArena {
 public:
  PickleContainer& new_container() { return containers_.emplace_back(); }
  // Room for `n` values, contiguous, uninitialised.
  PickleValue* take(std::size_t n);
  std::uint64_t value_bytes() const { return chunk_bytes_; }  // bytes held for values

 private:
  std::deque<PickleContainer> containers_;
  std::vector<std::unique_ptr<std::byte[]>> chunks_;
  PickleValue* next_ = nullptr;
  std::size_t left_ = 0;
  std::uint64_t chunk_bytes_ = 0;
};

// A dict's items in file order, as (key, value) pairs of references.
class PickleDictView {
 public:
  class iterator {
   public:
    using value_type = std::pair<const PickleValue&, const PickleValue&>;
    using difference_type = std::ptrdiff_t;
    using iterator_category = std::forward_iterator_tag;
    explicit iterator(const PickleValue* p) : p_(p) {}
    value_type operator*() const { return {p_[0], p_[1]}; }
    iterator& operator++() {
      p_ += 2;
      return *this;
    }
    bool operator==(const iterator& o) const { return p_ == o.p_; }
    bool operator!=(const iterator& o) const { return p_ != o.p_; }

   private:
    const PickleValue* p_;
  };
  PickleDictView(const PickleValue* begin, std::size_t pairs) : begin_(begin), pairs_(pairs) {}
  iterator begin() const { return iterator(begin_); }
  iterator end() const { return iterator(begin_ + 2 * pairs_); }
  std::size_t size() const { return pairs_; }
  bool empty() const { return pairs_ == 0; }

 private:
  const PickleValue* begin_;
  std::size_t pairs_;
};

// The name of a value type for messages ("dict", "int", ...).
std::string_view pickle_type_name(PickleValue::Type type) noexcept;

struct PickleLimits {
  std::uint32_t max_depth = 256;
  std::uint64_t max_values = 64ull * 1024 * 1024;
  std::uint64_t max_stack = 8ull * 1024 * 1024;
};

struct PickleResult {
  PickleValue root;
  int protocol = 0;
  std::uint64_t values = 0;  // values created
  // The containers of the tree and their values.
  std::unique_ptr<PickleArena> arena;
};

// Parses a whole pickle held in memory. Throws PickleError naming the problem and the offset.
// The result's strings point into `bytes`, which must outlive it.
PickleResult parse_pickle(std::string_view bytes, const PickleLimits& limits = {});
PickleResult parse_pickle(std::string&& bytes, const PickleLimits& limits = {}) = delete;

// The name of a pickle opcode byte ("GLOBAL", "REDUCE", ...) or "0x.." when it has none.
std::string pickle_opcode_name(unsigned char op);

}  // namespace ridgescope::detail
