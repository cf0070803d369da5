// block_lifetimes.h — the lifetime rules of docs/categories.md, online: follows every live
// block through the phases and tags of a stream of events and decides, when its life ends (a
// free, a missed free, the end of the stream or of a kept window), the category it has for its
// whole life. One implementation for every consumer: the analysis's first pass
// (lifetime_pass.cpp, with hindsight over a whole file), the flight recorder's summaries of each
// step (step_summarizer.cpp, on the recording side), and the live view.
//
// A block's resolution: its first strong tag; else its first weak tag (an activation saved
// before the current forward began is an input); else, when freed, `temporary` if freed in the
// phase (or idle spell) it was made in, `activation` if made in forward and freed in backward;
// else `buffer` if made while compiling, `gradient` if made in backward (not in a forward
// inside it), `optimizer_state` if made in an optimizer step, else `unknown`.
//
// Checkpoints (ridgescope/flight_records.h) carry a block's life so far, so a window that starts
// from one resolves exactly as the whole stream would.
//
// Savers learned from the saved-tensor hook (docs/categories.md, "Savers learned from the hook's
// first steps"): a block the hook tagged (a weak tag: an activation with its saver's label, or
// an input) teaches its key (device, stack, module context, requested bytes, and how many
// blocks of that device, stack and context the same step made before it) that category and
// label, the last one seen winning. An untagged block with a learned key takes them where
// lifetimes find an activation (the label) or find nothing (the category too: a target the loop
// keeps past backward is the input the hook called it): a step repeats the same allocations in
// the same order, so the steps after the hook came off read what the hook said of the same
// allocation of an earlier step. Such a resolution is not `inferred`: it is the hook's word.
//
// Internal to the core. Thread-safety: none; one instance per stream.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ridgescope/category.h"
#include "ridgescope/event.h"
#include "ridgescope/flight_records.h"
#include "ridgescope/phase.h"

namespace ridgescope::detail {

// Device and address in one key: user-space addresses fit in 48 bits on every platform torch
// supports, so the device code takes the top 16.
inline std::uint64_t device_code(Device d) {
  return (static_cast<std::uint64_t>(d.type) << 8) |
         static_cast<std::uint64_t>(static_cast<std::uint8_t>(d.index + 1));
}
inline std::uint64_t block_key(Device d, std::uint64_t addr) { return (device_code(d) << 48) ^ addr; }
inline Device device_from_code(std::uint64_t code) {
  Device d;
  d.type = static_cast<DeviceType>(code >> 8);
  d.index = static_cast<std::int16_t>(static_cast<int>(code & 0xFF) - 1);
  return d;
}

// The category a block gets for its whole life.
struct Resolved {
  Category category = Category::Unknown;
  bool inferred = false;       // from a lifetime rule, not a tag (or a tag that was itself inferred)
  std::uint32_t label_id = 0;  // trace string id (0: none)
};

// What a live block's life has shown so far.
struct BlockLife {
  std::uint64_t uid = 0;        // ordinal of its allocation (alloc or checkpoint block) in the stream
  std::uint64_t position = 0;   // when it was made, in the order of the events seen
  Device device;
  std::uint64_t addr = 0, bytes = 0, requested_bytes = 0, stream = 0;
  std::uint32_t context_id = 0, stack_id = 0;
  // How many blocks of this device, stack and context its step made before it (kNoOccurrence
  // for a block from a checkpoint, whose step's earlier allocations were not seen).
  std::uint32_t occurrence = 0;
  std::uint32_t alloc_phase_id = 0;  // innermost phase at its allocation (string id; 0 idle)
  std::uint64_t alloc_step = 0;
  std::uint64_t idle_epoch = 0;
  std::uint64_t instance = 0;   // serial of the innermost phase open at allocation; 0 when none
  bool forwardish = false, in_backward = false, in_optimizer = false, in_compile = false;
  bool has_strong = false, strong_inferred = false, has_weak = false;
  Category strong = Category::Unknown, weak = Category::Unknown;
  std::uint32_t strong_label = 0, weak_label = 0;
  Category current = Category::Unknown;  // the last strong tag's category (a ledger's view)
  std::uint32_t current_label = 0;
  std::optional<Resolved> final;  // decided by a later record (a window's Resolve), if any
  // For the step summaries (step_summarizer.cpp): the category it is counted in, and the step
  // peak epoch of its allocation.
  Category shown = Category::Unknown;
  std::uint64_t epoch = 0;
};

// A block whose life ended, and the category it had.
struct EndedBlock {
  BlockLife life;
  Resolved resolved;
};

inline constexpr std::uint32_t kNoOccurrence = 0xFFFFFFFFu;

class BlockLifetimes {
 public:
  // Most keys the learned savers hold: a run whose allocations never repeat (shapes that change
  // every step) stops learning there rather than grow for the whole run.
  static constexpr std::size_t kMaxLearnedSavers = 1u << 16;

