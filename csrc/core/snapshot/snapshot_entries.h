// snapshot_entries.h — reading a torch memory snapshot's pickle (internal to the snapshot
// layer): the device_traces entries and the blocks of the segments as plain values, the field
// readers whose messages name where a problem is, and the budget that refuses a pickle whose
// memo makes the reader visit more items than its bytes can hold (a decompression bomb).
//
// Thread-safety: none; one reader per replay. The PickleValue tree is only read.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pickle_reader.h"
#include "ridgescope/category.h"
#include "snapshot_frames.h"

namespace ridgescope::detail {

// Throws the SnapshotError of content that is not a usable snapshot, naming the problem.
[[noreturn]] void snapshot_content_error(const std::string& message);

// The pickle type of a value, for messages ("dict", "list", ...).
std::string pickle_type_of(const PickleValue& v);

// A device_traces entry's action (torch's snapshot format, docs/snapshot.md).
enum class EntryAction : std::uint8_t {
  Alloc, FreeRequested, FreeCompleted, SegmentAlloc, SegmentFree, SegmentMap, SegmentUnmap, Oom, Annotate, Other
};

// "alloc", "free_requested", ... (the legacy "free" is FreeCompleted); Other for "snapshot" and
// the actions of newer torch versions.
EntryAction parse_entry_action(std::string_view action);

// Whether entries of this action replay something (an allocation, a free, a segment, an OOM).
inline bool replays(EntryAction a) { return a != EntryAction::Other && a != EntryAction::Annotate; }

// The frames of an entry or block with none recorded.
inline const SnapshotFrames kNoFrames{};

// One device_traces entry.
struct SnapshotEntry {
  EntryAction action = EntryAction::Other;
  std::uint64_t addr = 0, size = 0, stream = 0, time_us = 0, device_free = 0;
  std::optional<std::uint64_t> block_size;  // ridgescope exports: the block's exact bytes
  bool legacy_free = false;                 // old snapshots' "free": no free_requested before it
  const SnapshotFrames* frames = &kNoFrames;  // owned by the reader's FramesCache
  std::optional<std::string_view> category;
  std::string_view phase, label, module;  // from a dict user_metadata
  std::optional<bool> category_inferred;
  bool outside = false;  // a ridgescope export's memory outside PyTorch (not the allocator's)
};

// ridgescope's exports mark device memory allocated outside PyTorch (its own segments and
// entries, category non_pytorch, for memory_viz; snapshot_writer.cpp): it is not the
// allocator's, so the replay skips it.
bool outside_pytorch(const PickleValue& v);

// A block the snapshot shows live: at the end (its segments) or, found by the prescan, before
// the first entry.
struct SnapshotBlock {
  std::uint64_t addr = 0, bytes = 0, requested = 0;
  std::optional<std::string_view> category;
  const SnapshotFrames* frames = &kNoFrames;  // owned by the reader's FramesCache
  bool frames_from_free = false;  // the frames are the free entry's, not the allocation's
  std::string_view label, module;
  std::optional<bool> category_inferred;
};

// The items (entries, frames, blocks) the replay may visit. The pickle reader shares a container
// that the memo references again (BINGET, 2 bytes) instead of copying it, so a hostile file can
// reference one large list from thousands of places and make the replay copy it each time (a
// "billion laughs" bomb: a few hundred KiB that would need terabytes). In a real snapshot nearly
// every item visited is its own opcode of at least one byte; torch shares one frames list among
// an allocation's alloc, free_requested and free_completed entries and its block (3-4 visits of
// a list whose references cost 2-5 bytes each), so four visits per byte leave room to spare.
class VisitBudget {
 public:
  // The items a file of `file_bytes` may make the reader visit.
  static constexpr std::uint64_t allowance(std::uint64_t file_bytes) { return kVisitsPerByte * file_bytes + kSlack; }

  explicit VisitBudget(std::uint64_t file_bytes) : left_(allowance(file_bytes)) {}
  // Takes `items` visits at `where` (+ `suffix`); throws when the budget is spent.
  void take(std::uint64_t items, const std::string& where, std::string_view suffix = {});

 private:
  static constexpr std::uint64_t kVisitsPerByte = 4;
  static constexpr std::uint64_t kSlack = 64 * 1024;
  std::uint64_t left_;
};

// Field readers with messages that name where the problem is (`where`: "segments[3]", ...).
const PickleValue* field(const PickleValue& d, std::string_view key);
std::uint64_t uint_field(const PickleValue& d, std::string_view key, const std::string& where);
std::optional<std::uint64_t> opt_uint(const PickleValue& d, std::string_view key, const std::string& where);
std::string_view str_field(const PickleValue& d, std::string_view key, const std::string& where);
const PickleValue& list_field(const PickleValue& d, std::string_view key, const std::string& where);

// Frames lists, each read once: torch shares one list among an allocation's entries and its
// block (through the pickle's memo), so the replay meets the same list several times. Every
// reference still counts against the visit budget. The lists live as long as the cache.
class FramesCache {
 public:
  const SnapshotFrames* read(const PickleValue& d, const std::string& where, VisitBudget& budget);

 private:
  absl::flat_hash_map<const void*, std::unique_ptr<SnapshotFrames>> lists_;  // by the pickle's list
};

// The entry `t` at `where`.
SnapshotEntry read_entry(const PickleValue& t, const std::string& where, VisitBudget& budget, FramesCache& frames);

// Category names torch's own tools write (memory profiler categories, lowercase) and ours.
std::optional<Category> category_from_name(std::string_view name);

}  // namespace ridgescope::detail
