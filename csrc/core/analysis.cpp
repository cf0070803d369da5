// analysis.cpp — trace -> Report in two streaming passes (see ridgescope/analysis.h).
#include "ridgescope/analysis.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "device_ledger.h"
#include "format_bytes.h"
#include "host_ledger.h"
#include "peak_sites.h"
#include "retained.h"
#include "run_summary.h"
#include "ridgescope/forensics.h"
#include "ridgescope/ledger.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope {
namespace {

constexpr std::string_view kAllocatorLiveSample = "allocator_live_bytes";
// The allocator's reserved bytes (CUDA: torch.cuda.memory_reserved()), checked against the
// ledger's reserved bytes in the same consistency counters.
constexpr std::string_view kAllocatorReservedSample = "allocator_reserved_bytes";

enum class PhaseKind : std::uint8_t { Other, Forward, Backward, Recompute, OptimizerStep, ZeroGrad, Compile };

PhaseKind phase_kind(std::string_view name) {
  if (name == "forward") return PhaseKind::Forward;
  if (name == "backward") return PhaseKind::Backward;
  if (name == "recompute") return PhaseKind::Recompute;
  if (name == "optimizer_step") return PhaseKind::OptimizerStep;
  if (name == "zero_grad") return PhaseKind::ZeroGrad;
  if (name == "compile") return PhaseKind::Compile;
  return PhaseKind::Other;
}

// Device and address in one key: user-space addresses fit in 48 bits on every platform torch
// supports, so the device code takes the top 16.
std::uint64_t device_code(Device d) {
  return (static_cast<std::uint64_t>(d.type) << 8) |
         static_cast<std::uint64_t>(static_cast<std::uint8_t>(d.index + 1));
}
std::uint64_t block_key(Device d, std::uint64_t addr) {
  return (device_code(d) << 48) ^ addr;
}
Device device_from_code(std::uint64_t code) {
  Device d;
  d.type = static_cast<DeviceType>(code >> 8);
  d.index = static_cast<std::int16_t>(static_cast<int>(code & 0xFF) - 1);
  return d;
}

// The category a block gets for its whole life, decided in pass 1.
struct Resolved {
  Category category = Category::Unknown;
  bool inferred = false;
  std::uint32_t label_id = 0;
};

// ---------------------------------------------------------------------------------------------
// Pass 1: lifetimes, tags, and the peak of every device.
// ---------------------------------------------------------------------------------------------
class LifetimePass {
 public:
  struct DevicePeak {
    std::uint64_t live = 0, peak = 0, peak_seq = 0;
    bool seen = false;
  };

  void run(TraceReader& reader) {
    Event e;
    while (reader.next(e)) {
      last_seq_ = e.seq;
      last_time_ = e.time_ns;
      switch (e.kind) {
        case EventKind::Alloc: on_alloc(e); break;
        case EventKind::Free: on_free(e); break;
        case EventKind::Tag: on_tag(e); break;
        case EventKind::PhaseBegin: on_phase_begin(e, reader.string(e.string_id)); break;
        case EventKind::PhaseEnd: on_phase_end(e); break;
        default: break;
      }
      ++events_;
    }
    for (auto& [key, pending] : live_) resolve(pending, /*freed=*/false);
    live_.clear();
  }

  const std::vector<Resolved>& resolved() const { return resolved_; }
  const absl::flat_hash_map<std::uint64_t, DevicePeak>& peaks() const { return peaks_; }
  std::uint64_t events() const { return events_; }
  std::uint64_t last_time() const { return last_time_; }

 private:
  struct Instance {
    PhaseKind kind;
    std::uint32_t name_id;
    bool open;
  };
  struct Pending {
    std::uint64_t block_id, alloc_seq, bytes, idle_epoch;
    std::int32_t instance;  // innermost open phase at alloc, -1 when idle
    bool forwardish, in_backward, in_optimizer, in_compile;
    bool has_strong = false, has_weak = false, strong_inferred = false;
    Category strong = Category::Unknown, weak = Category::Unknown;
    std::uint32_t strong_label = 0, weak_label = 0;
  };

  bool stack_has(PhaseKind kind) const {
    for (auto i : stack_) if (instances_[i].kind == kind) return true;
    return false;
  }

  void on_alloc(const Event& e) {
    const std::uint64_t id = next_block_id_++;
    resolved_.emplace_back();
    Pending p{};
    p.block_id = id;
    p.alloc_seq = e.seq;
    p.bytes = e.bytes;
    p.idle_epoch = idle_epoch_;
    p.instance = stack_.empty() ? -1 : static_cast<std::int32_t>(stack_.back());
    p.forwardish = stack_has(PhaseKind::Forward) || stack_has(PhaseKind::Recompute);
    p.in_backward = stack_has(PhaseKind::Backward);
    p.in_optimizer = stack_has(PhaseKind::OptimizerStep);
    p.in_compile = stack_has(PhaseKind::Compile);
    auto [it, inserted] = live_.try_emplace(block_key(e.device, e.addr), p);
    auto& peak = peaks_[device_code(e.device)];
    if (!inserted) {  // a missed free: the old block ends here
      peak.live -= it->second.bytes;
      resolve(it->second, /*freed=*/false);
      it->second = p;
    }
    peak.seen = true;
    peak.live += e.bytes;
    if (peak.live > peak.peak) {
      peak.peak = peak.live;
      peak.peak_seq = e.seq;
    }
  }

