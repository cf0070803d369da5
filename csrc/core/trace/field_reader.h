// field_reader.h — reads the varint fields of one record payload, checking each field's width
// (docs/trace_format.md, "Conventions"). Internal to the trace layer (record_codec.cpp,
// flight_codec.cpp). Thread-safety: a FieldReader belongs to one decoding call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "byte_codec.h"
#include "ridgescope/event.h"

namespace ridgescope::detail {

class FieldReader {
 public:
  FieldReader(std::string_view payload) : payload_(payload) {}
  bool u64(std::uint64_t* v) { return get_varint(payload_, &pos_, v); }
  bool u32(std::uint32_t* v) {
    std::uint64_t x;
    if (!u64(&x) || x > 0xFFFFFFFFu) return false;
    *v = static_cast<std::uint32_t>(x);
    return true;
  }
  bool u8(std::uint8_t* v) {
    std::uint64_t x;
    if (!u64(&x) || x > 0xFF) return false;
    *v = static_cast<std::uint8_t>(x);
    return true;
  }
  bool device(Device* d) {
    std::uint8_t type;
    std::uint64_t index;
    if (!u8(&type) || !u64(&index) || type > 1 || index > 32768) return false;
    d->type = static_cast<DeviceType>(type);
    d->index = static_cast<std::int16_t>(static_cast<std::int64_t>(index) - 1);
    return true;
  }
  std::string_view rest() const { return payload_.substr(pos_); }

 private:
  std::string_view payload_;
  std::size_t pos_ = 0;
};

}  // namespace ridgescope::detail
