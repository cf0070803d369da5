// ridgescope/forensics.h — why a run ran out of memory, and what to change (docs/forensics.md).
//
// explain_oom() turns the state at a failed request (what was live, by category and by block
// address, the segments reserved, the phase and step) into one verdict with its evidence and
// the remedies that fit the category that dominates. free_space() answers, at any instant,
// whether a request could be served from the allocator's cache. The analysis calls both while
// it replays a trace; reports carry the results.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ridgescope/category.h"

namespace ridgescope {

// The free space inside reserved segments at one instant.
//
// Pools, as in PyTorch's CUDA caching allocator: a request of at most 1 MiB (after rounding) is
// served from the small pool, whose segments are 2 MiB; a larger one from the large pool. A
// free block in one pool never serves the other. A segment of at most 2 MiB counts as a
// small-pool segment (torch makes small-pool segments of exactly 2 MiB; with
// expandable_segments the small pool's segment may grow past that and count as large). On a
// CPU trace every block is its own segment, so there are no free blocks at all.
struct FreeSpace {
  std::uint64_t free_bytes = 0;           // reserved minus live, inside segments
  std::uint64_t largest_free_block = 0;   // the largest contiguous gap, bytes
  std::uint64_t free_blocks = 0;          // number of gaps
  std::uint64_t largest_free_block_small_pool = 0;  // bytes, in segments of <= 2 MiB
  std::uint64_t largest_free_block_large_pool = 0;  // bytes, in larger segments
  // Free bytes in segments that also hold a live block: the allocator's "inactive_split"
  // bytes, which only a request that fits a gap can use (a wholly free segment can be
  // released to the driver and reserved again at any size).
  std::uint64_t inactive_split_bytes = 0;
  // Gaps by size: bucket i counts gaps of [2^(i+20), 2^(i+21)) bytes, bucket 0 everything
  // below 2 MiB (1 MiB and less included).
  std::vector<std::uint64_t> histogram;
  // Whether a request of `request` bytes fits one free block of the pool it would come from.
  bool can_serve(std::uint64_t request) const noexcept {
    return (request <= kSmallPoolRequestBytes ? largest_free_block_small_pool
                                              : largest_free_block_large_pool) >= request;
  }
  static constexpr std::uint64_t kSmallPoolRequestBytes = 1ull << 20;  // largest small-pool request
  static constexpr std::uint64_t kSmallPoolSegmentBytes = 2ull << 20;  // a small-pool segment
};

// A block or segment by address, for free_space().
struct AddressRange {
  std::uint64_t addr = 0;
  std::uint64_t bytes = 0;
};

// Gaps between live blocks inside each segment. Inputs need not be sorted.
FreeSpace free_space(std::vector<AddressRange> segments, std::vector<AddressRange> live_blocks);

struct Remedy {
  std::string action;     // what to change
  std::string trade_off;  // what it costs
};

struct Verdict {
  // "fragmentation", "live_tensors", "non_pytorch", "lazy_optimizer_state", "transient_peak",
  // "checkpoint_staging", "retained_tensors"
  std::string kind;
  std::string summary;                 // one plain-language sentence
  std::vector<std::string> evidence;   // the figures behind it
  Category dominant = Category::Unknown;  // the category that held the most at the failure
  std::vector<Remedy> remedies;
};

// What the analysis knows at a failed request.
struct OomContext {
  std::uint64_t request_bytes = 0;
  std::uint64_t live_bytes = 0, reserved_bytes = 0;
  std::optional<std::uint64_t> capacity_bytes;  // device capacity when known
  std::optional<std::uint64_t> device_free_bytes;
  std::array<std::uint64_t, kCategoryCount> by_category{};
  std::string phase;                           // innermost phase ("idle" outside any)
  std::uint64_t step = 0;
  bool first_optimizer_step = false;           // failing inside the first optimizer_step
  std::uint64_t optimizer_state_created = 0;   // optimizer state made by this step so far, bytes
  FreeSpace free;
  // Memory outside PyTorch at the failure, where the device ledger knows it (docs/forensics.md,
  // "The device ledger"): the allocations CUPTI saw, by library, and the driver's last reading.
  struct Outside {
    bool itemised = false;  // CUPTI saw the allocations outside PyTorch
    std::vector<std::pair<std::string, std::uint64_t>> by_library;  // live bytes, largest first
    std::optional<std::uint64_t> process_bytes;  // this process outside PyTorch (driver - reserved)
    std::uint64_t context_bytes = 0;             // of it, the CUDA context (first reading)
  };
  std::optional<Outside> outside;
};

Verdict explain_oom(const OomContext& context);

// What the analysis found growing across steps (retained tensors, docs/sites.md): bytes live at
// every step end, more at each one of a window of steady-state steps, up to the last step.
struct RetentionContext {
  std::uint64_t since_step = 0;          // the first step end of the window
  std::uint64_t growth_steps = 0;        // step ends in the window
  std::uint64_t growth_per_step_bytes = 0;  // average growth per step end, all sites
  std::uint64_t min_growth_bytes = 0, max_growth_bytes = 0;
  bool growth_constant = false;          // every step end grew by exactly the average
  std::uint64_t bytes = 0, blocks = 0;   // live at the growing sites at the last step end
  std::uint64_t sites = 0;               // growing (site, category) pairs
  std::string site;                      // the site made last in the final step, as text
  std::string location;                  // its "file:line" when it is a code frame ("" if not)
  std::string function;                  // its function ("" if none)
  Category category = Category::Unknown;  // of that site
  std::array<std::uint64_t, kCategoryCount> growth_by_category{};  // average per step end
  std::vector<std::string> evidence_sites;  // the largest growing sites, as text
  std::vector<std::pair<std::uint64_t, std::uint64_t>> evidence_steps;  // (step, growth), last few
};

// Kind "retained_tensors": a tensor kept across steps (appended to a list, or a whole autograd
// graph kept alive through a loss or an output), the line that made it, and the remedy.
Verdict explain_retention(const RetentionContext& context);

// The remedies that fit a category (docs/forensics.md lists them with their trade-offs).
std::vector<Remedy> remedies_for(Category category);

}  // namespace ridgescope