  void on_free(const Event& e) {
    auto it = live_.find(block_key(e.device, e.addr));
    if (it == live_.end()) return;
    peaks_[device_code(e.device)].live -= it->second.bytes;
    resolve(it->second, /*freed=*/true);
    live_.erase(it);
  }

  void on_tag(const Event& e) {
    auto it = live_.find(block_key(e.device, e.addr));
    if (it == live_.end()) return;
    Pending& p = it->second;
    if ((e.flags & kTagWeak) == 0) {
      if (!p.has_strong) {
        p.has_strong = true;
        p.strong = e.category;
        p.strong_label = e.string_id;
        p.strong_inferred = (e.flags & kTagInferred) != 0 && e.category != Category::Unknown;
      }
    } else if (!p.has_weak) {
      p.has_weak = true;
      p.weak = e.category;
      p.weak_label = e.string_id;
      // A tensor saved for backward that existed before the current forward began is an input
      // of that forward (the batch, the targets), not an activation it produced.
      if (p.weak == Category::Activation && have_forward_ && p.alloc_seq < last_forward_begin_seq_) {
        p.weak = Category::Input;
        p.weak_label = 0;  // the saver's label ("activation saved in ...") would mislead
      }
    }
  }

  void on_phase_begin(const Event& e, std::string_view name) {
    if (stack_.empty()) ++idle_epoch_;
    const PhaseKind kind = phase_kind(name);
    if (kind == PhaseKind::Forward || kind == PhaseKind::Recompute) {
      have_forward_ = true;
      last_forward_begin_seq_ = e.seq;
    }
    instances_.push_back(Instance{kind, e.string_id, true});
    stack_.push_back(static_cast<std::uint32_t>(instances_.size() - 1));
  }

  void on_phase_end(const Event& e) {
    for (std::size_t i = stack_.size(); i-- > 0;) {
      if (instances_[stack_[i]].name_id == e.string_id) {
        for (std::size_t j = i; j < stack_.size(); ++j) instances_[stack_[j]].open = false;
        stack_.resize(i);
        if (stack_.empty()) ++idle_epoch_;
        return;
      }
    }
  }

  // Decides a block's category for its whole life, in the order of docs/categories.md.
  void resolve(const Pending& p, bool freed) {
    Resolved& r = resolved_[p.block_id];
    if (p.has_strong) {
      r = Resolved{p.strong, p.strong_inferred, p.strong_label};
      return;
    }
    if (p.has_weak) {
      r = Resolved{p.weak, false, p.weak_label};
      return;
    }
    r.inferred = true;
    if (freed) {
      const bool same_idle = p.instance < 0 && stack_.empty() && p.idle_epoch == idle_epoch_;
      const bool same_phase = p.instance >= 0 && instances_[p.instance].open;
      if (same_idle || same_phase) {
        r.category = Category::Temporary;
        return;
      }
      // Made in forward (or in a recomputation, or between forward and backward, where the
      // loss is computed) and freed by backward: what autograd saved.
      if ((p.forwardish || (p.instance < 0 && have_forward_)) && stack_has(PhaseKind::Backward)) {
        r.category = Category::Activation;
        return;
      }
    }
    if (p.in_compile) {
      // Made while torch.compile compiled and kept after it: the compiled code's own constants
      // (Inductor's lifted scalar tensors), persistent like a module's buffers.
      r.category = Category::Buffer;
    } else if (p.in_backward && !p.forwardish) {
      r.category = Category::Gradient;
    } else if (p.in_optimizer) {
      r.category = Category::OptimizerState;
    } else {
      r.category = Category::Unknown;
      r.inferred = false;
    }
  }

  absl::flat_hash_map<std::uint64_t, Pending> live_;
  absl::flat_hash_map<std::uint64_t, DevicePeak> peaks_;
  std::vector<Resolved> resolved_;
  std::vector<Instance> instances_;
  std::vector<std::uint32_t> stack_;
  std::uint64_t next_block_id_ = 0;
  std::uint64_t idle_epoch_ = 0;
  std::uint64_t last_forward_begin_seq_ = 0;
  bool have_forward_ = false;
  std::uint64_t events_ = 0;
  std::uint64_t last_seq_ = 0;
  std::uint64_t last_time_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Live bytes over time in a bounded number of columns (Report::timeline). Every state change is
// observed, so each column's minimum and maximum are exact; a column starts from the state
// carried into it, and columns no event touches carry it unchanged.
// ---------------------------------------------------------------------------------------------
class TimelineBuilder {
 public:
  TimelineBuilder(Timeline& out, std::uint64_t end_time_ns, std::size_t max_columns) : out_(out) {
    // [0, end_time_ns] inclusive (a hostile trace's last time may be the largest value)
    const std::uint64_t span = end_time_ns == UINT64_MAX ? end_time_ns : end_time_ns + 1;
    const std::uint64_t n = std::max<std::uint64_t>(1, max_columns);
    out_.end_time_ns = end_time_ns;
    out_.column_ns = std::max<std::uint64_t>(1, span / n + (span % n != 0));
    out_.columns.assign(static_cast<std::size_t>(span / out_.column_ns + (span % out_.column_ns != 0)), {});
  }

