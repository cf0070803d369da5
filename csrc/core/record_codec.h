// record_codec.h — one trace record <-> one Event (the payload layout of docs/trace_format.md).
// Internal to csrc/core. Thread-safety: the codec state is owned by one writer or one reader.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ridgescope/event.h"

namespace ridgescope::detail {

// Times are stored as zigzag deltas from the previous record's time in the stream.
struct CodecClock {
  std::uint64_t last_time_ns = 0;
};

void encode_record(const Event& event, CodecClock& clock, std::string& out);

enum class DecodeStatus { Ok, UnknownKind, Malformed };

// Record kinds 1-63 other than String (11) and Metadata (12) carry a time delta as their first
// field; kinds 64-255 carry none. Readers rely on this to skip kinds they do not know.
//
// Decodes the record at *pos of a chunk payload and advances *pos past it. UnknownKind records
// (from a newer writer) are skipped whole; Malformed means the payload is inconsistent.
DecodeStatus decode_record(std::string_view payload, std::size_t* pos, CodecClock& clock,
                           Event* out);

}  // namespace ridgescope::detail
