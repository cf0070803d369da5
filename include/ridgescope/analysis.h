// ridgescope/analysis.h — turns a trace file into a Report.
//
// Two streaming passes over the file. Pass 1 follows every block's lifetime to decide its
// category with hindsight (a direct tag wins; otherwise the lifetime rules of
// docs/categories.md: temporary, inferred activation, gradient, optimizer state) and finds the
// peak. Pass 2 replays the chosen device into a Ledger with those categories and gathers the
// peak's composition and blocks, per-step and per-phase statistics, OOMs and consistency
// checks. Memory: the live blocks, one small record per allocation, and the phase table.
//
// Thread-safety: analyze_trace() is reentrant; it shares no state between calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ridgescope/event.h"
#include "ridgescope/report.h"

namespace ridgescope {

struct AnalysisOptions {
  std::size_t top_blocks = 20;     // blocks listed at the peak
  std::size_t top_labels = 30;     // labels listed at the peak
  std::size_t top_sites = 30;      // (site, category) rows listed at the peak
  std::size_t max_stacks = 2000;   // stacks listed at the peak; smaller ones are merged
  std::size_t timeline_columns = 2000;  // at most this many Report::timeline columns (>= 1)
  std::optional<Device> device;    // default: the device with the highest peak
  // Also report the cache's free space at this instant (nanoseconds since the session
  // started): Report::probe. Any instant, not only an OOM or the peak.
  std::optional<std::uint64_t> probe_time_ns;
  // A step stands out when its peak exceeds the median step's by more than this fraction
  // (Report::glance, ridgescope/run_glance.h).
  double standout_fraction = 0.10;
};

// Throws TraceError when the file cannot be read as a trace at all. A truncated or corrupt tail
// is not an error: the report covers the readable prefix and says so in trace.truncated,
// trace.problem and a warning.
Report analyze_trace(const std::string& path, const AnalysisOptions& options = {});

// What the analysis decides for one allocation, with hindsight (analyze_trace's first pass).
struct BlockAttribution {
  Category category = Category::Unknown;
  bool inferred = false;       // from a lifetime rule (docs/categories.md), not a tag
  std::uint32_t label_id = 0;  // trace string id of the label (0: none)
};

// The category of every allocation of a trace, in the order of its Alloc events (all devices),
// exactly as analyze_trace() attributes them. Used by exports that colour each allocation
// (the snapshot writer). Throws TraceError like analyze_trace().
std::vector<BlockAttribution> attribute_blocks(const std::string& path);

}  // namespace ridgescope