  // The state just changed (at time_ns) to these live and reserved bytes.
  void observe(std::uint64_t time_ns, std::uint64_t live, std::uint64_t reserved, const CategoryBytes& by_category) {
    advance_to(time_ns);
    TimelineColumn& c = out_.columns[current_];
    ++c.changes;
    if (live > c.max_bytes) {
      c.max_bytes = live;
      c.max_time_ns = time_ns;
      c.max_by_category = by_category;
    }
    c.min_bytes = std::min(c.min_bytes, live);
    c.reserved_bytes = std::max(c.reserved_bytes, reserved);
    live_ = live;
    reserved_ = reserved;
    by_category_ = by_category;
  }

  // Columns after the last change carry the final state.
  void finish() {
    fill(current_ + 1, out_.columns.size());
  }

 private:
  void advance_to(std::uint64_t time_ns) {
    const std::size_t last = out_.columns.size() - 1;
    const std::size_t col = std::min<std::uint64_t>(last, time_ns / out_.column_ns);
    if (!started_) {  // before the first change nothing is live
      started_ = true;
      fill(0, col + 1);
      current_ = col;
      return;
    }
    if (col <= current_) return;  // same column (or a time that went backwards)
    fill(current_ + 1, col + 1);
    current_ = col;
  }

  void fill(std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) {
      TimelineColumn& c = out_.columns[i];
      c.min_bytes = c.max_bytes = live_;
      c.max_time_ns = i * out_.column_ns;
      c.reserved_bytes = reserved_;
      c.max_by_category = by_category_;
    }
  }

  Timeline& out_;
  std::size_t current_ = 0;
  bool started_ = false;
  std::uint64_t live_ = 0, reserved_ = 0;
  CategoryBytes by_category_{};
};

// ---------------------------------------------------------------------------------------------
// Pass 2: replay one device with resolved categories and gather the report.
// ---------------------------------------------------------------------------------------------
class ReplayPass {
 public:
  ReplayPass(const TraceReader& reader, const std::vector<Resolved>& resolved, Device device,
             std::uint64_t peak_seq, bool has_peak, std::uint64_t end_time_ns,
             const AnalysisOptions& options, Report& report)
      : reader_(reader), resolved_(resolved), device_(device), peak_seq_(peak_seq),
        has_peak_(has_peak), options_(options), report_(report),
        timeline_(report.timeline, end_time_ns, options.timeline_columns),
        frames_(reader, report.frames), device_ledger_(reader, device) {
  }

  void run(TraceReader& reader) {
    Event e;
    while (reader.next(e)) {
      if (e.kind != EventKind::String && e.kind != EventKind::Metadata) {
        sample_dashboards(e.time_ns);
        now_ns_ = e.time_ns;
      }
      switch (e.kind) {
        case EventKind::Alloc: on_alloc(e); break;
        case EventKind::Free:
          if (e.device == device_) on_free(e);
          break;
        case EventKind::Tag:
          if (e.device == device_) on_tag(e);
          break;
        case EventKind::SegmentAlloc:
          if (e.device == device_) {
            ledger_.on_segment_alloc(e.addr, e.bytes);
            device_ledger_.on_segment(true, e.addr, e.bytes);
            observe_timeline();
          }
          break;
        case EventKind::SegmentFree:
          if (e.device == device_) {
            ledger_.on_segment_free(e.addr);
            device_ledger_.on_segment(false, e.addr, e.bytes);
            observe_timeline();
          }
          break;
        case EventKind::ExternalAlloc:
        case EventKind::ExternalFree:
          if (e.device == device_) on_external(e);
          break;
        case EventKind::PhaseBegin: on_phase_begin(e); break;
        case EventKind::PhaseEnd: on_phase_end(e); break;
        case EventKind::Step: on_step(e); break;
        case EventKind::Oom:
          if (e.device == device_) on_oom(e);
          break;
        case EventKind::Sample:
          on_layer_sample(e);
          if (e.device == device_) on_sample(e);
          break;
        case EventKind::Metadata:
          device_ledger_.on_metadata(reader.string(e.string_id), e.text);
          on_metadata(std::string(reader.string(e.string_id)), e.text);
          break;
        case EventKind::String:
        case EventKind::Frame:
        case EventKind::Stack: break;  // absorbed into the reader's tables
      }
      last_time_ = e.time_ns;
    }
    finish();
  }

