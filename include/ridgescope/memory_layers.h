// ridgescope/memory_layers.h — the report's two ledgers beside the composition (docs/forensics.md,
// "The device ledger" and "Host memory: the three layers"):
//
//   device ledger: the driver's figure for the process (NVML) = PyTorch reserved + each group of
//                  allocations made outside PyTorch (CUPTI: by library, API and site) + the CUDA
//                  context (and whatever existed before tracking) + the unexplained remainder;
//   host memory:   the resident set = PyTorch's live CPU blocks (resident part) + the C
//                  allocator's slack + everything else (files, shared memory, other heap users,
//                  remainder), at every phase end (ridgescope/host_memory.h).
//
// Produced by analyze_trace(); serialised in the report's `device_ledger` and `host_memory`
// sections (docs/report_schema.md). All figures are bytes; times are nanoseconds since the
// session started. Thread-safety: plain data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ridgescope/host_memory.h"

namespace ridgescope {

// --- Host memory ----------------------------------------------------------------------------
struct HostSample {
  std::uint64_t time_ns = 0;
  std::uint64_t step = 0;
  std::string phase = "idle";  // the innermost phase open at the reading ("idle" outside any)
  std::uint64_t torch_allocated_bytes = 0;  // torch's live CPU blocks (live bytes)
  // When glibc's counters (the slack, the other heap) were read, in trace ns: time_ns, or an
  // earlier reading's whose figures this one carries (the source takes mallinfo2 under a time
  // budget: csrc/torch/host_memory_source.h); 0 when none was read before it.
  std::uint64_t malloc_time_ns = 0;
  HostLayers layers;
};

struct HostMemoryReport {
  std::uint64_t samples = 0;            // readings in the trace
  std::uint64_t phase_end_readings = 0; // readings taken inside a phase: at its end
  std::uint64_t readings_skipped = 0;   // phase ends the source's time budget did not read
  std::vector<HostSample> rows;         // the readings, in order (at most kMaxRows; see dropped)
  std::uint64_t rows_dropped = 0;       // readings past kMaxRows (the first ones are kept)
  std::optional<HostSample> max_resident;  // the reading with the largest resident set
  std::optional<HostSample> at_peak;       // the first reading at or after the report's peak
  static constexpr std::size_t kMaxRows = 1000;
};

// --- Device ledger --------------------------------------------------------------------------
// Allocations outside PyTorch made by one library, through one API, at one site.
struct ExternalGroup {
  std::string library;   // "libnccl.so.2"; "unknown" when the caller could not be found
  std::string api;       // external_api_name(): "cudaMalloc", "cuMemCreate", ...
  std::string site;      // the Python site where one was made ("" when no stack was recorded)
  std::uint64_t allocations = 0;     // made during the run
  std::uint64_t live_at_peak = 0;    // live at the report's peak (count)
  std::uint64_t bytes_at_peak = 0;   // live at the report's peak
  std::uint64_t max_bytes = 0;       // the most live at once
  std::uint64_t end_bytes = 0;       // live when the trace ends
  std::uint64_t first_step = 0;      // where the first was made
  std::string first_phase = "idle";
  std::optional<std::uint64_t> last_free_step;  // where the last free happened (none: never)
  std::string last_free_phase;
};

// The ledger at one driver reading.
struct DeviceLedgerRow {
  std::uint64_t time_ns = 0;
  std::uint64_t step = 0;
  std::string phase = "idle";
  std::uint64_t driver_bytes = 0;      // NVML: the process's usage (or the device's used bytes)
  std::uint64_t reserved_bytes = 0;    // PyTorch's allocator, reserved (the ledger's)
  std::uint64_t outside_bytes = 0;     // live allocations outside PyTorch (CUPTI's groups)
  std::uint64_t context_bytes = 0;     // the CUDA context and what existed before tracking
  std::int64_t unexplained_bytes = 0;  // driver − reserved − outside − context
  bool exact = true;  // for the reading taken for the peak: nothing was allocated or freed on
                      // the device between the peak and the reading
};

struct DeviceLedgerReport {
  bool available = false;       // driver readings were found for the reported device
  std::string reason;           // why not
  std::string driver_source;    // "process" (NVML by PID) or "device" (device-wide used bytes)
  std::uint64_t other_processes = 0;  // processes NVML listed on the device besides this one (most seen)
  bool itemised = false;        // CUPTI saw the allocations outside PyTorch
  std::string itemise_reason;   // why not (CUPTI absent, refused, not compiled in)
  std::uint64_t readings = 0;
  std::uint64_t total_bytes = 0;        // the device's memory (NVML)
  std::uint64_t context_bytes = 0;      // at the first reading: driver − reserved − outside
  std::uint64_t modules_loaded = 0;     // kernel modules the driver loaded while tracking (CUPTI)
  std::uint64_t module_bytes = 0;       // their code images, bytes (a lower bound of their share)
  std::uint64_t outside_inside_reserved = 0;  // external allocations that turned out to be a
                                              // PyTorch segment (a pool's user allocator): dropped
  std::optional<DeviceLedgerRow> at_peak;     // the reading taken for the report's peak
  std::optional<DeviceLedgerRow> max_driver;  // the highest driver reading
  std::optional<DeviceLedgerRow> last;        // the last reading
  std::vector<DeviceLedgerRow> rows;          // every phase boundary's reading (at most kMaxRows)
  std::uint64_t rows_dropped = 0;
  std::vector<ExternalGroup> groups;          // largest max_bytes first
  static constexpr std::size_t kMaxRows = 1000;
};

}  // namespace ridgescope
