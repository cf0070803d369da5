// device_ledger.cpp — external allocations and driver readings -> Report::device_ledger
// (device_ledger.h).
#include "device_ledger.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "json_value.h"
#include "ridgescope/external_alloc.h"

namespace ridgescope::detail {

std::string DeviceLedgerBuilder::phase_name(std::uint32_t id) const {
  const auto s = reader_.string(id);
  return s.empty() ? std::string("idle") : std::string(s);
}

void DeviceLedgerBuilder::on_external(const Event& e, const std::string& site, std::uint64_t step,
                                      std::uint32_t phase_id) {
  if (e.kind == EventKind::ExternalAlloc) {
    if (auto old = live_.find(e.addr); old != live_.end()) {  // its free was missed: it ends here
      Group& g = groups_[old->second.group];
      g.live -= std::min(g.live, old->second.bytes);
      if (g.live_count > 0) --g.live_count;
      outside_ -= std::min(outside_, old->second.bytes);
      live_.erase(old);
    }
    const std::string_view library = reader_.string(e.string_id);
    const std::string_view api = external_api_name(external_api_from_byte(e.flags));
    std::string key;
    key.append(library).push_back('\x1f');
    key.append(api).push_back('\x1f');
    key.append(site);
    auto [it, inserted] = group_index_.try_emplace(std::move(key), groups_.size());
    if (inserted) {
      Group g;
      g.out.library = library.empty() ? std::string("unknown") : std::string(library);
      g.out.api = std::string(api);
      g.out.site = site;
      g.out.first_step = step;
      g.out.first_phase = phase_name(phase_id);
      groups_.push_back(std::move(g));
    }
    Group& g = groups_[it->second];
    ++g.out.allocations;
    g.live += e.bytes;
    ++g.live_count;
    g.out.max_bytes = std::max(g.out.max_bytes, g.live);
    live_[e.addr] = LiveAlloc{it->second, e.bytes};
    outside_ += e.bytes;
    ++epoch_;
    return;
  }
  auto it = live_.find(e.addr);
  if (it == live_.end()) return;
  Group& g = groups_[it->second.group];
  g.live -= std::min(g.live, it->second.bytes);
  if (g.live_count > 0) --g.live_count;
  g.out.last_free_step = step;
  g.out.last_free_phase = phase_name(phase_id);
  outside_ -= std::min(outside_, it->second.bytes);
  live_.erase(it);
  ++epoch_;
}

void DeviceLedgerBuilder::begin_restating() {
  unconfirmed_.clear();
  for (const auto& [addr, a] : live_) unconfirmed_[addr] = a.bytes;
}

void DeviceLedgerBuilder::restate(const Event& e, const std::string& site, std::uint64_t step,
                                  std::uint32_t phase_id) {
  auto it = unconfirmed_.find(e.addr);
  if (it != unconfirmed_.end() && it->second == e.bytes) {  // the same allocation, still live
    unconfirmed_.erase(it);
    return;
  }
  if (it != unconfirmed_.end()) unconfirmed_.erase(it);  // replaced: on_external ends the old one
  Event a = e;
  a.kind = EventKind::ExternalAlloc;
  on_external(a, site, step, phase_id);
}

void DeviceLedgerBuilder::end_restating(std::uint64_t step) {
  for (const auto& [addr, bytes] : unconfirmed_) {
    Event f;
    f.kind = EventKind::ExternalFree;
    f.addr = addr;
    f.bytes = bytes;
    on_external(f, std::string(), step, 0);
  }
  unconfirmed_.clear();
}

void DeviceLedgerBuilder::on_segment(bool alloc, std::uint64_t addr, std::uint64_t bytes) {
  ++epoch_;
  if (!alloc) return;
  // An external allocation inside a segment PyTorch reserves is PyTorch's (a MemPool's user
  // allocator calls ncclMemAlloc, say, and the caching allocator then records the segment): it
  // is in the reserved bytes already, so it leaves the groups.
  const std::uint64_t end = bytes > UINT64_MAX - addr ? UINT64_MAX : addr + bytes;
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->first >= addr && it->first < end) {
      Group& g = groups_[it->second.group];
      g.live -= std::min(g.live, it->second.bytes);
      if (g.live_count > 0) --g.live_count;
      if (g.out.allocations > 0) --g.out.allocations;
      outside_ -= std::min(outside_, it->second.bytes);
      ++report_.outside_inside_reserved;
      live_.erase(it++);
    } else {
      ++it;
    }
  }
}

void DeviceLedgerBuilder::commit(Track& t, std::uint64_t driver, std::uint64_t time_ns, std::uint64_t reserved,
                                 std::uint64_t step, std::uint32_t phase_id, std::uint64_t kind) {
  DeviceLedgerRow row;
  row.time_ns = time_ns;
  row.step = step;
  row.phase = phase_name(phase_id);
  row.driver_bytes = driver;
  row.reserved_bytes = reserved;
  row.outside_bytes = outside_;
  if (!t.context_known) {  // the first reading: what the driver holds beyond PyTorch and CUPTI's groups
    t.context_known = true;
    const std::uint64_t known = reserved > UINT64_MAX - outside_ ? UINT64_MAX : reserved + outside_;
    t.context = driver > known ? driver - known : 0;
  }
  row.context_bytes = t.context;
  // Signed, and saturated: a corrupt trace may carry readings near 2^64.
  const __int128 unexplained = static_cast<__int128>(driver) - reserved - outside_ - t.context;
  row.unexplained_bytes = unexplained > INT64_MAX ? INT64_MAX
                          : unexplained < INT64_MIN ? INT64_MIN
                                                    : static_cast<std::int64_t>(unexplained);
  ++t.readings;
  if (kind == nvml_sample::kBoundary) {
    if (t.rows.size() < DeviceLedgerReport::kMaxRows) t.rows.push_back(row); else ++t.rows_dropped;
  }
  if (!t.max_driver || driver > t.max_driver->driver_bytes) t.max_driver = row;
  if (t.peak_pending) {
    t.at_peak = row;
    t.at_peak->exact = epoch_ == t.peak_epoch;
    t.peak_pending = false;
  }
  t.last = std::move(row);
  t.last_epoch = epoch_;
}