 private:
  std::string phase_name(std::uint32_t id) const {
    const auto s = reader_.string(id);
    return s.empty() ? std::string("idle") : std::string(s);
  }

  StepStats& step_stats() {
    if (!step_open_) {
      step_open_ = true;
      StepStats s;
      s.step = current_step_;
      s.begin_time_ns = s.end_time_ns = now_ns_;
      s.start_bytes = s.peak_bytes = ledger_.live_bytes();
      s.peak_by_category = ledger_.by_category();
      report_.steps.push_back(std::move(s));
    }
    return report_.steps.back();
  }

  PhaseStats& phase_at(std::size_t i) {
    const auto& ref = open_phases_[i];
    return report_.steps[ref.first].phases[ref.second];
  }

  void observe_timeline() {
    timeline_.observe(now_ns_, ledger_.live_bytes(), ledger_.reserved_bytes(), ledger_.by_category());
  }

  void observe_growth(const Event& e) {
    observe_timeline();
    const std::uint64_t live = ledger_.live_bytes();
    StepStats& s = step_stats();
    if (live > s.peak_bytes) {
      s.peak_bytes = live;
      s.peak_by_category = ledger_.by_category();
    }
    for (std::size_t i = 0; i < open_phases_.size(); ++i) {
      PhaseStats& p = phase_at(i);
      if (live > p.peak_bytes) {
        p.peak_bytes = live;
        p.peak_time_ns = e.time_ns;
        p.peak_by_category = ledger_.by_category();
      }
    }
    if (has_peak_ && e.seq == peak_seq_) capture_peak(e);
  }

  void on_alloc(const Event& e) {
    const std::uint64_t id = next_block_id_++;
    if (e.device != device_) return;
    ++report_.allocations;
    step_stats();  // open the step first, so its start_bytes exclude this block
    const Resolved& r = id < resolved_.size() ? resolved_[id] : kUnknown;
    LiveBlock b;
    b.bytes = e.bytes;
    b.requested_bytes = e.requested_bytes;
    b.block_id = id;
    b.label_id = r.label_id;
    b.alloc_phase_id = phase_stack_.empty() ? 0 : phase_stack_.back();
    b.context_id = e.string_id;
    b.stack_id = e.stack_id;
    b.category = r.category;
    if (const LiveBlock* old = ledger_.find(e.addr)) retention_.on_free(old->block_id);  // a missed free
    ledger_.on_alloc(e.addr, b);
    retention_.on_alloc(id, frames_.site_of_stack(e.stack_id), r.category, e.bytes, e.seq);
    alloc_step_[id] = current_step_;
    for (std::size_t i = 0; i < open_phases_.size(); ++i) {
      PhaseStats& p = phase_at(i);
      p.allocated_bytes += e.bytes;
      ++p.allocations;
    }
    observe_growth(e);
  }

  void on_free(const Event& e) {
    step_stats();
    const auto block = ledger_.on_free(e.addr);
    if (!block) return;
    observe_timeline();
    ++report_.frees;
    alloc_step_.erase(block->block_id);
    retention_.on_free(block->block_id);
    for (std::size_t i = 0; i < open_phases_.size(); ++i) phase_at(i).freed_bytes += block->bytes;
  }

  void on_tag(const Event& e) {
    ++report_.tags;
    const LiveBlock* b = ledger_.find(e.addr);
    if (b == nullptr) {
      ledger_.set_category(e.addr, e.category, e.string_id);  // counts the unknown address
      return;
    }
    if (e.flags & kTagWeak) return;  // weak tags were settled in pass 1
    if (b->category != e.category || (e.string_id != 0 && b->label_id != e.string_id)) {
      ledger_.set_category(e.addr, e.category, e.string_id);
    }
  }

  void on_phase_begin(const Event& e) {
    StepStats& s = step_stats();
    PhaseStats p;
    p.phase = phase_name(e.string_id);
    p.parent = phase_stack_.empty() ? std::string() : phase_name(phase_stack_.back());
    p.depth = static_cast<std::uint32_t>(phase_stack_.size());
    p.step = current_step_;
    p.index = occurrences_[e.string_id]++;
    p.complete = false;
    p.begin_time_ns = p.peak_time_ns = e.time_ns;
    p.start_bytes = p.peak_bytes = ledger_.live_bytes();
    p.start_by_category = p.peak_by_category = ledger_.by_category();
    s.phases.push_back(std::move(p));
    open_phases_.emplace_back(report_.steps.size() - 1, s.phases.size() - 1);
    phase_stack_.push_back(e.string_id);
  }

  void close_phase(std::size_t i, std::uint64_t time_ns, bool complete) {
    PhaseStats& p = phase_at(i);
    if (complete && p.phase == "optimizer_step") completed_optimizer_step_ = true;
    p.complete = complete;
    p.end_time_ns = time_ns;
    report_.timeline.phases.push_back({p.phase, p.step, p.depth, p.begin_time_ns, time_ns});
    p.end_bytes = ledger_.live_bytes();
    p.end_by_category = ledger_.by_category();
  }

