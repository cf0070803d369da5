// snapshot_reader.cpp — a torch memory snapshot pickle -> ridgescope events -> the normal
// analysis (see ridgescope/snapshot.h and docs/snapshot.md), one device at a time, in four
// steps: read what the snapshot holds for the device (snapshot_document.cpp, its entries by
// snapshot_entries.cpp), find what was live before its first entry (snapshot_start_state.cpp),
// then emit the events (snapshot_emitter.cpp: phases by snapshot_phases.cpp, CUDA block sizes
// by snapshot_cuda_blocks.cpp) through the category inference (snapshot_sink.cpp).
#include <memory>
#include <stdexcept>

#include "snapshot_document.h"
#include "snapshot_emitter.h"
#include "snapshot_inference.h"
#include "snapshot_replay.h"
#include "snapshot_start_state.h"

namespace ridgescope::detail {

std::unique_ptr<SnapshotDocument> read_snapshot_device(const PickleValue& root, std::uint64_t file_bytes,
                                                       const SnapshotReadOptions& options) {
  return std::make_unique<SnapshotDocument>(root, file_bytes, options);
}

SnapshotImport replay_snapshot_document(const SnapshotDocument& doc, int protocol, const SnapshotReadOptions& options,
                                        Recorder& rec, std::uint64_t* peak_bytes) {
  const SnapshotStartState start = prescan_start_state(doc);
  std::unique_ptr<SnapshotInference> inference;  // PyTorch's snapshots record no categories
  if (!doc.ours) {
    try {
      inference = std::make_unique<SnapshotInference>(options.rules);
    } catch (const std::invalid_argument& e) {
      throw SnapshotError(e.what(), 0);
    }
  }
  SnapshotEmitter emitter(doc, start, rec, std::move(inference));
  emitter.run();
  SnapshotImport info = emitter.import_info();
  info.protocol = protocol;
  if (peak_bytes != nullptr) *peak_bytes = emitter.peak_bytes();
  return info;
}

}  // namespace ridgescope::detail
