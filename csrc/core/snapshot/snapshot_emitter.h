// snapshot_emitter.h — the events of one device's replay of a torch memory snapshot (internal to
// the snapshot layer; snapshot_reader.cpp runs it): the state before the first entry, every
// entry as allocations, frees, segments, OOMs and tags, the phases and steps (SnapshotPhases),
// and, where the trace ends elsewhere than the snapshot's segments, the end state. For PyTorch's
// CUDA snapshots the block sizes come from a model of the segments (snapshot_cuda_blocks.cpp).
// Events go to a SnapshotSink (for PyTorch's snapshots, through the category inference).
//
// Thread-safety: none; one emitter per replay.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ridgescope/cuda_trace.h"
#include "ridgescope/event.h"
#include "ridgescope/recorder.h"
#include "ridgescope/report.h"
#include "snapshot_document.h"
#include "snapshot_entries.h"
#include "snapshot_inference.h"
#include "snapshot_phases.h"
#include "snapshot_sink.h"
#include "snapshot_stacks.h"
#include "snapshot_start_state.h"

namespace ridgescope::detail {

class SnapshotEmitter {
 public:
  // `inference`: null for a ridgescope export. `doc` and `start` must outlive the emitter.
  SnapshotEmitter(const SnapshotDocument& doc, const SnapshotStartState& start, Recorder& rec,
                  std::unique_ptr<SnapshotInference> inference);

  // Emits the whole replay into the recorder (the sink flushed at the end).
  void run();
  // What was read and inferred, with the notes that qualify it (after run(); protocol unset).
  SnapshotImport import_info() const;
  // The highest live bytes of the replay (the analysis's peak of this device).
  std::uint64_t peak_bytes() const { return sink_.peak_bytes(); }

  // For SnapshotPhases: the trace time of a snapshot time (never going backwards), a phase
  // boundary and a step.
  std::uint64_t time_ns(std::uint64_t time_us);
  void phase(bool begin, std::string_view name, std::uint64_t t_ns);
  void step(std::uint64_t n, std::uint64_t t_ns);

 private:
  Event make(EventKind kind, std::uint64_t t_ns) const;
  // PyTorch's snapshots: remembers each allocation's frames, and lets a free's own frames (the
  // stack torch records at the free, context="all") end a phase inferred from frames.
  void note_frames(const SnapshotEntry& e, std::uint64_t t_ns);
  void record(const Event& e, const SnapshotFrames* frames = nullptr, bool after_trace = false);
  // A SegmentAlloc or SegmentFree of [addr, addr + bytes) at t_ns, on no stream.
  void segment(EventKind kind, std::uint64_t addr, std::uint64_t bytes, std::uint64_t t_ns);
  // The category of a block alloc() just recorded. A ridgescope export names it, or says it was
  // inferred from lifetimes (the analysis infers it again from the same phases). For a snapshot
  // PyTorch wrote the inference decides it with hindsight (flush()), from a category the entry
  // names (memory_viz's), the allocation `frames` (null: none recorded) and lifetimes.
  void tag_block(std::uint64_t addr, std::uint64_t t_ns, std::optional<std::string_view> category,
                 const SnapshotFrames* frames, std::string_view label, std::optional<bool> inferred,
                 bool before_trace);
  // An allocation; `frames`: where it was made (null or empty: not recorded), which becomes the
  // event's stack (snapshot_stacks.h).
  void alloc(std::uint64_t addr, std::uint64_t bytes, std::uint64_t requested, std::uint64_t stream,
             std::uint64_t t_ns, std::string_view module, const SnapshotFrames* frames);
  // Where a block was made, for its label and module: its allocation frames (none when the only
  // frames known are the free entry's).
  const std::string& where(const SnapshotFrames& frames, bool frames_from_free = false);
  // The blocks and segments live before the first entry, at time 0 (not modelled: as recorded).
  void emit_start_state();
  // The entry `index` at t_ns, not modelled (a ridgescope export, a CPU trace, an annotation).
  void emit_entry(const SnapshotEntry& e, std::size_t index, std::uint64_t t_ns);
  // The segments are the allocator's state when the snapshot was taken. Where the replay ends
  // elsewhere (history recording stopped before the snapshot, so frees or allocations after it
  // are missing), it is brought to that state at the end: blocks the segments no longer hold
  // are freed, blocks the trace never made are allocated, and reserved memory becomes the
  // segments'. So at the end live bytes are always the sum of the segments' allocated_size and
  // reserved bytes the sum of their total_size.
  void end_state();

  // --- snapshot_cuda_blocks.cpp: PyTorch's CUDA snapshots, block sizes from the segments -----
  CudaTraceEntry cuda_entry(const SnapshotEntry& e) const;
  // The entry `index` (at t) through the segment model. A legacy "free" is replayed as
  // free_requested then free_completed. A block live at the end takes the segments' exact size,
  // which holds even where the replay began from a guessed start state.
  void translate(const SnapshotEntry& e, std::size_t index, std::uint64_t t);
  // A segment or free event from the translator, at time t.
  void record_translated(Event ev, std::uint64_t t, const SnapshotFrames* frames = nullptr);
  // The segments and blocks that existed before the first entry, adopted by the translator
  // (segments in address order, each followed by its blocks); blocks in no known segment are
  // plain allocations with the rounded size.
  void adopt_start_state();

  const SnapshotDocument& doc_;
  const SnapshotStartState& start_;
  Recorder& rec_;
  SnapshotSink sink_;  // where events go (PyTorch's snapshots: the inference)
  SnapshotPhases phases_{doc_};
  SnapshotStacks stacks_{rec_};  // each frames list as a trace stack, once
  absl::flat_hash_map<const SnapshotFrames*, std::string> where_;  // where_from_frames, per list
  absl::flat_hash_map<std::uint64_t, std::uint64_t> live_bytes_;    // addr -> bytes, as emitted
  absl::flat_hash_map<std::uint64_t, const SnapshotFrames*> alloc_frames_;  // addr -> its alloc's frames
  std::uint64_t base_us_ = 0, last_ns_ = 0;
  std::uint64_t allocations_ = 0, categorised_from_snapshot_ = 0;
  std::uint64_t ignored_entries_ = 0;
  std::set<std::string> unknown_category_names_;
  std::string end_state_note_;
  // PyTorch's CUDA snapshots: the segment model that sizes blocks (see translate()).
  const bool modelled_;
  std::unique_ptr<CudaTraceTranslator> translator_;
  std::vector<Event> scratch_;
  std::uint64_t blocks_modelled_ = 0, blocks_larger_than_rounded_ = 0;
};

}  // namespace ridgescope::detail