void DeviceLedgerBuilder::on_sample(std::string_view key, std::uint64_t value, std::uint64_t time_ns,
                                    std::uint64_t reserved, std::uint64_t step, std::uint32_t phase_id) {
  namespace k = nvml_sample;
  if (key == k::kTotal) report_.total_bytes = value;
  else if (key == k::kUsed) used_ = value;
  else if (key == k::kProcesses) processes_ = value;
  else if (key == k::kProcessUsed) process_used_ = value;
  else if (key == k::kModulesLoaded) report_.modules_loaded = value;
  else if (key == k::kModuleBytes) report_.module_bytes = value;
  if (key != k::kReading) return;
  if (process_used_) commit(process_, *process_used_, time_ns, reserved, step, phase_id, value);
  if (used_) commit(device_wide_, *used_, time_ns, reserved, step, phase_id, value);
  const std::uint64_t others = processes_ - std::min<std::uint64_t>(processes_, process_used_ ? 1 : 0);
  report_.other_processes = std::max(report_.other_processes, others);
  used_.reset();
  process_used_.reset();
  processes_ = 0;
}

void DeviceLedgerBuilder::on_metadata(std::string_view key, std::string_view json) {
  if (key != "cupti_source") return;
  std::string error;
  const auto v = parse_json(json, &error);
  if (!v || v->type != JsonValue::Type::Object) {
    cupti_available_ = false;
    cupti_reason_ = "the trace's cupti_source metadata is not a JSON object";
    return;
  }
  const JsonValue* a = v->get("available");
  cupti_available_ = a != nullptr && a->type == JsonValue::Type::Bool && a->boolean;
  cupti_reason_ = v->get_string("reason").value_or("");
}

void DeviceLedgerBuilder::on_peak() {
  for (Group& g : groups_) {
    g.out.bytes_at_peak = g.live;
    g.out.live_at_peak = g.live_count;
  }
  for (Track* t : {&process_, &device_wide_}) {
    if (t->last && t->last_epoch == epoch_) {  // nothing changed on the device since that reading
      t->at_peak = t->last;
      t->at_peak->exact = true;
      t->peak_pending = false;
    } else {
      t->peak_pending = true;
      t->peak_epoch = epoch_;
    }
  }
}

void DeviceLedgerBuilder::describe(OomContext& c, std::uint64_t reserved) const {
  OomContext::Outside o;
  o.itemised = cupti_available_.value_or(false);
  absl::flat_hash_map<std::string, std::uint64_t> by_library;
  for (const Group& g : groups_) {
    if (g.live != 0) by_library[g.out.library] += g.live;
  }
  o.by_library.assign(by_library.begin(), by_library.end());
  std::sort(o.by_library.begin(), o.by_library.end(),
            [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; });
  if (process_.last) {
    o.process_bytes = process_.last->driver_bytes > reserved ? process_.last->driver_bytes - reserved : 0;
    o.context_bytes = process_.context;
  }
  if (o.itemised || o.process_bytes) c.outside = std::move(o);
}

void DeviceLedgerBuilder::finish(std::optional<DeviceLedgerReport>& out) {
  if (device_.type != DeviceType::CUDA) return;
  Track& t = process_.readings > 0 ? process_ : device_wide_;
  if (t.readings == 0 && groups_.empty() && !cupti_available_) return;  // nothing of this kind recorded
  DeviceLedgerReport& r = report_;
  r.available = t.readings > 0;
  if (!r.available) r.reason = "no driver readings for this device (NVML was absent, or not asked for)";
  r.driver_source = t.readings > 0 ? t.source : "";
  r.readings = t.readings;
  r.context_bytes = t.context;
  if (t.peak_pending && t.last) {  // no reading after the peak: the last one stands for it
    t.at_peak = t.last;
    t.at_peak->exact = false;
  }
  r.at_peak = std::move(t.at_peak);
  r.max_driver = std::move(t.max_driver);
  r.last = std::move(t.last);
  r.rows = std::move(t.rows);
  r.rows_dropped = t.rows_dropped;
  r.itemised = cupti_available_.value_or(false);
  if (!r.itemised) {
    r.itemise_reason = cupti_available_ ? cupti_reason_
                                        : "the trace was recorded without the CUPTI source: memory outside "
                                          "PyTorch is not itemised";
  }
  for (Group& g : groups_) {
    if (g.out.allocations == 0) continue;  // every one of them turned out to be PyTorch's
    g.out.end_bytes = g.live;
    r.groups.push_back(std::move(g.out));
  }
  std::sort(r.groups.begin(), r.groups.end(), [](const ExternalGroup& a, const ExternalGroup& b) {
    if (a.max_bytes != b.max_bytes) return a.max_bytes > b.max_bytes;
    return std::tie(a.library, a.api, a.site) < std::tie(b.library, b.api, b.site);
  });
  out = std::move(report_);
}

}  // namespace ridgescope::detail