  // An allocation (the current step and the innermost phase are the caller's to give). A live
  // block at the same address is a missed free: it ends here (*replaced).
  BlockLife& alloc(const Event& e, std::uint64_t step, std::optional<EndedBlock>* replaced);
  // A free of a live block (nullopt for an address that is not live).
  std::optional<EndedBlock> free(const Event& e);
  // A tag; returns the block it applies to (nullptr when the address is not live).
  BlockLife* tag(const Event& e);
  // Phases. phase_end returns how many open phases it closed (0 when `name_id` was not open).
  void phase_begin(std::uint32_t name_id, PhaseKind kind);
  std::size_t phase_end(std::uint32_t name_id);

  // The category `b` has for its whole life if it ended now (freed or not).
  Resolved resolve(const BlockLife& b, bool freed) const;
  // The category `b` is seen in now: its last strong tag, else what it would resolve to if it
  // lived on.
  Category current_category(const BlockLife& b) const;

  // Ends every live block (a window or the stream ended): fn(block, resolution), then clears.
  template <class Fn>
  void end_all(Fn&& fn) {
    for (auto& [key, b] : live_) fn(b, b.final ? *b.final : resolve(b, /*freed=*/false));
    live_.clear();
  }

  BlockLife* find(Device device, std::uint64_t addr);
  template <class Fn>
  void for_each_live(Fn&& fn) const {
    for (const auto& [key, b] : live_) fn(b);
  }
  std::size_t live_blocks() const { return live_.size(); }

  // Checkpoints: the state to write (the open phases and a block's life as a record), and a
  // window that starts from one (after end_all): the open phases, then each block.
  Checkpoint checkpoint(std::uint64_t step, std::uint64_t time_ns) const;
  CheckpointBlock checkpoint_block(const BlockLife& b) const;
  void begin_window(const Checkpoint& c, const std::vector<PhaseKind>& kinds);
  BlockLife& add_checkpoint_block(const CheckpointBlock& b);

  // The open phases, outermost first (string ids).
  std::vector<std::uint32_t> open_phases() const;
  bool idle() const { return stack_.empty(); }
  std::uint64_t next_uid() const { return next_uid_; }

 private:
  struct Open {
    std::uint64_t serial;
    PhaseKind kind;
    std::uint32_t name_id;
  };
  bool stack_has(PhaseKind kind) const;
  bool open(std::uint64_t serial) const;
  // A block's key for the learned savers (device code, stack, context, occurrence, bytes).
  using SaverKey = std::tuple<std::uint64_t, std::uint32_t, std::uint32_t, std::uint32_t, std::uint64_t>;
  static SaverKey saver_key(const BlockLife& b) {
    return {device_code(b.device), b.stack_id, b.context_id, b.occurrence, b.requested_bytes};
  }
  struct Learned {
    Category category = Category::Unknown;
    std::uint32_t label_id = 0;
  };
  void learn_saver(const BlockLife& b);
  const Learned* learned_saver(const BlockLife& b) const;

  absl::flat_hash_map<std::uint64_t, BlockLife> live_;
  std::vector<Open> stack_;
  std::uint64_t next_serial_ = 1;
  std::uint64_t next_uid_ = 0;
  std::uint64_t position_ = 0;
  std::uint64_t idle_epoch_ = 0;
  std::uint64_t last_forward_begin_ = 0;
  bool have_forward_ = false;
  // Blocks made per (device code, stack, context) in the step that last made one.
  struct Occurrences {
    std::uint64_t step = ~std::uint64_t{0};
    std::uint32_t count = 0;
  };
  absl::flat_hash_map<std::tuple<std::uint64_t, std::uint32_t, std::uint32_t>, Occurrences> occurrences_;
  absl::flat_hash_map<SaverKey, Learned> savers_;  // key -> what the hook's weak tag said
};

}  // namespace ridgescope::detail
