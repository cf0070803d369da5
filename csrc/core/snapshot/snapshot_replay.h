// snapshot_replay.h — one device of a parsed snapshot pickle, replayed as ridgescope events
// (snapshot_reader.cpp), for the per-device driver of snapshot_devices.cpp (internal to the
// core; the public API is ridgescope/snapshot.h).
//
// Thread-safety: reentrant; the PickleValue tree is only read.
#pragma once

#include <cstdint>

#include "pickle_reader.h"
#include "ridgescope/recorder.h"
#include "ridgescope/report.h"
#include "ridgescope/snapshot.h"

namespace ridgescope::detail {

// Replays the device options.device_index (which must be set) of the snapshot `root` (parsed
// from a pickle of `file_bytes` bytes, protocol `protocol`) into `rec`, and returns what was
// inferred. *peak_bytes (when given) receives the highest live bytes of the replay. Throws
// SnapshotError for content that is not a usable snapshot.
SnapshotImport replay_snapshot_device(const PickleValue& root, int protocol, std::uint64_t file_bytes,
                                      const SnapshotReadOptions& options, Recorder& rec,
                                      std::uint64_t* peak_bytes = nullptr);

}  // namespace ridgescope::detail
