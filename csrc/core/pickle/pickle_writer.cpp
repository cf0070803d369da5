// pickle_writer.cpp — see pickle_writer.h.
#include "pickle_writer.h"

#include <cstring>
#include <stdexcept>

namespace ridgescope::detail {
namespace {

void put_u16(std::string& out, std::uint16_t v) {
  out.push_back(static_cast<char>(v & 0xFF));
  out.push_back(static_cast<char>(v >> 8));
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// LONG1: little-endian two's complement in the fewest bytes that keep the sign.
void put_long1(std::string& out, bool negative, std::uint64_t magnitude) {
  unsigned char bytes[9];
  // Two's complement of the value in 72 bits.
  std::uint64_t low = negative ? ~magnitude + 1 : magnitude;
  const unsigned char high = negative ? (magnitude == 0 ? 0x00 : 0xFF) : 0x00;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>((low >> (8 * i)) & 0xFF);
  bytes[8] = high;
  int n = 9;
  // Drop redundant sign bytes: a top byte equal to the sign fill whose next byte has the same
  // sign bit.
  while (n > 1) {
    const unsigned char top = bytes[n - 1];
    const bool next_negative = (bytes[n - 2] & 0x80) != 0;
    if ((top == 0x00 && !next_negative) || (top == 0xFF && next_negative)) {
      --n;
    } else {
      break;
    }
  }
  out.push_back(pickle_op::kLong1);
  out.push_back(static_cast<char>(n));
  out.append(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(n));
}

}  // namespace

PickleWriter::PickleWriter(bool memoize_strings) : memoize_strings_(memoize_strings) {
  out_.push_back(pickle_op::kProto);
  out_.push_back(static_cast<char>(kProtocol));
}

void PickleWriter::before_item() {
  if (finished_) throw std::logic_error("pickle writer: value after finish()");
  if (open_.empty()) {
    if (wrote_root_) throw std::logic_error("pickle writer: more than one root value");
    return;
  }
  Open& o = open_.back();
  if (o.kind != Kind::Tuple && o.batch_items == 0) out_.push_back(pickle_op::kMark);
}

void PickleWriter::after_item() {
  if (open_.empty()) {
    wrote_root_ = true;
    return;
  }
  Open& o = open_.back();
  ++o.items;
  if (o.kind == Kind::Tuple) return;
  ++o.batch_items;
  const std::size_t full = o.kind == Kind::Dict ? 2 * kBatch : kBatch;
  if (o.batch_items == full) flush_batch(o);
}

void PickleWriter::flush_batch(Open& o) {
  if (o.batch_items == 0) return;
  out_.push_back(o.kind == Kind::Dict ? pickle_op::kSetItems : pickle_op::kAppends);
  o.batch_items = 0;
}

PickleWriter& PickleWriter::none() {
  before_item();
  out_.push_back(pickle_op::kNone);
  after_item();
  return *this;
}

PickleWriter& PickleWriter::boolean(bool v) {
  before_item();
  out_.push_back(v ? pickle_op::kNewTrue : pickle_op::kNewFalse);
  after_item();
  return *this;
}

PickleWriter& PickleWriter::integer(std::int64_t v) {
  before_item();
  if (v >= 0 && v <= 0xFF) {
    out_.push_back(pickle_op::kBinInt1);
    out_.push_back(static_cast<char>(v));
  } else if (v >= 0 && v <= 0xFFFF) {
    out_.push_back(pickle_op::kBinInt2);
    put_u16(out_, static_cast<std::uint16_t>(v));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_.push_back(pickle_op::kBinInt);
    put_u32(out_, static_cast<std::uint32_t>(static_cast<std::int32_t>(v)));
  } else if (v < 0) {
    put_long1(out_, true, ~static_cast<std::uint64_t>(v) + 1);
  } else {
    put_long1(out_, false, static_cast<std::uint64_t>(v));
  }
  after_item();
  return *this;
}

PickleWriter& PickleWriter::unsigned_integer(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(v));
  before_item();
  put_long1(out_, false, v);
  after_item();
  return *this;
}

PickleWriter& PickleWriter::real(double v) {
  before_item();
  out_.push_back(pickle_op::kBinFloat);
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));  // big-endian
  after_item();
  return *this;
}

