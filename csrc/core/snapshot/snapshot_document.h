// snapshot_document.h — what the replay of one device reads from a parsed torch memory snapshot
// (internal to the snapshot layer; snapshot_reader.cpp runs the steps): who wrote it (PyTorch,
// or ridgescope's export with its devices and metadata), the device, its device_traces entries,
// the allocator's state at the end (the segments and their live blocks), the allocator settings
// that decide block sizes, and the phase marks of its annotations.
//
// Errors: a SnapshotError naming the problem for content that is not a usable snapshot.
// Thread-safety: none; one document per replay. The PickleValue tree is only read, while the
// document is built; the tree may be released afterwards, but the file's bytes must outlive the
// document (entries, frames and blocks point into the strings of the file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "address_intervals.h"
#include "pickle_reader.h"
#include "ridgescope/cuda_rounding.h"
#include "ridgescope/event.h"
#include "ridgescope/snapshot.h"
#include "snapshot_entries.h"

namespace ridgescope::detail {

// A phase boundary or step an annotation gives.
struct PhaseMark {
  std::uint64_t trace_index = 0;  // ridgescope exports: the entry it comes before
  std::string name;
  bool begin = true;
  bool step = false;  // a step ("ridgescope.step"), not a phase
  std::uint64_t step_value = 0;
  std::uint64_t time_us = 0;
};

class SnapshotDocument {
 public:
  // Reads the device options.device_index (default 0) of `root` (a pickle of `file_bytes`).
  SnapshotDocument(const PickleValue& root, std::uint64_t file_bytes, const SnapshotReadOptions& options);
  SnapshotDocument(const SnapshotDocument&) = delete;
  SnapshotDocument& operator=(const SnapshotDocument&) = delete;

  // The block a request of `requested` bytes gets, rounded (CPU: the request itself).
  std::uint64_t rounded_block_bytes(std::uint64_t requested) const {
    return cpu ? requested : cuda_round_size(requested, rules);
  }

  bool ours = false;  // ridgescope's export (categories, phases and steps recorded)
  bool cpu = false;   // the device replayed is the CPU (ridgescope's export of a CPU trace)
  std::vector<std::pair<std::string, std::string>> metadata;  // ridgescope exports: the run's
  std::size_t device_index = 0;
  Device device;
  std::vector<SnapshotEntry> entries;  // device_traces[device_index]
  bool has_segments = false;           // the snapshot has 'segments' (its end state)
  std::vector<SnapshotBlock> end_blocks;  // blocks live at the end
  std::vector<std::pair<std::uint64_t, std::uint64_t>> end_segments;  // (address, bytes) at the end
  AddressIntervals end_mapped;  // expandable ranges mapped at the end
  CudaRoundingRules rules;                            // allocator_settings
  std::string alloc_conf;                             // its PYTORCH_CUDA_ALLOC_CONF
  std::vector<PhaseMark> marks;        // ridgescope exports: phases and steps, by trace index
  std::vector<PhaseMark> torch_marks;  // PyTorch's: record_function phases, by time

 private:
  void read_producer();
  void set_device(const SnapshotReadOptions& options);
  void read_end_segments(const PickleValue& segments);
  void read_allocator_settings();
  void read_torch_annotations();
  void read_annotations();

  const PickleValue* root_;  // while the constructor reads it
  VisitBudget budget_;
  std::vector<std::string> device_names_;
  FramesCache frames_;  // every frames list read, once (entries and blocks point into it)
  SnapshotExtras extras_;  // what entries carry beyond torch's fields (entries point into it)
};

}  // namespace ridgescope::detail
