// snapshot_start_state.h — the allocator's state before a snapshot's first trace entry
// (internal to the snapshot layer): torch's trace usually begins after the run did, so blocks
// and segments freed by the trace without being made in it, and those the end state holds that
// the trace never touched, were live from the start. Also the exact size of each block still
// live at the end.
//
// Thread-safety: pure function of the document.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "snapshot_document.h"
#include "snapshot_entries.h"

namespace ridgescope::detail {

struct SnapshotStartState {
  std::vector<SnapshotBlock> blocks;                              // live before the first entry
  std::vector<std::pair<std::uint64_t, std::uint64_t>> segments;  // reserved then: (address, bytes)
  absl::flat_hash_set<std::uint64_t> expandable_starts;  // of those, the mapped ranges of expandable segments
  absl::flat_hash_map<std::size_t, std::uint64_t> exact_bytes;  // alloc entry index -> bytes of its block,
                                                                // live at the end (the segments say)
};

// Walks the document's entries once forwards (what they free without making) and once backwards
// (what expandable segments had mapped), against its end state.
SnapshotStartState prescan_start_state(const SnapshotDocument& doc);

}  // namespace ridgescope::detail