PickleWriter& PickleWriter::str(std::string_view v) {
  if (v.size() > 0xFFFFFFFFu) throw std::length_error("pickle writer: string over 4 GiB");
  before_item();
  if (memoize_strings_ && v.size() <= kMaxMemoString) {
    if (auto it = memo_.find(absl::string_view(v.data(), v.size())); it != memo_.end()) {
      if (it->second < 256) {
        out_.push_back(pickle_op::kBinGet);
        out_.push_back(static_cast<char>(it->second));
      } else {
        out_.push_back(pickle_op::kLongBinGet);
        put_u32(out_, it->second);
      }
      after_item();
      return *this;
    }
  }
  if (v.size() < 256) {
    out_.push_back(pickle_op::kShortBinUnicode);
    out_.push_back(static_cast<char>(v.size()));
  } else {
    out_.push_back(pickle_op::kBinUnicode);
    put_u32(out_, static_cast<std::uint32_t>(v.size()));
  }
  out_.append(v.data(), v.size());
  if (memoize_strings_ && v.size() <= kMaxMemoString && memo_.size() < kMaxMemoStrings) {
    out_.push_back(pickle_op::kMemoize);
    memo_.emplace(std::string(v), static_cast<std::uint32_t>(memo_.size()));
  }
  after_item();
  return *this;
}

PickleWriter& PickleWriter::begin_dict() {
  before_item();
  out_.push_back(pickle_op::kEmptyDict);
  open_.push_back(Open{Kind::Dict});
  return *this;
}

PickleWriter& PickleWriter::begin_list() {
  before_item();
  out_.push_back(pickle_op::kEmptyList);
  open_.push_back(Open{Kind::List});
  return *this;
}

PickleWriter& PickleWriter::begin_tuple() {
  before_item();
  open_.push_back(Open{Kind::Tuple});
  return *this;
}

PickleWriter& PickleWriter::end_dict() {
  if (open_.empty() || open_.back().kind != Kind::Dict) throw std::logic_error("pickle writer: end_dict without a dict");
  if (open_.back().items % 2 != 0) throw std::logic_error("pickle writer: dict key without a value");
  flush_batch(open_.back());
  open_.pop_back();
  after_item();
  return *this;
}

PickleWriter& PickleWriter::end_list() {
  if (open_.empty() || open_.back().kind != Kind::List) throw std::logic_error("pickle writer: end_list without a list");
  flush_batch(open_.back());
  open_.pop_back();
  after_item();
  return *this;
}

PickleWriter& PickleWriter::end_tuple() {
  if (open_.empty() || open_.back().kind != Kind::Tuple) throw std::logic_error("pickle writer: end_tuple without a tuple");
  const std::size_t n = open_.back().items;
  open_.pop_back();
  // The items are on the stack already; TUPLE1-3 take them without a MARK. Larger tuples need
  // a MARK before their first item, so they are only supported up to 3 items.
  switch (n) {
    case 0: out_.push_back(pickle_op::kEmptyTuple); break;
    case 1: out_.push_back(pickle_op::kTuple1); break;
    case 2: out_.push_back(pickle_op::kTuple2); break;
    case 3: out_.push_back(pickle_op::kTuple3); break;
    default: throw std::logic_error("pickle writer: tuples hold at most 3 items");
  }
  after_item();
  return *this;
}

void PickleWriter::finish() {
  if (!open_.empty()) throw std::logic_error("pickle writer: finish() with an open container");
  if (!wrote_root_) throw std::logic_error("pickle writer: finish() without a value");
  if (finished_) return;
  out_.push_back(pickle_op::kStop);
  finished_ = true;
}

std::string PickleWriter::take() {
  std::string result;
  result.swap(out_);
  return result;
}

}  // namespace ridgescope::detail
