// pickle_reader.cpp — see pickle_reader.h.
#include "pickle_reader.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"

namespace ridgescope::detail {
namespace {

std::string hex_byte(unsigned char op) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  s.push_back(digits[op >> 4]);
  s.push_back(digits[op & 0xF]);
  return s;
}

constexpr int kMaxProtocol = 5;

class Parser {
 public:
  Parser(std::string_view bytes, const PickleLimits& limits)
      : b_(bytes), limits_(limits), arena_(std::make_unique<PickleArena>()) {}

  PickleResult run() {
    if (b_.empty()) fail("empty file: not a pickle", 0);
    if (static_cast<unsigned char>(b_[0]) != 0x80) {
      fail("not a protocol 2-5 pickle: the first byte is " + hex_byte(static_cast<unsigned char>(b_[0])) +
               ", not PROTO (0x80)",
           0);
    }
    while (true) {
      if (pos_ >= b_.size()) fail("truncated pickle: the file ends before STOP", pos_);
      const std::size_t at = pos_;
      const auto op = static_cast<unsigned char>(b_[pos_++]);
      switch (op) {
        case 0x80: {  // PROTO
          const unsigned v = u8(at);
          if (at != 0) fail("PROTO after the start of the pickle", at);
          if (v < 2 || v > kMaxProtocol) {
            fail("pickle protocol " + std::to_string(v) + " is not supported (protocols 2 to 5 are)", at);
          }
          protocol_ = static_cast<int>(v);
          break;
        }
        case 0x95: {  // FRAME: an 8-byte length; the frame must fit in the file
          const std::uint64_t n = uint_le(8, at);
          if (n > remaining()) {
            fail("FRAME claims " + std::to_string(n) + " bytes but only " + std::to_string(remaining()) +
                     " remain (truncated or corrupt)",
                 at);
          }
          break;
        }
        case '.': {  // STOP
          if (stack_.size() != 1 || !marks_.empty()) {
            fail("malformed pickle: STOP with " + std::to_string(stack_.size()) + " values and " +
                     std::to_string(marks_.size()) + " marks on the stack (expected one value)",
                 at);
          }
          if (pos_ != b_.size()) {
            fail("trailing data: " + std::to_string(b_.size() - pos_) + " bytes after STOP", pos_);
          }
          PickleResult result;
          result.root = stack_.back();
          result.protocol = protocol_;
          result.values = values_;
          result.arena = std::move(arena_);
          return result;
        }
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case '}': push_container(PickleValue::Type::Dict, at); break;   // EMPTY_DICT
        case ']': push_container(PickleValue::Type::List, at); break;   // EMPTY_LIST
        case ')': push_container(PickleValue::Type::Tuple, at); break;  // EMPTY_TUPLE
        case 0x8f: push_container(PickleValue::Type::Set, at); break;   // EMPTY_SET
        case 'N': push(PickleValue{}, at); break;                      // NONE
        case 0x88: push(make_bool(true), at); break;                   // NEWTRUE
        case 0x89: push(make_bool(false), at); break;                  // NEWFALSE
        case 'K': push(make_int(false, u8(at)), at); break;            // BININT1
        case 'M': push(make_int(false, uint_le(2, at)), at); break;    // BININT2
        case 'J': {                                                    // BININT
          const auto v = static_cast<std::int32_t>(static_cast<std::uint32_t>(uint_le(4, at)));
          push(v < 0 ? make_int(true, static_cast<std::uint64_t>(-static_cast<std::int64_t>(v)))
                     : make_int(false, static_cast<std::uint64_t>(v)),
               at);
          break;
        }
        case 0x8a: push(read_long1(at), at); break;  // LONG1
        case 'G': {                                  // BINFLOAT (big-endian)
          need(8, at);
          std::uint64_t bits = 0;
          for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(b_[pos_ + i]);
          pos_ += 8;
          PickleValue v;
          v.type = PickleValue::Type::Float;
          std::memcpy(&v.real, &bits, sizeof bits);
          push(v, at);
          break;
        }
        case 0x8c: push(read_text(PickleValue::Type::Str, u8(at), at), at); break;         // SHORT_BINUNICODE
        case 'X': push(read_text(PickleValue::Type::Str, uint_le(4, at), at), at); break;  // BINUNICODE
        case 0x8d: push(read_text(PickleValue::Type::Str, uint_le(8, at), at), at); break;  // BINUNICODE8
        case 'C': push(read_text(PickleValue::Type::Bytes, u8(at), at), at); break;        // SHORT_BINBYTES
        case 'B': push(read_text(PickleValue::Type::Bytes, uint_le(4, at), at), at); break;  // BINBYTES
        case 0x8e:                                                                           // BINBYTES8
        case 0x96: push(read_text(PickleValue::Type::Bytes, uint_le(8, at), at), at); break;  // BYTEARRAY8
        case 0x94: memo_put(memo_len(), at); break;                                           // MEMOIZE
        case 'q': memo_put(u8(at), at); break;                                     // BINPUT
        case 'r': memo_put(static_cast<std::uint32_t>(uint_le(4, at)), at); break;  // LONG_BINPUT
        case 'h': memo_get(u8(at), at); break;                                     // BINGET
        case 'j': memo_get(static_cast<std::uint32_t>(uint_le(4, at)), at); break;  // LONG_BINGET
        case 'a': {  // APPEND
          if (stack_.size() < 2) underflow("APPEND", at);
          const PickleValue v = stack_.back();
          stack_.pop_back();
          PickleContainer& c = add_to(stack_.back(), PickleValue::Type::List, "APPEND", at);
          note_child(c, v, at);
          append(c, &v, 1);
          break;
        }
        case 'e':    // APPENDS
        case 0x90: {  // ADDITEMS
          const bool set = op == 0x90;
          const char* name = set ? "ADDITEMS" : "APPENDS";
          const std::size_t mark = pop_mark(name, at);
          if (mark == 0) underflow(name, at);
          PickleContainer& c = add_to(stack_[mark - 1], set ? PickleValue::Type::Set : PickleValue::Type::List, name, at);
          append_items(c, mark, at);
          break;
        }
        case 's': {  // SETITEM
          if (stack_.size() < 3) underflow("SETITEM", at);
          const PickleValue v = stack_.back();
          const PickleValue k = stack_[stack_.size() - 2];
          stack_.resize(stack_.size() - 2);
          check_key(k, at);
          PickleContainer& c = add_to(stack_.back(), PickleValue::Type::Dict, "SETITEM", at);
          note_child(c, v, at);
          const PickleValue kv[2] = {k, v};
          append(c, kv, 2);
          break;
        }
        case 'u': {  // SETITEMS
          const std::size_t mark = pop_mark("SETITEMS", at);
          if (mark == 0) underflow("SETITEMS", at);
          if ((stack_.size() - mark) % 2 != 0) fail("malformed pickle: SETITEMS with an odd number of items", at);
          PickleContainer& c = add_to(stack_[mark - 1], PickleValue::Type::Dict, "SETITEMS", at);
          for (std::size_t i = mark; i < stack_.size(); i += 2) check_key(stack_[i], at);
          append_items(c, mark, at);
          break;
        }
        case 'l':     // LIST
        case 't':     // TUPLE
        case 0x91: {  // FROZENSET
          const auto type = op == 'l' ? PickleValue::Type::List : op == 't' ? PickleValue::Type::Tuple : PickleValue::Type::Set;
          const std::size_t mark = pop_mark(op == 'l' ? "LIST" : op == 't' ? "TUPLE" : "FROZENSET", at);
          build_from(type, mark, at);
          break;
        }
        case 'd': {  // DICT
          const std::size_t mark = pop_mark("DICT", at);
          if ((stack_.size() - mark) % 2 != 0) fail("malformed pickle: DICT with an odd number of items", at);
          for (std::size_t i = mark; i < stack_.size(); i += 2) check_key(stack_[i], at);
          build_from(PickleValue::Type::Dict, mark, at);
          break;
        }
        case 0x85:  // TUPLE1
        case 0x86:  // TUPLE2
        case 0x87: {  // TUPLE3
          const std::size_t n = op - 0x84u;
          if (stack_.size() < n) underflow(pickle_opcode_name(op).c_str(), at);
          build_from(PickleValue::Type::Tuple, stack_.size() - n, at);
          break;
        }
        case 0x97:    // NEXT_BUFFER
        case 0x98:    // READONLY_BUFFER
          fail("refused: opcode " + pickle_opcode_name(op) +
                   " is one of pickle protocol 5's out-of-band buffers (data passed beside the pickle, "
                   "not in it); a memory snapshot holds none",
               at);
        default:
          if (is_code_or_object_opcode(op)) {
            fail("refused: the pickle uses " + pickle_opcode_name(op) +
                     ", which imports, calls or builds Python objects; a memory snapshot holds only "
                     "plain data (dict, list, tuple, str, int, float, bool, None)",
                 at);
          }
          fail("refused: opcode " + pickle_opcode_name(op) +
                   " is not allowed in a memory snapshot (only dict, list, tuple, set, str, bytes, int, float, "
                   "bool and None, protocols 2-5)",
               at);
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& message, std::uint64_t offset) {
    throw PickleError(message + " (byte offset " + std::to_string(offset) + ")", offset);
  }
  [[noreturn]] void underflow(const char* op, std::size_t at) {
    fail(std::string("malformed pickle: ") + op + " with too few values on the stack", at);
  }

  static bool is_code_or_object_opcode(unsigned char op) {
    switch (op) {
      case 'c': case 0x93: case 'R': case 'b': case 'i': case 'o': case 0x81: case 0x92:
      case 'P': case 'Q': case 0x82: case 0x83: case 0x84:
        return true;
      default:
        return false;
    }
  }

  std::uint64_t remaining() const { return b_.size() - pos_; }

  void need(std::uint64_t n, std::size_t at) {
    if (n > remaining()) {
      fail("truncated pickle: " + pickle_opcode_name(static_cast<unsigned char>(b_[at])) + " needs " +
               std::to_string(n) + " more bytes but only " + std::to_string(remaining()) + " remain",
           at);
    }
  }

  unsigned u8(std::size_t at) {
    need(1, at);
    return static_cast<unsigned char>(b_[pos_++]);
  }

  std::uint64_t uint_le(int n, std::size_t at) {
    need(static_cast<std::uint64_t>(n), at);
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b_[pos_ + i]);
    pos_ += static_cast<std::size_t>(n);
    return v;
  }

  static PickleValue make_bool(bool v) {
    PickleValue x;
    x.type = PickleValue::Type::Bool;
    x.boolean = v;
    return x;
  }
  static PickleValue make_int(bool negative, std::uint64_t magnitude) {
    PickleValue x;
    x.type = PickleValue::Type::Int;
    x.negative = negative && magnitude != 0;
    x.magnitude = magnitude;
    return x;
  }

  PickleValue read_long1(std::size_t at) {
    const unsigned n = u8(at);
    if (n > 9) {
      fail("LONG1 integer of " + std::to_string(n) + " bytes is out of range (at most 9 bytes are read)", at);
    }
    need(n, at);
    if (n == 0) return make_int(false, 0);
    unsigned char bytes[9] = {};
    std::memcpy(bytes, b_.data() + pos_, n);
    pos_ += n;
    const bool negative = (bytes[n - 1] & 0x80) != 0;
    if (negative) {  // magnitude = two's complement negation
      unsigned carry = 1;
      for (unsigned i = 0; i < n; ++i) {
        const unsigned t = (0xFFu ^ bytes[i]) + carry;
        bytes[i] = static_cast<unsigned char>(t & 0xFF);
        carry = t >> 8;
      }
    }
    if (n == 9 && bytes[8] != 0) fail("LONG1 integer does not fit in 64 bits", at);
    std::uint64_t m = 0;
    for (int i = static_cast<int>(std::min(n, 8u)) - 1; i >= 0; --i) m = (m << 8) | bytes[i];
    return make_int(negative, m);
  }

  // A str or bytes of `n` bytes at the current position: a view into the input.
  PickleValue read_text(PickleValue::Type type, std::uint64_t n, std::size_t at) {
    if (n > remaining()) {
      fail(std::string(type == PickleValue::Type::Str ? "string" : "bytes") + " length field claims " +
               std::to_string(n) + " bytes but only " + std::to_string(remaining()) +
               " remain in the file (truncated or corrupt)",
           at);
    }
    if (n > UINT32_MAX) {  // (only a file over 4 GiB gets here)
      fail("a " + std::string(pickle_type_name(type)) + " of " + std::to_string(n) +
               " bytes is longer than a memory snapshot's values can be (4 GiB)",
           at);
    }
    PickleValue v;
    v.type = type;
    v.length = static_cast<std::uint32_t>(n);
    v.chars = b_.data() + pos_;
    pos_ += static_cast<std::size_t>(n);
    return v;
  }

  void count_value(std::size_t at) {
    if (++values_ > limits_.max_values) {
      fail("the pickle holds more than " + std::to_string(limits_.max_values) + " values", at);
    }
  }

  void push_value(const PickleValue& v, std::size_t at) {
    if (stack_.size() >= limits_.max_stack) {
      fail("more than " + std::to_string(limits_.max_stack) + " values on the unpickling stack", at);
    }
    stack_.push_back(v);
  }

  void push(const PickleValue& v, std::size_t at) {
    count_value(at);
    push_value(v, at);
  }

  PickleValue new_container(PickleValue::Type type, std::size_t at) {
    count_value(at);
    PickleValue v;
    v.type = type;
    v.items = &arena_->new_container();
    return v;
  }

  void push_container(PickleValue::Type type, std::size_t at) { push_value(new_container(type, at), at); }

  std::size_t pop_mark(const char* op, std::size_t at) {
    if (marks_.empty()) fail(std::string("malformed pickle: ") + op + " without a MARK", at);
    const std::size_t m = marks_.back();
    marks_.pop_back();
    if (m > stack_.size()) fail(std::string("malformed pickle: ") + op + " with a stale MARK", at);
    return m;
  }

  // The container a mutating opcode adds to: it must be of the right type and not frozen.
  PickleContainer& add_to(const PickleValue& target, PickleValue::Type type, const char* op, std::size_t at) {
    if (target.type != type) {
      fail(std::string("malformed pickle: ") + op + " on a " + std::string(pickle_type_name(target.type)) +
               " (expected a " + std::string(pickle_type_name(type)) + ")",
           at);
    }
    if (target.items->frozen) {
      fail(std::string("refused: ") + op +
               " adds to a container already referenced from the memo (a recursive structure)",
           at);
    }
    return *target.items;
  }

  void note_child(PickleContainer& parent, const PickleValue& child, std::size_t at) {
    if (!child.is_container()) return;
    const std::uint32_t d = child.items->depth + 1;
    if (d > limits_.max_depth) {
      fail("containers nested deeper than " + std::to_string(limits_.max_depth) + " levels", at);
    }
    if (d > parent.depth) parent.depth = d;
  }

  void check_key(const PickleValue& k, std::size_t at) {
    switch (k.type) {
      case PickleValue::Type::List:
      case PickleValue::Type::Dict:
        fail("malformed pickle: a " + std::string(pickle_type_name(k.type)) + " used as a dict key", at);
      default:
        break;
    }
  }

  // Adds `n` values to `c`: in place while its block has room, else into a block twice as large
  // (the first batch gets a block of exactly its size: most containers have one batch).
  void append(PickleContainer& c, const PickleValue* v, std::size_t n) {
    if (n == 0) return;
    if (c.size + n > UINT32_MAX) fail("a container with more than 2^32 values", pos_);
    if (c.size + n > c.capacity) {
      const std::size_t capacity = c.size == 0 ? n : std::max<std::size_t>(c.size + n, 2 * std::size_t{c.capacity});
      const std::size_t room = std::min<std::size_t>(capacity, UINT32_MAX);
      PickleValue* block = arena_->take(room);
      if (c.size > 0) std::memcpy(static_cast<void*>(block), c.values, c.size * sizeof(PickleValue));
      c.values = block;
      c.capacity = static_cast<std::uint32_t>(room);
    }
    std::memcpy(static_cast<void*>(c.values + c.size), v, n * sizeof(PickleValue));
    c.size += static_cast<std::uint32_t>(n);
  }

  // Moves the stack's values from `mark` on into `c`.
  void append_items(PickleContainer& c, std::size_t mark, std::size_t at) {
    for (std::size_t i = mark; i < stack_.size(); ++i) note_child(c, stack_[i], at);
    append(c, stack_.data() + mark, stack_.size() - mark);
    stack_.resize(mark);
  }

  void build_from(PickleValue::Type type, std::size_t from, std::size_t at) {
    const PickleValue v = new_container(type, at);
    append_items(*v.items, from, at);
    push_value(v, at);
  }

  // Python's memo is a dict; MEMOIZE stores at len(memo). Indices 0, 1, 2, ... (what every
  // pickler writes) live in a vector; others (BINPUT/LONG_BINPUT may skip) in a map, so a huge
  // index never makes a huge table.
  void memo_put(std::uint32_t index, std::size_t at) {
    if (stack_.empty()) fail("malformed pickle: memo store with an empty stack", at);
    if (index < memo_.size()) {
      memo_[index] = stack_.back();
    } else if (index == memo_.size()) {
      memo_.push_back(stack_.back());
      sparse_memo_.erase(index);
      for (auto it = sparse_memo_.find(static_cast<std::uint32_t>(memo_.size())); it != sparse_memo_.end();
           it = sparse_memo_.find(static_cast<std::uint32_t>(memo_.size()))) {
        memo_.push_back(it->second);  // the next indices were stored out of order: now dense
        sparse_memo_.erase(it);
      }
    } else {
      sparse_memo_[index] = stack_.back();
    }
  }
  std::uint32_t memo_len() const { return static_cast<std::uint32_t>(memo_.size() + sparse_memo_.size()); }

  void memo_get(std::uint32_t index, std::size_t at) {
    const PickleValue* v = nullptr;
    if (index < memo_.size()) {
      v = &memo_[index];
    } else if (auto it = sparse_memo_.find(index); it != sparse_memo_.end()) {
      v = &it->second;
    }
    if (v == nullptr) fail("malformed pickle: memo entry " + std::to_string(index) + " was never stored", at);
    if (v->is_container()) v->items->frozen = true;
    push_value(*v, at);
  }

  std::string_view b_;
  const PickleLimits& limits_;
  std::unique_ptr<PickleArena> arena_;
  std::size_t pos_ = 0;
  int protocol_ = 0;
  std::uint64_t values_ = 0;
  std::vector<PickleValue> stack_;
  std::vector<std::size_t> marks_;
  std::vector<PickleValue> memo_;  // indices 0, 1, 2, ... as MEMOIZE and a normal pickler use them
  absl::flat_hash_map<std::uint32_t, PickleValue> sparse_memo_;
};

}  // namespace

bool PickleValue::to_int64(std::int64_t* out) const noexcept {
  if (type != Type::Int) return false;
  if (!negative) {
    if (magnitude > static_cast<std::uint64_t>(INT64_MAX)) return false;
    *out = static_cast<std::int64_t>(magnitude);
    return true;
  }
  if (magnitude > static_cast<std::uint64_t>(INT64_MAX) + 1) return false;
  *out = static_cast<std::int64_t>(~magnitude + 1);
  return true;
}

bool PickleValue::to_uint64(std::uint64_t* out) const noexcept {
  if (type != Type::Int || negative) return false;
  *out = magnitude;
  return true;
}

PickleSpan PickleValue::list() const noexcept { return is_list_like() ? items->span() : PickleSpan(); }

PickleSpan PickleValue::set() const noexcept { return type == Type::Set ? items->span() : PickleSpan(); }

PickleDictView PickleValue::dict() const noexcept {
  if (!is_dict()) return PickleDictView(nullptr, 0);
  return PickleDictView(items->values, items->size / 2);
}

PickleValue* PickleArena::take(std::size_t n) {
  if (n > left_) {
    constexpr std::size_t kChunkValues = 1 << 16;  // 1 MiB
    const std::size_t size = std::max(n, kChunkValues);
    // Uninitialised: values are copied in (PickleValue is trivially copyable, an implicit-lifetime type).
    chunks_.emplace_back(new std::byte[size * sizeof(PickleValue)]);
    chunk_bytes_ += size * sizeof(PickleValue);
    next_ = reinterpret_cast<PickleValue*>(chunks_.back().get());
    left_ = size;
  }
  PickleValue* out = next_;
  next_ += n;
  left_ -= n;
  return out;
}

std::uint32_t PickleValue::depth() const noexcept { return is_container() ? items->depth : 0; }

const PickleValue* PickleValue::get(std::string_view key) const noexcept {
  if (!is_dict()) return nullptr;
  const PickleValue* v = items->values;
  for (std::size_t i = 0; i + 1 < items->size; i += 2) {
    const PickleValue& k = v[i];
    if (k.type == Type::Str && k.length == key.size() && std::memcmp(k.chars, key.data(), key.size()) == 0) {
      return &v[i + 1];
    }
  }
  return nullptr;
}

std::string_view pickle_type_name(PickleValue::Type type) noexcept {
  switch (type) {
    case PickleValue::Type::None: return "None";
    case PickleValue::Type::Bool: return "bool";
    case PickleValue::Type::Int: return "int";
    case PickleValue::Type::Float: return "float";
    case PickleValue::Type::Str: return "str";
    case PickleValue::Type::Bytes: return "bytes";
    case PickleValue::Type::Set: return "set";
    case PickleValue::Type::List: return "list";
    case PickleValue::Type::Tuple: return "tuple";
    case PickleValue::Type::Dict: return "dict";
  }
  return "?";
}

std::string pickle_opcode_name(unsigned char op) {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    default: return hex_byte(op);
  }
}

PickleResult parse_pickle(std::string_view bytes, const PickleLimits& limits) {
  return Parser(bytes, limits).run();
}

}  // namespace ridgescope::detail