  void on_phase_end(const Event& e) {
    for (std::size_t i = phase_stack_.size(); i-- > 0;) {
      if (phase_stack_[i] == e.string_id) {
        for (std::size_t j = phase_stack_.size(); j-- > i;) close_phase(j, e.time_ns, true);
        phase_stack_.resize(i);
        open_phases_.resize(i);
        return;
      }
    }
  }

  void on_step(const Event& e) {
    StepStats& s = step_stats();
    s.end_bytes = ledger_.live_bytes();
    s.end_by_category = ledger_.by_category();
    s.end_time_ns = e.time_ns;
    report_.timeline.step_ends.emplace_back(e.value, e.time_ns);
    retention_.on_step_end(e.value);
    step_open_ = false;
    current_step_ = e.value + 1;
    occurrences_.clear();
  }

  // The ledgers beside the composition (ridgescope/memory_layers.h): host samples of the CPU
  // (whatever device is reported) and driver readings of the reported device.
  std::uint32_t current_phase_id() const { return phase_stack_.empty() ? 0 : phase_stack_.back(); }
  void on_layer_sample(const Event& e) {
    const std::string_view key = reader_.string(e.string_id);
    if (e.device.type == DeviceType::CPU && key.substr(0, 5) == "host_") {
      host_ledger_.on_sample(key, e.value, e.time_ns, current_step_, phase_name(current_phase_id()));
    } else if (e.device == device_) {
      device_ledger_.on_sample(key, e.value, e.time_ns, ledger_.reserved_bytes(), current_step_, current_phase_id());
    }
  }
  void on_external(const Event& e) {
    const std::string site = e.kind == EventKind::ExternalAlloc ? frames_.site_text(frames_.site_of_stack(e.stack_id))
                                                                : std::string();
    device_ledger_.on_external(e, site, current_step_, current_phase_id());
  }

  void on_oom(const Event& e) {
    OomContext c;
    c.request_bytes = e.bytes;
    c.live_bytes = ledger_.live_bytes();
    c.reserved_bytes = ledger_.reserved_bytes();
    c.device_free_bytes = e.value;
    c.by_category = ledger_.by_category();
    c.phase = phase_stack_.empty() ? std::string("idle") : phase_name(phase_stack_.back());
    c.step = current_step_;
    for (std::size_t i = open_phases_.size(); i-- > 0;) {
      const PhaseStats& p = phase_at(i);
      if (p.phase != "optimizer_step") continue;
      c.first_optimizer_step = !completed_optimizer_step_;
      const auto k = category_index(Category::OptimizerState);
      c.optimizer_state_created = ledger_.by_category()[k] - std::min(ledger_.by_category()[k], p.start_by_category[k]);
      break;
    }
    c.free = current_free_space();
    device_ledger_.describe(c, c.reserved_bytes);
    oom_contexts_.push_back(c);
    OomRecord o;
    o.free = c.free;
    o.request_bytes = e.bytes;
    o.device_free_bytes = e.value;
    o.step = current_step_;
    o.phase = phase_stack_.empty() ? std::string("idle") : phase_name(phase_stack_.back());
    o.time_ns = e.time_ns;
    report_.timeline.oom_times_ns.push_back(e.time_ns);
    o.live_bytes = ledger_.live_bytes();
    o.reserved_bytes = ledger_.reserved_bytes();
    o.by_category = ledger_.by_category();
    report_.ooms.push_back(std::move(o));
  }

  // The gaps between live blocks inside the reserved segments now.
  FreeSpace current_free_space() const {
    std::vector<AddressRange> segments, blocks;
    ledger_.for_each_segment([&](std::uint64_t addr, std::uint64_t bytes) { segments.push_back({addr, bytes}); });
    if (!segments.empty()) {
      ledger_.for_each_live([&](std::uint64_t addr, const LiveBlock& b) { blocks.push_back({addr, b.bytes}); });
    }
    return free_space(std::move(segments), std::move(blocks));
  }

  void on_sample(const Event& e) {
    const std::string_view name = reader_.string(e.string_id);
    if (name == "nvml_used_bytes") {
      DriverView& d = report_.driver_view;
      ++d.samples;
      d.max_used_bytes = std::max(d.max_used_bytes, e.value);
      const std::uint64_t reserved = ledger_.reserved_bytes();
      if (e.value > reserved) d.max_non_pytorch_bytes = std::max(d.max_non_pytorch_bytes, e.value - reserved);
      return;
    }
    if (name == "nvml_process_used_bytes") {
      ++report_.driver_view.process_samples;
      report_.driver_view.max_process_used_bytes = std::max(report_.driver_view.max_process_used_bytes, e.value);
      return;
    }
    if (name == "nvml_total_bytes") {
      report_.driver_view.total_bytes = e.value;
      return;
    }
    if (name != kAllocatorLiveSample && name != kAllocatorReservedSample) return;
    const std::uint64_t ours =
        name == kAllocatorLiveSample ? ledger_.live_bytes() : ledger_.reserved_bytes();
    auto& c = report_.consistency;
    ++c.samples;
    if (e.value != ours) {
      if (c.mismatches == 0) {
        // ours - reading, saturated: a corrupt reading may be near 2^64
        const std::uint64_t d = ours > e.value ? ours - e.value : e.value - ours;
        const std::int64_t magnitude = static_cast<std::int64_t>(std::min<std::uint64_t>(d, INT64_MAX));
        c.first_difference_bytes = ours > e.value ? magnitude : d > INT64_MAX ? INT64_MIN : -magnitude;
        c.first_mismatch_seq = e.seq;
      }
      ++c.mismatches;
    }
  }

