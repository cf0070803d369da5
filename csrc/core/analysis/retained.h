// retained.h — tensors kept across steps (docs/sites.md, "Retained tensors"): an aggregator over
// the event stream that follows, per allocation site and category, the bytes live at every step
// end, and finds the sites whose bytes grow at every step end of the steady state up to the
// last one. State that grows once (optimizer state made lazily in the first step), a cache
// that grows and then plateaus, or memory reused in place (gradient accumulation) does not
// grow at every step end, so it gives no verdict. Internal to csrc/core.
// Thread-safety: one analysis owns each detector.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "peak_sites.h"
#include "ridgescope/category.h"
#include "ridgescope/report.h"

namespace ridgescope::detail {

class RetentionDetector {
 public:
  // Growth at fewer consecutive step ends than this says nothing (a cache that fills up).
  static constexpr std::uint64_t kMinGrowthSteps = 3;
  // Less than this per step, on average over all growing sites, is not reported.
  static constexpr std::uint64_t kMinGrowthBytes = 1024;
  // Step ends remembered per site for the per-step figures (the window is at most this long).
  static constexpr std::size_t kWindow = 64;

  void on_alloc(std::uint64_t block_id, std::uint32_t site_frame, Category category,
                std::uint64_t bytes, std::uint64_t seq);
  void on_free(std::uint64_t block_id);
  // The end of step `step` (its `step` record).
  void on_step_end(std::uint64_t step);

  // What grew, with its sites in the report's frames and its verdict; nullopt when nothing did.
  std::optional<RetainedGrowth> result(FrameTable& frames) const;

 private:
  struct Site {
    std::uint32_t frame = 0;
    Category category = Category::Unknown;
    std::uint64_t bytes = 0, blocks = 0;  // live now
    // At the last step end:
    std::uint64_t end_bytes = 0, end_blocks = 0;
    std::uint64_t run = 0;  // consecutive step ends (up to the last) with more bytes than before
    std::array<std::uint64_t, kWindow> growth{};  // growth at the last `run` step ends (a ring)
  };
  struct Live {
    std::uint32_t site;
    std::uint64_t bytes;
    std::uint64_t seq;  // of its alloc event
  };
  std::uint32_t site_index(std::uint32_t frame, Category category);

  std::vector<Site> sites_;
  absl::flat_hash_map<std::uint64_t, std::uint32_t> index_;  // (frame << 8 | category) -> site
  absl::flat_hash_map<std::uint64_t, Live> live_;             // block id -> its site and bytes
  std::uint64_t step_ends_ = 0;
  std::uint64_t last_end_seq_ = 0;  // the last step end's position in the stream (alloc seqs before it)
  std::uint64_t seq_ = 0;           // the last alloc's seq
  std::array<std::uint64_t, kWindow> steps_{};  // step numbers of the last step ends (a ring)
};

}  // namespace ridgescope::detail
