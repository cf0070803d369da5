// host_ledger.h — the analysis' host-memory layers: collects the CPU `host_*` samples of a
// trace into readings and decomposes each (ridgescope/host_memory.h) into
// Report::host_memory. Internal to csrc/core. Thread-safety: one analysis owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ridgescope/memory_layers.h"

namespace ridgescope::detail {

class HostLedgerBuilder {
 public:
  // One sample of the CPU device (any key: the host_* ones are kept). `step` and `phase` say
  // where the run was when it was taken.
  void on_sample(std::string_view key, std::uint64_t value, std::uint64_t time_ns, std::uint64_t step,
                 const std::string& phase);
  // The report's peak was reached at time_ns: the next reading is the one shown for it.
  void on_peak(std::uint64_t time_ns);
  // Moves the result into `out` (nothing when the trace had no reading).
  void finish(std::optional<HostMemoryReport>& out);

 private:
  HostReading pending_{};
  // The last reading with glibc's counters: carried into the readings that have none.
  std::optional<std::uint64_t> last_malloc_in_use_, last_malloc_free_;
  std::uint64_t last_malloc_time_ns_ = 0;
  HostMemoryReport report_;
  bool peak_pending_ = false;
};

}  // namespace ridgescope::detail
