// host_ledger.cpp — host_* samples -> Report::host_memory (host_ledger.h).
#include "host_ledger.h"

#include <utility>

namespace ridgescope::detail {

void HostLedgerBuilder::on_sample(std::string_view key, std::uint64_t value, std::uint64_t time_ns,
                                  std::uint64_t step, const std::string& phase) {
  namespace k = host_sample;
  if (key.substr(0, 5) != "host_") return;
  if (key == k::kReadingsSkipped) {
    report_.readings_skipped += value;
    return;
  }
  if (key == k::kTorchAllocated) pending_.torch_allocated = value;
  else if (key == k::kTorchResident) pending_.torch_resident = value;
  else if (key == k::kMallocInUse) pending_.malloc_in_use = value;
  else if (key == k::kMallocFree) pending_.malloc_free = value;
  else if (key == k::kRssAnon) pending_.rss_anon = value;
  else if (key == k::kRssFile) pending_.rss_file = value;
  else if (key == k::kRssShmem) pending_.rss_shmem = value;
  if (key != k::kResident) return;
  // The resident set comes last: the reading is complete.
  pending_.resident = value;
  HostSample s;
  if (pending_.malloc_in_use && pending_.malloc_free) {
    last_malloc_in_use_ = pending_.malloc_in_use;
    last_malloc_free_ = pending_.malloc_free;
    last_malloc_time_ns_ = s.malloc_time_ns = time_ns;
  } else if (last_malloc_in_use_ && last_malloc_free_) {  // skipped by the source's budget
    pending_.malloc_in_use = last_malloc_in_use_;
    pending_.malloc_free = last_malloc_free_;
    s.malloc_time_ns = last_malloc_time_ns_;
  }
  s.time_ns = time_ns;
  s.step = step;
  s.phase = phase;
  s.torch_allocated_bytes = pending_.torch_allocated;
  s.layers = decompose_host_memory(pending_);
  pending_ = HostReading{};
  ++report_.samples;
  if (phase != "idle") ++report_.phase_end_readings;  // not the readings at tracking's start and stop
  if (!report_.max_resident || s.layers.resident > report_.max_resident->layers.resident) report_.max_resident = s;
  if (peak_pending_) {
    report_.at_peak = s;
    peak_pending_ = false;
  }
  if (report_.rows.size() < HostMemoryReport::kMaxRows) {
    report_.rows.push_back(std::move(s));
  } else {
    ++report_.rows_dropped;
  }
}

void HostLedgerBuilder::on_peak(std::uint64_t) { peak_pending_ = true; }

void HostLedgerBuilder::finish(std::optional<HostMemoryReport>& out) {
  if (report_.samples == 0) return;
  out = std::move(report_);
}

}  // namespace ridgescope::detail
