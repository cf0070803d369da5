// ridgescope/ledger.h — the live blocks of one device and the bytes per category.
//
// The ledger is the state every analysis replays: which blocks are live (keyed by address),
// how many bytes each category holds, and how much memory is reserved. One Ledger describes one
// device; an analysis that covers several devices keeps one per device.
//
// Invariant: live_bytes() == sum of by_category() == sum of the live blocks' bytes, always.
// Inconsistent input (a free of an unknown address, an alloc over a live address) never
// corrupts the totals: it is counted in anomalies() and handled as documented per method.
//
// Thread-safety: none; a Ledger belongs to one thread (the analysis replaying a trace).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "ridgescope/category.h"

namespace ridgescope {

struct LiveBlock {
  std::uint64_t bytes = 0;            // block bytes, as the allocator rounds them
  std::uint64_t requested_bytes = 0;  // bytes the caller asked for
  std::uint64_t block_id = 0;         // ordinal of the alloc event that created the block
  std::uint32_t label_id = 0;         // trace string id of the label (0: none)
  std::uint32_t alloc_phase_id = 0;   // trace string id of the innermost phase at alloc (0: idle)
  std::uint32_t context_id = 0;       // trace string id of the module running at alloc (0: none)
  std::uint32_t stack_id = 0;         // trace stack id of where it was made (0: none)
  Category category = Category::Unknown;
};

struct LedgerAnomalies {
  std::uint64_t unknown_frees = 0;      // frees of an address that was not live
  std::uint64_t replaced_allocs = 0;    // allocs over a live address (the old block is dropped)
  std::uint64_t unknown_tags = 0;       // category changes for an address that was not live
  std::uint64_t unknown_segment_frees = 0;
};

class Ledger {
 public:
  Ledger();
  ~Ledger();
  Ledger(Ledger&&) noexcept;
  Ledger& operator=(Ledger&&) noexcept;

  // Records a live block. If `addr` is already live, the old block is removed first and the
  // anomaly counted (a missed free), so totals stay exact for what is known.
  void on_alloc(std::uint64_t addr, const LiveBlock& block);

  // Removes the block at `addr` and returns it; std::nullopt (counted) when it was not live.
  std::optional<LiveBlock> on_free(std::uint64_t addr);

  // Moves a live block to another category and label; false (counted) when `addr` is not live.
  bool set_category(std::uint64_t addr, Category category, std::uint32_t label_id);

  void on_segment_alloc(std::uint64_t addr, std::uint64_t bytes);
  void on_segment_free(std::uint64_t addr);

  const LiveBlock* find(std::uint64_t addr) const;

  std::uint64_t live_bytes() const noexcept { return live_bytes_; }
  std::uint64_t live_bytes(Category c) const noexcept { return by_category_[category_index(c)]; }
  const std::array<std::uint64_t, kCategoryCount>& by_category() const noexcept {
    return by_category_;
  }
  // Reserved bytes: the sum of live segments, or live_bytes() where the source has no segments
  // (the CPU allocator, where allocated equals reserved).
  std::uint64_t reserved_bytes() const noexcept {
    return has_segments_ ? segment_bytes_ : live_bytes_;
  }
  std::size_t live_blocks() const noexcept;
  const LedgerAnomalies& anomalies() const noexcept { return anomalies_; }

  // Calls fn(address, bytes) for every reserved segment, in no particular order.
  void for_each_segment(const std::function<void(std::uint64_t, std::uint64_t)>& fn) const;

  // Calls fn(address, block) for every live block, in no particular order.
  void for_each_live(const std::function<void(std::uint64_t, const LiveBlock&)>& fn) const;

 private:
  struct Maps;  // the hash maps (Abseil), kept out of this header
  std::unique_ptr<Maps> maps_;
  std::array<std::uint64_t, kCategoryCount> by_category_{};
  std::uint64_t live_bytes_ = 0;
  std::uint64_t segment_bytes_ = 0;
  bool has_segments_ = false;
  LedgerAnomalies anomalies_;
};

}  // namespace ridgescope