  // A key recorded again replaces the earlier value (the last one wins), keeping first order.
  void on_metadata(std::string key, std::string_view text) {
    for (auto& [k, v] : report_.metadata) {
      if (k == key) {
        v.assign(text.data(), text.size());
        return;
      }
    }
    report_.metadata.emplace_back(std::move(key), std::string(text));
  }

  // The label of a block no tag named: its category and the module that made it, or the phase
  // when no module was running.
  std::string fallback_label(const LiveBlock& b) const {
    if (b.context_id != 0) {
      return std::string(category_name(b.category)) + " in " + std::string(reader_.string(b.context_id));
    }
    return std::string(category_name(b.category)) + " allocated in " + phase_name(b.alloc_phase_id);
  }

  void capture_peak(const Event& e) {
    PeakInfo& peak = report_.peak;
    peak.bytes = ledger_.live_bytes();
    peak.reserved_bytes = ledger_.reserved_bytes();
    peak.step = current_step_;
    peak.phase = phase_stack_.empty() ? std::string("idle") : phase_name(phase_stack_.back());
    for (auto id : phase_stack_) peak.phase_stack.push_back(phase_name(id));
    peak.time_ns = e.time_ns;
    peak.seq = e.seq;
    peak.by_category = ledger_.by_category();

    peak.free = current_free_space();
    host_ledger_.on_peak(e.time_ns);
    device_ledger_.on_peak();
    std::vector<std::pair<std::uint64_t, const LiveBlock*>> blocks;
    blocks.reserve(ledger_.live_blocks());
    // Labelled blocks group by label; unlabelled ones by what their fallback label names: the
    // module that made them, else the phase.
    absl::flat_hash_map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t, Category>, LabelBytes> labels;
    ledger_.for_each_live([&](std::uint64_t addr, const LiveBlock& b) {
      blocks.emplace_back(addr, &b);
      if (id_inferred(b.block_id)) peak.inferred_by_category[category_index(b.category)] += b.bytes;
      const bool named = b.label_id != 0;
      auto& l = labels[{b.label_id, named ? 0u : b.context_id,
                        named || b.context_id ? 0u : b.alloc_phase_id, b.category}];
      l.category = b.category;
      l.bytes += b.bytes;
      ++l.blocks;
      if (l.label.empty()) l.label = b.label_id ? std::string(reader_.string(b.label_id)) : fallback_label(b);
    });
    auto by_size = [](const auto& a, const auto& b) {
      if (a.second->bytes != b.second->bytes) return a.second->bytes > b.second->bytes;
      return a.second->block_id < b.second->block_id;
    };
    const std::size_t n = std::min(options_.top_blocks, blocks.size());
    std::partial_sort(blocks.begin(), blocks.begin() + n, blocks.end(), by_size);
    for (std::size_t i = 0; i < n; ++i) {
      const LiveBlock& b = *blocks[i].second;
      TopBlock t;
      t.bytes = b.bytes;
      t.category = b.category;
      t.inferred = id_inferred(b.block_id);
      t.label = b.label_id ? std::string(reader_.string(b.label_id)) : fallback_label(b);
      t.phase_allocated = phase_name(b.alloc_phase_id);
      t.module = std::string(reader_.string(b.context_id));
      auto it = alloc_step_.find(b.block_id);
      t.step_allocated = it == alloc_step_.end() ? 0 : it->second;
      t.address = blocks[i].first;
      const std::uint32_t site = frames_.site_of_stack(b.stack_id);
      t.site = frames_.site_text(site);
      t.site_frame = frames_.index(site);
      peak.top_blocks.push_back(std::move(t));
    }
    detail::collect_peak_sites(ledger_, frames_, options_.top_sites, options_.max_stacks, peak);
    for (auto& [key, l] : labels) peak.by_label.push_back(std::move(l));
    std::sort(peak.by_label.begin(), peak.by_label.end(), [](const LabelBytes& a, const LabelBytes& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.label < b.label;
    });
    if (peak.by_label.size() > options_.top_labels) peak.by_label.resize(options_.top_labels);
  }

  bool id_inferred(std::uint64_t id) const { return id < resolved_.size() && resolved_[id].inferred; }

