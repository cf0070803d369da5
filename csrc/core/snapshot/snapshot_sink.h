// snapshot_sink.h — where the snapshot reader's events go (internal to the core). A ridgescope
// export's events are written straight to the trace. A snapshot PyTorch wrote holds no
// categories: its events are buffered and fed to SnapshotInference (snapshot_inference.h) as
// they come, and written once the inference has seen them all, each allocation followed by the
// category it decided (a strong tag, flagged inferred unless the snapshot named it) and a
// label naming where the block was made and the deciding rule ("activation in train.py:42 in main
// > model.py:88 in forward [activation]").
//
// Thread-safety: none; one sink per replay.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ridgescope/event.h"
#include "ridgescope/recorder.h"
#include "ridgescope/report.h"
#include "snapshot_inference.h"

namespace ridgescope::detail {

class SnapshotSink {
 public:
  // `inference`: null for a ridgescope export (events go straight to `rec`).
  SnapshotSink(Recorder& rec, std::unique_ptr<SnapshotInference> inference);

  bool inferring() const { return inference_ != nullptr; }

  // Any event. `frames`: a free's stack; `after_trace`: a free only the snapshot's end state shows.
  void record(const Event& e, const SnapshotFrames* frames = nullptr, bool after_trace = false);
  // An allocation, with the text of its module string (where it was made).
  void alloc(const Event& e, std::string_view where);
  // The block of the allocation just recorded, for the inference: its allocation stack (null:
  // none), whether it existed before the first entry, and a category the snapshot names.
  void block(const SnapshotFrames* frames, bool before_trace, std::optional<Category> recorded);
  // A phase boundary (the event carries the name's string id).
  void phase(const Event& e, bool begin, std::string_view name);

  // Decides every block and writes the buffered events with their tags (inferring only).
  void flush();

  // What was recorded so far.
  std::uint64_t peak_bytes() const { return peak_; }
  const absl::flat_hash_map<std::uint64_t, std::uint64_t>& segments() const { return segments_; }
  std::uint64_t decided_by_frames() const { return by_frames_; }
  std::uint64_t decided_by_snapshot() const { return by_snapshot_; }
  std::vector<SnapshotReason> reasons() const;

 private:
  static constexpr std::uint32_t kNoBlock = UINT32_MAX;
  Recorder& rec_;
  std::unique_ptr<SnapshotInference> inference_;
  std::vector<Event> buffer_;
  std::vector<std::uint32_t> block_of_event_;  // per buffered event: the inference's block, or kNoBlock
  absl::flat_hash_map<std::uint32_t, std::string> where_;  // module string id -> its text
  std::size_t last_alloc_ = 0;                 // buffer index of the last allocation
  std::uint64_t live_ = 0, peak_ = 0;          // live bytes as recorded
  absl::flat_hash_map<std::uint64_t, std::uint64_t> segments_;  // reserved as recorded: addr -> bytes
  std::uint64_t by_frames_ = 0, by_snapshot_ = 0;
};

}  // namespace ridgescope::detail
