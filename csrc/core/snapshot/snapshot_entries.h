// snapshot_entries.h — reading a torch memory snapshot's pickle (internal to the snapshot
// layer): the device_traces entries and the blocks of the segments as plain values, the field
// readers whose messages name where a problem is, and the budget that refuses a pickle whose
// memo makes the reader visit more items than its bytes can hold (a decompression bomb).
//
// Thread-safety: none; one reader per replay. The PickleValue tree is only read.
#pragma once

#include <cstdint>
#include <deque>
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

// Where a value is in the snapshot, for messages ("device_traces[0][12]"), spelled out only when
// a message needs it: the reader visits millions of entries and names almost none. A Where made
// from a string refers to it: it lives no longer than the call it is passed to.
class Where {
 public:
  Where(const std::string& text) : text_(&text) {}  // NOLINT(google-explicit-constructor): a place spelled out
  // "<list>[i][j]"
  Where(const char* list, std::size_t i, std::size_t j) : list_(list), i_(i), j_(j) {}
  std::string str() const;

 private:
  const std::string* text_ = nullptr;
  const char* list_ = nullptr;
  std::size_t i_ = 0, j_ = 0;
};
inline std::string operator+(const Where& w, std::string_view s) { return w.str().append(s); }

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

// What an entry may carry beyond torch's own fields (a ridgescope export's user_metadata and
// exact block size, a category key as memory_viz's profile_plot writes it, an OOM's free
// bytes): kept apart, so that the common entry stays small (a snapshot has millions).
struct SnapshotEntryExtra {
  std::optional<std::uint64_t> block_size;  // ridgescope exports: the block's exact bytes
  std::uint64_t device_free = 0;            // oom
  std::optional<std::string_view> category;
  std::string_view phase, label, module;  // from a dict user_metadata
  std::optional<bool> category_inferred;
};
inline const SnapshotEntryExtra kNoExtra{};

// One device_traces entry (56 bytes).
struct SnapshotEntry {
  EntryAction action = EntryAction::Other;
  bool legacy_free = false;  // old snapshots' "free": no free_requested before it
  bool outside = false;      // a ridgescope export's memory outside PyTorch (not the allocator's)
  std::uint64_t addr = 0, size = 0, stream = 0, time_us = 0;
  const SnapshotFrames* frames = &kNoFrames;     // owned by the reader's FramesCache
  const SnapshotEntryExtra* extra = &kNoExtra;  // owned by the reader's SnapshotExtras

  std::optional<std::uint64_t> block_size() const { return extra->block_size; }
  std::uint64_t device_free() const { return extra->device_free; }
  std::optional<std::string_view> category() const { return extra->category; }
  std::string_view phase() const { return extra->phase; }
  std::string_view label() const { return extra->label; }
  std::string_view module() const { return extra->module; }
  std::optional<bool> category_inferred() const { return extra->category_inferred; }
};

// The entries' extras (pointers to them stay valid).
using SnapshotExtras = std::deque<SnapshotEntryExtra>;

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
  void take(std::uint64_t items, const Where& where, std::string_view suffix = {});

 private:
  static constexpr std::uint64_t kVisitsPerByte = 4;
  static constexpr std::uint64_t kSlack = 64 * 1024;
  std::uint64_t left_;
};

// Field readers with messages that name where the problem is (`where`: "segments[3]", ...).
const PickleValue* field(const PickleValue& d, std::string_view key);
std::uint64_t uint_field(const PickleValue& d, std::string_view key, const Where& where);
std::optional<std::uint64_t> opt_uint(const PickleValue& d, std::string_view key, const Where& where);
std::string_view str_field(const PickleValue& d, std::string_view key, const Where& where);
const PickleValue& list_field(const PickleValue& d, std::string_view key, const Where& where);

// Frames lists, each read once: torch shares one list among an allocation's entries and its
// block (through the pickle's memo), so the replay meets the same list several times. Every
// reference still counts against the visit budget. The lists live as long as the cache.
class FramesCache {
 public:
  const SnapshotFrames* read(const PickleValue& d, const Where& where, VisitBudget& budget);

 private:
  absl::flat_hash_map<const void*, std::unique_ptr<SnapshotFrames>> lists_;  // by the pickle's list
};

// The entry `t` at `where`; what it carries beyond torch's fields goes to `extras`.
SnapshotEntry read_entry(const PickleValue& t, const Where& where, VisitBudget& budget, FramesCache& frames,
                         SnapshotExtras& extras);

// Category names torch's own tools write (memory profiler categories, lowercase) and ours.
std::optional<Category> category_from_name(std::string_view name);

}  // namespace ridgescope::detail