  void finish() {
    for (std::size_t j = open_phases_.size(); j-- > 0;) close_phase(j, last_time_, false);
    open_phases_.clear();
    if (step_open_) {
      StepStats& s = report_.steps.back();
      s.end_bytes = ledger_.live_bytes();
      s.end_by_category = ledger_.by_category();
      s.end_time_ns = last_time_;
      s.complete = false;
      // A trailing step with nothing in it (the loop ended right after a step) says nothing.
      if (s.phases.empty() && s.peak_bytes == s.start_bytes) report_.steps.pop_back();
    }
    report_.final_live_bytes = ledger_.live_bytes();
    report_.final_reserved_bytes = ledger_.reserved_bytes();
    report_.final_by_category = ledger_.by_category();
    report_.anomalies = ledger_.anomalies();
    report_.retained = retention_.result(frames_);
    host_ledger_.finish(report_.host_memory);
    device_ledger_.finish(report_.device_ledger);
    timeline_.finish();
    // Phases were recorded as they closed (inner ones first); draw them in order of beginning.
    std::stable_sort(report_.timeline.phases.begin(), report_.timeline.phases.end(),
                     [](const TimelinePhase& a, const TimelinePhase& b) {
                       return a.begin_time_ns != b.begin_time_ns ? a.begin_time_ns < b.begin_time_ns
                                                                 : a.depth < b.depth;
                     });
  }

  static inline const Resolved kUnknown{};
  const TraceReader& reader_;
  const std::vector<Resolved>& resolved_;
  const Device device_;
  const std::uint64_t peak_seq_;
  const bool has_peak_;
  const AnalysisOptions& options_;
  Report& report_;
  TimelineBuilder timeline_;
  detail::FrameTable frames_;           // the report's frames (sites, stacks, verdicts)
  detail::RetentionDetector retention_;  // tensors kept across steps
  detail::HostLedgerBuilder host_ledger_;      // the resident set in three layers
  detail::DeviceLedgerBuilder device_ledger_;  // the driver's figure, reconciled
  std::uint64_t now_ns_ = 0;  // time of the last timed event
  Ledger ledger_;
  std::uint64_t next_block_id_ = 0;
  std::uint64_t current_step_ = 0;
  bool step_open_ = false;
  std::uint64_t last_time_ = 0;
  std::vector<std::uint32_t> phase_stack_;
  std::vector<std::pair<std::size_t, std::size_t>> open_phases_;  // (step index, phase index)
  absl::flat_hash_map<std::uint32_t, std::uint32_t> occurrences_;  // per phase name, this step
  absl::flat_hash_map<std::uint64_t, std::uint64_t> alloc_step_;   // live block id -> step
  bool completed_optimizer_step_ = false;

 public:
  std::vector<OomContext> oom_contexts_;  // one per report.ooms entry, explained after the run

 private:
  // Dashboards: the live bytes a sampler would read every period (15 s and 30 s).
  struct Sampler {
    std::uint64_t period_ns, next_ns, samples = 0, max = 0;
    bool exhausted = false;  // next_ns would pass UINT64_MAX
  };
  std::vector<Sampler> samplers_;
  bool sampling_started_ = false;

  // The state as of the last event at or before the probe instant.
  void take_probe() {
    Report::Probe p;
    p.time_ns = *options_.probe_time_ns;
    p.live_bytes = ledger_.live_bytes();
    p.reserved_bytes = ledger_.reserved_bytes();
    p.free = current_free_space();
    report_.probe = p;
  }

  void sample_dashboards(std::uint64_t now_ns) {
    if (!sampling_started_) {
      sampling_started_ = true;
      for (std::uint64_t period : {15'000'000'000ull, 30'000'000'000ull}) samplers_.push_back({period, now_ns});
    }
    if (options_.probe_time_ns && !report_.probe && now_ns > *options_.probe_time_ns) take_probe();
    for (Sampler& s : samplers_) {
      if (s.exhausted || now_ns < s.next_ns) continue;
      // Every sampling instant up to now reads the state as of just before this event. Counted,
      // not looped: a corrupt trace may jump its clock by centuries (or to near 2^64, where
      // stepping next_ns would wrap around and never pass now_ns).
      const std::uint64_t due = (now_ns - s.next_ns) / s.period_ns + 1;
      s.samples += due;
      s.max = std::max(s.max, ledger_.live_bytes());
      if (due > (UINT64_MAX - s.next_ns) / s.period_ns) {
        s.exhausted = true;  // the next instant is past the end of the clock
      } else {
        s.next_ns += due * s.period_ns;
      }
    }
  }

