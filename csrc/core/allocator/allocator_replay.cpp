// allocator_replay.cpp — a recorded run replayed through the CUDA caching allocator model (see
// include/ridgescope/allocator_model.h "Replay"): a list of allocator actions, or a ridgescope
// trace's alloc, free and segment events, through a fresh AllocatorModel, with the peaks, the
// failures and a bounded timeline of allocated and reserved bytes. `ridgescope whatif` uses it.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "ridgescope/allocator_model.h"
#include "ridgescope/event.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope {

namespace {

// The replay's timeline (ReplayResult::timeline): at most `max_points` buckets of consecutive
// actions; when full, neighbouring buckets are merged and the bucket width doubles, so memory
// stays bounded for any length.
class ReplayTimelineBuilder {
 public:
  explicit ReplayTimelineBuilder(std::size_t max_points) : max_(max_points) {}
  void add(std::uint64_t index, std::uint64_t time_ns, std::uint64_t allocated,
           std::uint64_t reserved) {
    const std::uint64_t bucket = index / width_;
    if (bucket >= points_.size()) {
      points_.push_back({index, time_ns, allocated, reserved});
      if (max_ != 0 && points_.size() > max_) halve();
      return;
    }
    ReplayPoint& p = points_.back();
    p.allocated_bytes = std::max(p.allocated_bytes, allocated);
    p.reserved_bytes = std::max(p.reserved_bytes, reserved);
  }
  std::vector<ReplayPoint> take() { return std::move(points_); }

 private:
  void halve() {
    std::vector<ReplayPoint> merged;
    merged.reserve(points_.size() / 2 + 1);
    for (std::size_t i = 0; i < points_.size(); i += 2) {
      ReplayPoint p = points_[i];
      if (i + 1 < points_.size()) {
        p.allocated_bytes = std::max(p.allocated_bytes, points_[i + 1].allocated_bytes);
        p.reserved_bytes = std::max(p.reserved_bytes, points_[i + 1].reserved_bytes);
      }
      merged.push_back(p);
    }
    points_ = std::move(merged);
    width_ *= 2;
  }
  std::size_t max_;
  std::uint64_t width_ = 1;
  std::vector<ReplayPoint> points_;
};

class Replayer {
 public:
  Replayer(const AllocatorSettings& settings, const ReplayOptions& options)
      : model_(settings), options_(options), timeline_(options.timeline_points) {
    result_.settings = settings;
    model_.record_segment_events(options.keep_segment_events);
  }

  void apply(const AllocatorAction& a) {
    const std::uint64_t index = result_.actions++;
    switch (a.kind) {
      case AllocatorAction::Kind::Alloc: {
        ++result_.allocs;
        if (model_.block_of(a.address).bytes != 0 || failed_.contains(a.address)) {
          // The recording says this address is live again: its free was not recorded.
          ++result_.duplicate_allocs;
          failed_.erase(a.address);
          model_.free(a.address);
        }
        const MallocResult r = model_.malloc(a.address, a.bytes, a.stream);
        if (r.status == MallocStatus::DuplicateId) {
          ++result_.duplicate_allocs;
          model_.free(a.address);
          model_.malloc(a.address, a.bytes, a.stream);
        } else if (!r.ok()) {
          if (result_.failed_allocs++ == 0) result_.first_failure_index = index;
          failed_.insert(a.address);
        }
        break;
      }
      case AllocatorAction::Kind::Free:
        ++result_.frees;
        if (!model_.free(a.address) && !failed_.erase(a.address)) ++result_.unmatched_frees;
        break;
      case AllocatorAction::Kind::EmptyCache:
        model_.empty_cache();
        break;
      case AllocatorAction::Kind::SegmentHint:
        model_.hint_next_segment_address(a.address);
        break;
      case AllocatorAction::Kind::ReleaseSegment:
        model_.release_cached_segment(a.address);
        break;
    }
    const std::uint64_t alloc = model_.allocated_bytes();
    const std::uint64_t res = model_.reserved_bytes();
    if (alloc > last_peak_alloc_) {
      last_peak_alloc_ = alloc;
      result_.peak_allocated_time_ns = a.time_ns;
    }
    if (res > last_peak_res_) {
      last_peak_res_ = res;
      result_.peak_reserved_time_ns = a.time_ns;
    }
    timeline_.add(index, a.time_ns, alloc, res);
  }

