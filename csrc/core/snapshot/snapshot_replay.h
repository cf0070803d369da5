// snapshot_replay.h — one device of a parsed snapshot pickle, replayed as ridgescope events
// (snapshot_reader.cpp), for the per-device driver of snapshot_devices.cpp (internal to the
// core; the public API is ridgescope/snapshot.h).
//
// Thread-safety: reentrant; the PickleValue tree and the documents are only read.
#pragma once

#include <cstdint>
#include <memory>

#include "pickle_reader.h"
#include "ridgescope/recorder.h"
#include "ridgescope/report.h"
#include "ridgescope/snapshot.h"

namespace ridgescope::detail {

class SnapshotDocument;

// What the replay of the device options.device_index (which must be set) reads from the
// snapshot `root` (parsed from a pickle of `file_bytes` bytes). It keeps no reference to the
// tree, so the tree may be released once every device's document is read (their strings point
// into the file's bytes, which must stay). Throws SnapshotError for content that is not a
// usable snapshot.
std::unique_ptr<SnapshotDocument> read_snapshot_device(const PickleValue& root, std::uint64_t file_bytes,
                                                       const SnapshotReadOptions& options);

// Replays `doc` (read with `options`, from a pickle of protocol `protocol`) into `rec`, and
// returns what was inferred. *peak_bytes (when given) receives the highest live bytes of the
// replay. A document may be replayed more than once.
SnapshotImport replay_snapshot_document(const SnapshotDocument& doc, int protocol, const SnapshotReadOptions& options,
                                        Recorder& rec, std::uint64_t* peak_bytes = nullptr);

}  // namespace ridgescope::detail