 public:
  void finish_dashboards() {
    if (options_.probe_time_ns && !report_.probe) take_probe();  // after the last event
    for (const Sampler& s : samplers_) report_.dashboards.push_back({s.period_ns, s.samples, s.max});
  }
};

void add_warnings(Report& report) {
  if (report.trace.truncated) {
    report.warnings.push_back({"truncated_trace",
                               "The trace is incomplete: " + report.trace.problem +
                                   ". The report covers the readable prefix.",
                               0, 0});
  }
  for (std::size_t si = 0; si < report.steps.size(); ++si) {
    const StepStats& s = report.steps[si];
    bool found = false;
    for (const PhaseStats& p : s.phases) {
      if (p.phase != "optimizer_step") continue;
      const auto i = category_index(Category::OptimizerState);
      if (p.end_by_category[i] <= p.start_by_category[i]) continue;
      const std::uint64_t created = p.end_by_category[i] - p.start_by_category[i];
      std::string message = "The optimizer step of step " + std::to_string(p.step) +
                            " created " + detail::format_bytes(created) +
                            " of optimizer state lazily (it did not exist before that step).";
      if (si + 1 < report.steps.size() && report.steps[si + 1].complete &&
          report.steps[si + 1].peak_bytes > s.peak_bytes) {
        const StepStats& next = report.steps[si + 1];
        message += " From then on it is live during forward and backward as well: step " +
                   std::to_string(next.step) + " peaks at " + detail::format_bytes(next.peak_bytes) +
                   " against " + detail::format_bytes(s.peak_bytes) + " for step " +
                   std::to_string(s.step) + ".";
      }
      message += " A run that fits its first forward and backward can still run out of memory "
                 "at the first optimizer step or in the step after it: size memory for the "
                 "steady state.";
      report.warnings.push_back({"lazy_optimizer_state", std::move(message), created, p.step});
      found = true;
      break;
    }
    if (found) break;
  }
  if (report.retained) {
    const Verdict& v = report.retained->verdict;
    std::string message = v.summary;
    if (!v.remedies.empty()) {
      std::string action = v.remedies.front().action;
      if (!action.empty() && action[0] >= 'A' && action[0] <= 'Z') action[0] = static_cast<char>(action[0] - 'A' + 'a');
      message += " Remedy: " + action + ".";
    }
    report.warnings.push_back({"retained_tensors", std::move(message), report.retained->growth_per_step_bytes,
                               report.retained->since_step});
  }
  if (report.consistency.mismatches > 0) {
    report.warnings.push_back(
        {"ledger_mismatch",
         std::to_string(report.consistency.mismatches) + " of " +
             std::to_string(report.consistency.samples) +
             " allocator readings disagreed with the replayed ledger (first difference " +
             std::to_string(report.consistency.first_difference_bytes) + " bytes).",
         0, 0});
  }
}

}  // namespace

Report analyze_trace(const std::string& path, const AnalysisOptions& options) {
  TraceReader reader(path);
  LifetimePass lifetimes;
  lifetimes.run(reader);

  Report report;
  report.trace.path = path;
  report.trace.file_bytes = reader.file_bytes();
  report.trace.format_version = reader.version();
  report.trace.events = lifetimes.events();
  report.trace.skipped_records = reader.skipped_records();
  report.trace.truncated = reader.truncated();
  report.trace.truncated_at = reader.truncated_at();
  report.trace.problem = reader.problem();
  report.trace.duration_ns = lifetimes.last_time();

  // The device to report: the one asked for, else the one with the highest peak.
  Device device;
  std::uint64_t best = 0;
  bool has_peak = false;
  std::uint64_t peak_seq = 0;
  std::vector<std::pair<std::uint64_t, LifetimePass::DevicePeak>> peaks(lifetimes.peaks().begin(),
                                                                          lifetimes.peaks().end());
  std::sort(peaks.begin(), peaks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [code, peak] : peaks) {
    report.devices_seen.push_back(device_from_code(code));
    const Device d = device_from_code(code);
    if (options.device ? d == *options.device : (!has_peak || peak.peak > best)) {
      device = d;
      best = peak.peak;
      has_peak = peak.peak > 0;
      peak_seq = peak.peak_seq;
    }
  }
  if (options.device) device = *options.device;
  report.device = device;

  reader.rewind();
  ReplayPass replay(reader, lifetimes.resolved(), device, peak_seq, has_peak, lifetimes.last_time(),
                    options, report);
  replay.run(reader);
  replay.finish_dashboards();
  add_warnings(report);
  detail::summarise_run(report);
  // The verdicts need the device capacity, which the run's metadata gives.
  for (std::size_t i = 0; i < report.ooms.size() && i < replay.oom_contexts_.size(); ++i) {
    OomContext& c = replay.oom_contexts_[i];
    c.capacity_bytes = report.device_capacity_bytes;
    report.ooms[i].verdict = explain_oom(c);
  }
  return report;
}

std::vector<BlockAttribution> attribute_blocks(const std::string& path) {
  TraceReader reader(path);
  LifetimePass lifetimes;
  lifetimes.run(reader);
  std::vector<BlockAttribution> out;
  out.reserve(lifetimes.resolved().size());
  for (const Resolved& r : lifetimes.resolved()) out.push_back({r.category, r.inferred, r.label_id});
  return out;
}

}  // namespace ridgescope