  ReplayResult finish() {
    result_.final_stats = model_.stats();
    result_.timeline = timeline_.take();
    if (options_.keep_segment_events) result_.segment_events = model_.segment_events();
    return std::move(result_);
  }
  ReplayResult& result() { return result_; }

 private:
  AllocatorModel model_;
  ReplayOptions options_;
  ReplayTimelineBuilder timeline_;
  ReplayResult result_;
  absl::flat_hash_set<std::uint64_t> failed_;
  std::uint64_t last_peak_alloc_ = 0;
  std::uint64_t last_peak_res_ = 0;
};

}  // namespace

ReplayResult replay_allocator_actions(const std::vector<AllocatorAction>& actions,
                                      const AllocatorSettings& settings,
                                      const ReplayOptions& options) {
  Replayer r(settings, options);
  for (const AllocatorAction& a : actions) r.apply(a);
  return r.finish();
}

ReplayResult replay_trace_through_allocator(const std::string& trace_path,
                                            const AllocatorSettings& settings,
                                            const ReplayOptions& options) {
  TraceReader reader(trace_path);
  Replayer r(settings, options);
  bool have_device = options.device != -2;
  Device device = options.device >= 0 ? Device{DeviceType::CUDA, static_cast<std::int16_t>(options.device)}
                                      : Device{};
  if (!have_device) {  // the first CUDA device seen, else the CPU
    Event e;
    while (reader.next(e)) {
      if ((e.kind == EventKind::Alloc) && e.device.type == DeviceType::CUDA) {
        device = e.device;
        break;
      }
    }
    reader.rewind();
  }
  absl::flat_hash_map<std::uint64_t, std::uint64_t> recorded;  // addr -> recorded bytes
  std::uint64_t recorded_live = 0;
  // What-if replay: a run of recorded segment releases not followed by a segment allocation
  // (which would make it the release-and-retry of a request) is an empty_cache() call.
  bool pending_release = false;
  std::uint64_t pending_time = 0;
  auto flush_release = [&] {
    if (!pending_release) return;
    pending_release = false;
    AllocatorAction a;
    a.kind = AllocatorAction::Kind::EmptyCache;
    a.time_ns = pending_time;
    r.apply(a);
  };
  Event e;
  while (reader.next(e)) {
    if (e.device != device) continue;
    if (!options.use_recorded_segment_addresses) {
      if (e.kind == EventKind::SegmentFree) {
        pending_release = true;
        pending_time = e.time_ns;
        continue;
      }
      if (e.kind == EventKind::SegmentAlloc || e.kind == EventKind::Oom) pending_release = false;
      if (e.kind == EventKind::Alloc || e.kind == EventKind::Free) flush_release();
    }
    if ((e.kind == EventKind::SegmentAlloc || e.kind == EventKind::SegmentFree) &&
        options.use_recorded_segment_addresses) {
      AllocatorAction hint;
      hint.kind = e.kind == EventKind::SegmentAlloc ? AllocatorAction::Kind::SegmentHint
                                                    : AllocatorAction::Kind::ReleaseSegment;
      hint.address = e.addr;
      hint.time_ns = e.time_ns;
      r.apply(hint);
      continue;
    }
    if (e.kind != EventKind::Alloc && e.kind != EventKind::Free) continue;
    AllocatorAction a;
    a.address = e.addr;
    a.stream = e.stream;
    a.time_ns = e.time_ns;
    if (e.kind == EventKind::Alloc) {
      a.kind = AllocatorAction::Kind::Alloc;
      a.bytes = e.requested_bytes != 0 ? e.requested_bytes : e.bytes;
      auto [it, inserted] = recorded.try_emplace(e.addr, e.bytes);
      if (!inserted) {
        recorded_live -= it->second;
        it->second = e.bytes;
      }
      recorded_live += e.bytes;
      r.result().recorded_peak_bytes = std::max(r.result().recorded_peak_bytes, recorded_live);
    } else {
      a.kind = AllocatorAction::Kind::Free;
      auto it = recorded.find(e.addr);
      if (it != recorded.end()) {
        recorded_live -= it->second;
        recorded.erase(it);
      }
    }
    r.apply(a);
  }
  flush_release();
  ReplayResult out = r.finish();
  out.truncated = reader.truncated();
  out.problem = reader.problem();
  return out;
}

}  // namespace ridgescope
