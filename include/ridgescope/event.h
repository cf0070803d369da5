// ridgescope/event.h — the one event stream of a session (design.md §2).
//
// A source translates a memory mechanism (CPU allocator, CUDA caching allocator, snapshot
// replay) into Events; aggregators consume them in sequence order. Event is a plain value: a
// reader fills one per record, a writer encodes one per record.
//
// Thread-safety: plain data; no shared state.
#pragma once

#include <cstdint>
#include <string_view>

#include "ridgescope/category.h"

namespace ridgescope {

enum class EventKind : std::uint8_t {
  Alloc = 1,         // a block became live
  Free = 2,          // a block stopped being live
  SegmentAlloc = 3,  // reserved memory grew (CUDA caching allocator segment)
  SegmentFree = 4,   // reserved memory shrank
  Tag = 5,           // a live block's category and label are now known
  PhaseBegin = 6,    // a phase started (name in string_id)
  PhaseEnd = 7,      // a phase ended (name in string_id)
  Step = 8,          // training step number `value` completed
  Oom = 9,           // a request that failed
  Sample = 10,       // a periodic or boundary reading (name in string_id, reading in value)
  String = 11,       // defines string `string_id` (text carried alongside)
  Metadata = 12,     // a key (string_id) and a JSON text describing the run
  // Format version 3 (trace_format::kFirstExternalVersion; ridgescope/external_alloc.h): device
  // memory allocated outside PyTorch's allocator (CUDA context aside), as CUPTI sees it.
  ExternalAlloc = 13,  // a non-PyTorch allocation became live (library in string_id, API in flags)
  ExternalFree = 14,   // it was freed (bytes repeats its size; API in flags)
  // Format version 4 (trace_format::kFirstFlightVersion; ridgescope/flight_records.h): the
  // bounded flight recorder. Kind 15 is timed; 66-72 are untimed.
  Mark = 15,         // rs.mark(name): a moment the user named (name in string_id, thread)
  // Format version 2 (ridgescope/stack.h): untimed definitions of the frame and stack tables,
  // delivered by a reader after it absorbed them (string_id is the id defined).
  Frame = 64,        // defines frame `string_id` (TraceReader::frame)
  Stack = 65,        // defines stack `string_id` (TraceReader::stack)
  TimeBase = 66,           // the time chain restarts at `value` (absorbed by readers, never
                           // delivered: a chunk of a kept window begins with one)
  StepSummary = 67,        // one step of one device, summarised (TraceReader::summary)
  Checkpoint = 68,         // a kept window starts: the state of the ledger follows (TraceReader::checkpoint)
  CheckpointSegment = 69,  // a reserved segment at the checkpoint: device, addr, bytes
  CheckpointBlock = 70,    // a live block at the checkpoint (TraceReader::checkpoint_block)
  Resolve = 71,            // the final category of the block live at device/addr at a window's end:
                           // category, flags (kTagInferred), string_id (its label)
  CheckpointExternal = 72, // an allocation outside PyTorch live at the checkpoint: the fields of
                           // its external_alloc (device, addr, bytes, API in flags, library in
                           // string_id, thread, stack_id)
};

std::string_view event_kind_name(EventKind kind) noexcept;

// A record the flight recorder's sink writes into the file itself (time bases, step summaries,
// checkpoints, resolutions: kinds 66-72), not an event the Recorder was given.
inline bool is_flight_record(std::uint8_t kind) noexcept {
  return kind >= static_cast<std::uint8_t>(EventKind::TimeBase) &&
         kind <= static_cast<std::uint8_t>(EventKind::CheckpointExternal);
}
inline bool is_flight_record(EventKind kind) noexcept { return is_flight_record(static_cast<std::uint8_t>(kind)); }

enum class DeviceType : std::uint8_t { CPU = 0, CUDA = 1 };

struct Device {
  DeviceType type = DeviceType::CPU;
  std::int16_t index = -1;  // -1 for the CPU; the CUDA ordinal otherwise

  friend bool operator==(Device a, Device b) noexcept {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator!=(Device a, Device b) noexcept { return !(a == b); }
};

// Tag flags.
inline constexpr std::uint8_t kTagWeak = 1;  // applies only if the block has no strong tag
inline constexpr std::uint8_t kTagInferred = 2;  // the category was inferred (a rule over frames or
                                                 // lifetimes, e.g. a snapshot's), not observed

// One event. Which fields are meaningful depends on kind; the rest are zero.
struct Event {
  EventKind kind = EventKind::Alloc;
  std::uint64_t seq = 0;              // position in the stream, 0-based (assigned on read)
  std::uint64_t time_ns = 0;          // nanoseconds since the session started
  Device device;                      // alloc, free, segment_*, tag, oom, sample
  std::uint64_t addr = 0;             // block or segment address (bytes, as an integer)
  std::uint64_t bytes = 0;            // block bytes as the allocator rounds them; oom: request
  std::uint64_t requested_bytes = 0;  // alloc: bytes the caller asked for
  std::uint64_t stream = 0;           // CUDA stream handle as an integer; 0 on CPU
  std::uint32_t thread = 0;           // small per-process thread number of the caller
  Category category = Category::Unknown;  // tag
  std::uint8_t flags = 0;             // tag: kTagWeak; external_*: the API (ExternalApi)
  std::uint32_t string_id = 0;        // tag: label; phase_*: name; sample/metadata: key; string,
                                      // frame, stack: the id defined; alloc: the module running
                                      // (its name), 0 if none; external_alloc: the library that
                                      // allocated (its file name)
  std::uint32_t stack_id = 0;         // alloc, external_alloc: where it was made (a stack id, ridgescope/stack.h);
                                      // 0 when the source recorded none
  std::uint64_t value = 0;            // step: step number; oom: device free bytes; sample: reading
  std::string_view text;              // string, metadata: the text (valid until the next read)
};

}  // namespace ridgescope
