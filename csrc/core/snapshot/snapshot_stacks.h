// snapshot_stacks.h — a torch memory snapshot's allocation stacks as the trace's frames and
// stacks (ridgescope/stack.h), so that a snapshot's report has the same allocation sites, peak
// by stack and flame graph as a live trace (docs/sites.md, docs/snapshot.md "By stack").
// Internal to the core; used by the snapshot reader.
//
// Thread-safety: none; one per replay (it interns into that replay's Recorder).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ridgescope/recorder.h"
#include "snapshot_frames.h"

namespace ridgescope::detail {

// The site of a snapshot stack (an index into `frames`, innermost first; frames.size() for
// none): the innermost Python frame of the user's code (not library code: library_files.h),
// else the innermost autograd node (a frame ridgescope exported, or torch's C++ frame
// `torch::autograd::generated::MmBackward0::apply` of backward) or ridgescope's exported marker
// ("allocated before tracking started"), else none. ridgescope's own pseudo frame
// (file "ridgescope", line 0, written by its snapshot export) is not a frame.
std::size_t snapshot_site(const SnapshotFrames& frames);

class SnapshotStacks {
 public:
  explicit SnapshotStacks(Recorder& rec) : rec_(rec) {}

  // The trace's stack id for an allocation's frames (0: no frames). A frame is Python when its
  // file is a .py file; "<autograd>" and "<ridgescope>" frames (ridgescope's export) come back
  // as the autograd node and the marker they were, and torch's C++ frame of a node's `apply` as
  // that node ("AddmmBackward0"); every other frame is native, its C++ name shortened to the
  // function ("at::native::empty_cuda"). One conversion per frames list (the
  // snapshot reader shares equal lists).
  std::uint32_t stack_of(const SnapshotFrames& frames);

 private:
  Recorder& rec_;
  absl::flat_hash_map<const SnapshotFrames*, std::uint32_t> ids_;
  std::vector<std::uint32_t> scratch_;
};

}  // namespace ridgescope::detail
