// ridgescope/flight_records.h — the records of the bounded flight recorder (trace format 4,
// docs/trace_format.md "The flight recorder", docs/long-runs.md).
//
// A long run keeps a summary of every step (StepSummary) and the full events of a few windows
// of steps only. Each kept window begins with a Checkpoint: the state of every device's ledger
// at that instant (its segments and live blocks, with what the analysis needs to categorise each
// block exactly as a full trace would: its tags so far and the phases it was made in), so the
// window's analysis needs nothing that came before it. A Resolve record at a window's end gives
// the final category of a block still live there, which only its later life decided.
//
// These are plain values: TraceReader fills them from records (TraceReader::summary(),
// checkpoint(), checkpoint_block()); the flight writer (ridgescope/flight.h) encodes them.
// Thread-safety: plain data.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "ridgescope/category.h"
#include "ridgescope/event.h"

namespace ridgescope {

// StepSummary::flags
inline constexpr std::uint8_t kSummaryComplete = 1;  // the step ended with its `step` record
                                                     // (else the trace ended inside it)
inline constexpr std::uint8_t kSummaryGrowth = 2;    // this step completed a run of steps whose
                                                     // end bytes kept growing (retained tensors)

// The highest live bytes one phase reached in a step (the highest over its occurrences).
struct PhasePeak {
  std::uint32_t name_id = 0;      // trace string id of the phase name
  std::uint64_t peak_bytes = 0;   // bytes
};

// One step of one device. A step runs from the previous `step` record (or the first event of
// the trace) to its own `step` record. Bytes are live (allocated) bytes unless named reserved.
struct StepSummary {
  std::uint64_t step = 0;
  Device device;
  std::uint8_t flags = 0;                 // kSummary*
  std::uint64_t begin_time_ns = 0;        // nanoseconds since the session started
  std::uint64_t end_time_ns = 0;
  std::uint64_t start_bytes = 0, end_bytes = 0, peak_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;  // the highest reserved bytes in the step
  std::uint64_t allocations = 0;          // alloc events of this device in the step
  std::uint64_t ooms = 0;                 // failed requests of this device in the step
  std::uint64_t marks = 0;                // rs.mark() calls in the step
  std::uint32_t mark_id = 0;              // string id of the first mark's name (0: none)
  // Bytes live at the step's peak by category, each block in the category it had when the step
  // ended (a block freed before then: the category its lifetime decided); sums to peak_bytes.
  std::array<std::uint64_t, kCategoryCount> peak_by_category{};
  std::vector<PhasePeak> phases;          // in order of first beginning in the step
};

// A phase open at a checkpoint, outermost first.
struct CheckpointPhase {
  std::uint32_t name_id = 0;
};

// The start of a kept window.
struct Checkpoint {
  std::uint64_t step = 0;      // the step the window begins with
  std::uint64_t time_ns = 0;   // the instant of the state that follows (nanoseconds)
  bool have_forward = false;   // a forward (or recompute) phase began before the checkpoint
  std::vector<CheckpointPhase> phases;  // open phases, outermost first
};

// CheckpointBlock::lifetime bits: where the block was made, for the lifetime rules of
// docs/categories.md.
inline constexpr std::uint8_t kLifeForwardish = 1;     // inside forward or recompute
inline constexpr std::uint8_t kLifeInBackward = 2;
inline constexpr std::uint8_t kLifeInOptimizer = 4;
inline constexpr std::uint8_t kLifeInCompile = 8;
inline constexpr std::uint8_t kLifeBeforeForward = 16; // before the last forward began
inline constexpr std::uint8_t kLifeIdleNow = 32;       // outside any phase, in the idle spell
                                                       // that lasts at the checkpoint
// CheckpointBlock::tags bits
inline constexpr std::uint8_t kTagsStrong = 1;          // a strong tag was seen (first_*)
inline constexpr std::uint8_t kTagsStrongInferred = 2;  // ... and it was an inferred one
inline constexpr std::uint8_t kTagsWeak = 4;            // a weak tag was seen (weak_*)

// A block live at a checkpoint.
struct CheckpointBlock {
  Device device;
  std::uint64_t addr = 0;
  std::uint64_t bytes = 0, requested_bytes = 0;  // bytes
  std::uint64_t stream = 0;
  std::uint32_t context_id = 0;      // module running at its allocation (string id)
  std::uint32_t stack_id = 0;        // where it was made (stack id)
  std::uint32_t alloc_phase_id = 0;  // innermost phase at its allocation (string id; 0 idle)
  std::uint64_t alloc_step = 0;      // the step it was made in
  std::uint8_t lifetime = 0;         // kLife*
  // The open phase (index into Checkpoint::phases) that was innermost at its allocation, -1
  // when none (made outside any phase, or in a phase that has ended since).
  std::int32_t alloc_instance = -1;
  std::uint8_t tags = 0;             // kTags*
  Category first_strong = Category::Unknown;  // the first strong tag: what it is
  std::uint32_t first_strong_label = 0;
  Category weak = Category::Unknown;          // the first weak tag
  std::uint32_t weak_label = 0;
  Category current = Category::Unknown;       // the category the last strong tag gave (the
  std::uint32_t current_label = 0;            // ledger's; first_strong when only one)
};

}  // namespace ridgescope
