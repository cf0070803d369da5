// record_codec.h — one trace record <-> one Event (the payload layout of docs/trace_format.md).
// Internal to csrc/core. Thread-safety: the codec state is owned by one writer or one reader.
#pragma once

#include <cstdint>
#include <memory_resource>
#include <string>
#include <string_view>
#include <vector>

#include "ridgescope/event.h"
#include "ridgescope/flight_records.h"
#include "ridgescope/stack.h"
#include "ridgescope/trace_format.h"

namespace ridgescope::detail {

// Times are stored as zigzag deltas from the previous record's time in the stream.
struct CodecClock {
  std::uint64_t last_time_ns = 0;
};

// A record of varint fields, appended whole: the kind byte, the payload's length, then the
// payload. For the hot and frequent records (every timed kind; the flight recorder's checkpoint
// blocks), whose payloads are at most kMax bytes by their fields' widths (an alloc 69, a
// checkpoint block 94), so that the length is always one byte.
// The fields are collected first and written by one loop in append_record(): an allocator
// callback encodes one record between the user's kernels, which evict the encoder's code, and a
// varint loop inlined at each of an alloc's ten fields made its path several times as many
// instruction lines to fetch again (docs/performance.md, "Where the training thread's time goes:
// instruction fetches").
class RecordBuffer {
 public:
  static constexpr std::size_t kMax = 96;        // payload bytes
  static constexpr std::size_t kMaxFields = 24;  // a checkpoint block has 19, an alloc 10
  void varint(std::uint64_t v) noexcept {
    if (count_ < kMaxFields) fields_[count_++] = v;  // fixed callers: never false
  }
  void device(Device d) noexcept {
    varint(static_cast<std::uint64_t>(d.type));
    varint(static_cast<std::uint64_t>(static_cast<std::int64_t>(d.index) + 1));
  }
  // Appends the whole record to `out` in one call.
  template <class Out>
  void append_record(EventKind kind, Out& out) {
    char buf[kMax + 2 + 10];  // a field may begin at kMax - 1 and take ten bytes
    std::size_t n = 2;        // the payload starts after the kind byte and the length byte
    for (std::size_t i = 0; i < count_ && n < kMax + 2; ++i) {
      std::uint64_t v = fields_[i];
      while (v >= 0x80) {
        buf[n++] = static_cast<char>((v & 0x7F) | 0x80);
        v >>= 7;
      }
      buf[n++] = static_cast<char>(v);
    }
    buf[0] = static_cast<char>(kind);
    buf[1] = static_cast<char>(n - 2);  // payload bytes, < 0x80: a one-byte varint
    out.append(buf, n);
  }

 private:
  static_assert(kMax < 0x80, "a payload's length must be a one-byte varint");
  std::uint64_t fields_[kMaxFields];
  std::size_t count_ = 0;
};

// The fields an allocation outside PyTorch and its checkpoint record share, in their order
// (their stack id follows: optional in the one, always present in the other).
inline void put_external_fields(RecordBuffer& p, const Event& e, std::uint32_t thread) noexcept {
  p.device(e.device);
  p.varint(e.addr);
  p.varint(e.bytes);
  p.varint(e.flags);      // the API
  p.varint(e.string_id);  // the library
  p.varint(thread);
}

void encode_record(const Event& event, CodecClock& clock, std::string& out);
// The recorder's chunks: the time and the thread given apart from the event (the caller's Event
// is then passed by reference all the way, never copied on the allocator callback's path).
struct RecordStamp {
  std::uint64_t time_ns;  // nanoseconds since the session started
  std::uint32_t thread;   // the caller's small thread number
};
void encode_record(const Event& event, RecordStamp stamp, CodecClock& clock, std::pmr::string& out);

// The untimed definitions of format version 2 (docs/trace_format.md, "Frames and stacks").
void encode_frame_record(std::uint32_t id, const FrameRecord& frame, std::string& out);
void encode_stack_record(std::uint32_t id, const std::uint32_t* frames, std::size_t count,
                         std::uint32_t site, std::string& out);

// The flight recorder's records (format version 4; flight_codec.cpp). A time_base record sets
// the chain of the records after it; the others are untimed.
void encode_time_base(std::uint64_t time_ns, std::string& out);
void encode_step_summary(const StepSummary& s, std::string& out);
void encode_checkpoint(const Checkpoint& c, std::string& out);
void encode_checkpoint_segment(Device device, std::uint64_t addr, std::uint64_t bytes, std::string& out);
void encode_checkpoint_block(const CheckpointBlock& b, std::string& out);
// An external_alloc live at a checkpoint, restated with all its fields (kind CheckpointExternal).
void encode_checkpoint_external(const Event& e, std::string& out);
void encode_resolve(Device device, std::uint64_t addr, Category category, std::uint8_t flags,
                    std::uint32_t label_id, std::string& out);

enum class DecodeStatus { Ok, UnknownKind, Malformed };

// What a summary or checkpoint record holds (filled by decode_record when asked for).
struct FlightPayload {
  StepSummary summary;     // StepSummary records
  Checkpoint checkpoint;   // Checkpoint records
  CheckpointBlock block;   // CheckpointBlock records
};

// What a frame or stack record defines (filled by decode_record when asked for).
struct Definition {
  FrameRecord frame;                  // Frame records
  std::uint32_t site = 0;             // Stack records: index of the site in frames
  std::vector<std::uint32_t> frames;  // Stack records: frame ids, innermost first
};

// Record kinds 1-63 other than String (11) and Metadata (12) carry a time delta as their first
// field; kinds 64-255 carry none. Readers rely on this to skip kinds they do not know.
//
// Decodes the record at *pos of a chunk payload and advances *pos past it, as format `version`
// lays it out (version 1 has no frame or stack kinds, and no stack id in alloc records: there
// they are unknown kinds and ignored trailing bytes; before version 3 kinds 13 and 14, the
// external allocations, are unknown timed kinds). UnknownKind records (from a newer writer)
// are skipped whole (*out untouched); Malformed means the payload is inconsistent (*out then holds
// whatever was decoded before the inconsistency). A frame or stack record's
// content goes to *definition when it is not null, a summary's or checkpoint's to *flight. A
// time_base record (version 4) sets the clock and decodes as an Event of kind TimeBase.
DecodeStatus decode_record(std::string_view payload, std::size_t* pos, CodecClock& clock,
                           Event* out, std::uint32_t version = trace_format::kVersion,
                           Definition* definition = nullptr, FlightPayload* flight = nullptr);

// Whether `kind` is one of the flight recorder's untimed kinds (66-72) in format `version`.
bool is_flight_kind(std::uint8_t kind, std::uint32_t version);
// Decodes the payload of a flight record of untimed kind `kind` (66-72) into *e (and *flight).
bool decode_flight_record(std::uint8_t kind, std::string_view payload, CodecClock& clock, Event* e,
                          FlightPayload* flight);

}  // namespace ridgescope::detail
