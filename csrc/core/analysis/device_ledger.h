// device_ledger.h — the analysis' device ledger (ridgescope/memory_layers.h): follows the
// allocations made outside PyTorch (external_alloc / external_free events, from CUPTI) and the
// driver's readings (NVML samples) of the reported device, and reconciles each reading with
// PyTorch's reserved bytes into Report::device_ledger. Internal to csrc/core.
// Thread-safety: one analysis owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ridgescope/event.h"
#include "ridgescope/forensics.h"
#include "ridgescope/memory_layers.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope::detail {

// Sample keys of the driver's view (csrc/torch/nvml_source.cpp writes them, in this order, for
// one device at one instant; nvml_reading completes the reading and says why it was taken).
namespace nvml_sample {
inline constexpr std::string_view kTotal = "nvml_total_bytes";
inline constexpr std::string_view kUsed = "nvml_used_bytes";
inline constexpr std::string_view kProcesses = "nvml_process_count";       // processes on the device
inline constexpr std::string_view kProcessUsed = "nvml_process_used_bytes";  // this process (by PID)
inline constexpr std::string_view kReading = "nvml_reading";  // value: kPeriodic, kBoundary, kChange
inline constexpr std::uint64_t kPeriodic = 0, kBoundary = 1, kChange = 2;
// CUPTI's resource callbacks, at phase boundaries: kernel modules loaded so far and their bytes.
inline constexpr std::string_view kModulesLoaded = "cupti_modules_loaded";
inline constexpr std::string_view kModuleBytes = "cupti_module_bytes";
}  // namespace nvml_sample

class DeviceLedgerBuilder {
 public:
  DeviceLedgerBuilder(const TraceReader& reader, Device device) : reader_(reader), device_(device) {}

  // An external_alloc or external_free of the reported device; `site` is its allocation site as
  // text ("" when none), `phase_id` the innermost open phase's name (0: idle).
  void on_external(const Event& e, const std::string& site, std::uint64_t step, std::uint32_t phase_id);
  // A kept window of a bounded trace begins (trace format 4): the allocations outside PyTorch
  // live at its checkpoint follow (restate), and end_restating() then ends those live here that
  // the checkpoint did not restate (freed in steps the trace dropped).
  void begin_restating();
  // A checkpoint_external of the reported device: live already (its allocation was kept), or
  // allocated in a dropped step (it counts from here, `site` as for on_external).
  void restate(const Event& e, const std::string& site, std::uint64_t step, std::uint32_t phase_id);
  void end_restating(std::uint64_t step);
  // PyTorch reserved (or released) a segment of the reported device.
  void on_segment(bool alloc, std::uint64_t addr, std::uint64_t bytes);
  // A sample of the reported device; `reserved` is the ledger's reserved bytes at that moment.
  void on_sample(std::string_view key, std::uint64_t value, std::uint64_t time_ns, std::uint64_t reserved,
                 std::uint64_t step, std::uint32_t phase_id);
  void on_metadata(std::string_view key, std::string_view json);
  // The report's peak is this instant.
  void on_peak();
  // What the ledger knows of memory outside PyTorch now (for an OOM's verdict).
  void describe(OomContext& c, std::uint64_t reserved) const;
  void finish(std::optional<DeviceLedgerReport>& out);

 private:
  struct Group {
    ExternalGroup out;
    std::uint64_t live = 0;  // bytes live now
    std::uint64_t live_count = 0;
  };
  struct LiveAlloc {
    std::size_t group = 0;
    std::uint64_t bytes = 0;
  };
  // The ledger as seen through one driver figure: this process's usage (by PID) or the
  // device's used bytes. Both are followed; finish() keeps the process track when it has
  // readings (a container may hide the PID from NVML).
  struct Track {
    explicit Track(std::string s) : source(std::move(s)) {}
    std::string source;
    std::uint64_t readings = 0;
    bool context_known = false;
    std::uint64_t context = 0;
    std::vector<DeviceLedgerRow> rows;
    std::uint64_t rows_dropped = 0;
    std::optional<DeviceLedgerRow> at_peak, max_driver, last;
    std::uint64_t last_epoch = 0;
    bool peak_pending = false;
    std::uint64_t peak_epoch = 0;
  };
  std::string phase_name(std::uint32_t id) const;
  void commit(Track& t, std::uint64_t driver, std::uint64_t time_ns, std::uint64_t reserved, std::uint64_t step,
              std::uint32_t phase_id, std::uint64_t kind);

  const TraceReader& reader_;
  const Device device_;
  DeviceLedgerReport report_;
  std::vector<Group> groups_;
  absl::flat_hash_map<std::string, std::size_t> group_index_;  // library \x1f api \x1f site
  absl::flat_hash_map<std::uint64_t, LiveAlloc> live_;         // by address
  std::uint64_t outside_ = 0;   // live external bytes
  absl::flat_hash_map<std::uint64_t, std::uint64_t> unconfirmed_;  // while restating: addr -> bytes
  std::uint64_t epoch_ = 0;     // changes of what the driver holds (segments, external)
  Track process_{"process"}, device_wide_{"device"};
  // The reading being assembled.
  std::optional<std::uint64_t> used_, process_used_;
  std::uint64_t processes_ = 0;
  std::optional<bool> cupti_available_;
  std::string cupti_reason_;
};

}  // namespace ridgescope::detail
