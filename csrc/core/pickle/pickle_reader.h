// pickle_reader.h — a restricted Python unpickler for plain data (internal to the core).
//
// Reads protocol 2-4 pickles into a tree of None, bool, int, float, str, list, tuple and dict.
// It is a whitelist: an opcode outside that set (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST,
// OBJ, NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID, EXT1-4, bytes, sets, BINUNICODE8, LONG4, protocol
// 0 text opcodes, ...) is refused with an error naming it and its byte offset. Nothing is ever
// called or constructed beyond those plain values, so a hostile file cannot run code.
//
// Limits, all checked before anything is allocated:
//   * every length field (strings, LONG1, FRAME) must fit in the bytes that remain;
//   * nesting depth of containers (default 256): deeper input is refused, so nothing that walks
//     or destroys the tree recurses deeper than the limit (the parser itself never recurses);
//   * entries on the unpickling stack (default 8 Mi), bounded before the depth is known;
//   * values created in total (default 64 Mi): memo references share containers, never copy;
//   * a container fetched from the memo is frozen: adding to it later (only a recursive,
//     self-referencing pickle does that) is refused, so the tree never has a cycle;
//   * a truncated file, a missing STOP, trailing bytes after STOP, a protocol outside 2-4.
//
// Thread-safety: parse_pickle() is reentrant; a PickleValue tree is immutable once returned
// and may be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
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

struct PickleValue;
using PickleList = std::vector<PickleValue>;
using PickleDict = std::vector<std::pair<PickleValue, PickleValue>>;  // in file order

struct PickleContainer;  // list, tuple or dict items (shared by memo references)

struct PickleValue {
  enum class Type : std::uint8_t { None, Bool, Int, Float, Str, List, Tuple, Dict };

  Type type = Type::None;
  bool boolean = false;
  // Int: sign and magnitude, so every value of LONG1 up to 9 bytes (-2^64..2^64-1) fits.
  bool negative = false;
  std::uint64_t magnitude = 0;
  double real = 0;
  std::shared_ptr<const std::string> text;          // Str
  std::shared_ptr<PickleContainer> items;           // List, Tuple, Dict

  bool is_int() const noexcept { return type == Type::Int; }
  bool is_str() const noexcept { return type == Type::Str; }
  bool is_list_like() const noexcept { return type == Type::List || type == Type::Tuple; }
  bool is_dict() const noexcept { return type == Type::Dict; }

  // Int as int64 / uint64; false when it does not fit.
  bool to_int64(std::int64_t* out) const noexcept;
  bool to_uint64(std::uint64_t* out) const noexcept;
  std::string_view str() const noexcept { return text ? std::string_view(*text) : std::string_view(); }
  const PickleList& list() const;  // List or Tuple (empty for other types)
  const PickleDict& dict() const;  // Dict (empty for other types)

  // Dict lookup by string key (the first match); nullptr when absent or not a dict.
  const PickleValue* get(std::string_view key) const;
};

struct PickleContainer {
  PickleList list;
  PickleDict dict;
  std::uint32_t depth = 1;  // 1 + the deepest child container
  bool frozen = false;      // fetched from the memo: no more items may be added
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
};

// Parses a whole pickle held in memory. Throws PickleError naming the problem and the offset.
PickleResult parse_pickle(std::string_view bytes, const PickleLimits& limits = {});

// The name of a pickle opcode byte ("GLOBAL", "REDUCE", ...) or "0x.." when it has none.
std::string pickle_opcode_name(unsigned char op);

}  // namespace ridgescope::detail
