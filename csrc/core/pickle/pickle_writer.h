// pickle_writer.h — a Python pickle encoder for plain data (internal to the core).
//
// Writes protocol 4 pickles made only of dict, list, tuple, str, int, float, bool and None,
// with exactly the opcodes the memory_viz web page's unpickler (torch/utils/viz/MemoryViz.js)
// understands: PROTO, EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS, APPENDS, EMPTY_TUPLE,
// TUPLE1-3 (tuples hold at most 3 items), BININT1, BININT2, BININT, LONG1, BINFLOAT,
// SHORT_BINUNICODE, BINUNICODE, NEWTRUE, NEWFALSE, NONE and STOP; with memoize_strings also
// MEMOIZE, BINGET and LONG_BINGET (a repeated string is written once). No FRAME, no bytes,
// sets, classes or 8-byte lengths. Containers are written incrementally (begin/end), so a caller can stream a large
// snapshot: take() hands over what has been encoded so far.
//
// Items of a dict or list are grouped into batches of at most kBatch under one MARK, as
// Python's pickler does (the JS unpickler spreads a batch into a call's arguments).
//
// Thread-safety: none; one writer per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace ridgescope::detail {

namespace pickle_op {
inline constexpr char kProto = '\x80';
inline constexpr char kStop = '.';
inline constexpr char kMark = '(';
inline constexpr char kEmptyDict = '}';
inline constexpr char kEmptyList = ']';
inline constexpr char kEmptyTuple = ')';
inline constexpr char kSetItems = 'u';
inline constexpr char kAppends = 'e';
inline constexpr char kTuple = 't';
inline constexpr char kTuple1 = '\x85';
inline constexpr char kTuple2 = '\x86';
inline constexpr char kTuple3 = '\x87';
inline constexpr char kBinInt1 = 'K';
inline constexpr char kBinInt2 = 'M';
inline constexpr char kBinInt = 'J';
inline constexpr char kLong1 = '\x8a';
inline constexpr char kBinFloat = 'G';
inline constexpr char kShortBinUnicode = '\x8c';
inline constexpr char kBinUnicode = 'X';
inline constexpr char kNewTrue = '\x88';
inline constexpr char kNewFalse = '\x89';
inline constexpr char kNone = 'N';
inline constexpr char kMemoize = '\x94';
inline constexpr char kBinGet = 'h';
inline constexpr char kLongBinGet = 'j';
}  // namespace pickle_op

class PickleWriter {
 public:
  static constexpr std::size_t kBatch = 1000;
  static constexpr int kProtocol = 4;

  // Writes PROTO 4. With memoize_strings, strings of at most kMaxMemoString bytes are memoized
  // when first written (MEMOIZE) and fetched from the memo afterwards (BINGET, LONG_BINGET),
  // as Python's pickler does; at most kMaxMemoStrings of them.
  explicit PickleWriter(bool memoize_strings = false);
  static constexpr std::size_t kMaxMemoString = 256;
  static constexpr std::size_t kMaxMemoStrings = 1u << 20;

  // Scalars (also usable as dict keys).
  PickleWriter& none();
  PickleWriter& boolean(bool v);
  PickleWriter& integer(std::int64_t v);
  PickleWriter& unsigned_integer(std::uint64_t v);
  PickleWriter& real(double v);
  PickleWriter& str(std::string_view v);  // UTF-8 bytes, written as they are

  // Containers. A dict takes key, value, key, value, ...; end_dict() checks the pairing.
  PickleWriter& begin_dict();
  PickleWriter& end_dict();
  PickleWriter& begin_list();
  PickleWriter& end_list();
  PickleWriter& begin_tuple();
  PickleWriter& end_tuple();

  // Dict helpers.
  PickleWriter& key(std::string_view k) { return str(k); }

  // Writes STOP; every container must be closed. Throws std::logic_error otherwise.
  void finish();

  // The bytes encoded so far, handed over (the writer keeps going from an empty buffer).
  std::string take();
  std::size_t buffered_bytes() const noexcept { return out_.size(); }

 private:
  enum class Kind : std::uint8_t { Dict, List, Tuple };
  struct Open {
    Kind kind;
    std::size_t items = 0;        // items (dict: keys and values) written into the container
    std::size_t batch_items = 0;  // items since the current MARK
  };
  void before_item();
  void after_item();
  void flush_batch(Open& o);

  std::string out_;
  std::vector<Open> open_;
  bool finished_ = false;
  bool wrote_root_ = false;
  bool memoize_strings_ = false;
  absl::flat_hash_map<std::string, std::uint32_t> memo_;
};

}  // namespace ridgescope::detail
