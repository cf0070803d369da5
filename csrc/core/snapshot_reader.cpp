// snapshot_reader.cpp — a torch memory snapshot pickle -> ridgescope events -> the normal
// analysis (see ridgescope/snapshot.h and docs/snapshot.md).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "pickle_reader.h"
#include "snapshot_sink.h"
#include "snapshot_stacks.h"
#include "snapshot_replay.h"
#include "ridgescope/cuda_trace.h"
#include "ridgescope/recorder.h"
#include "ridgescope/snapshot.h"

namespace ridgescope {
namespace {

using detail::PickleValue;

[[noreturn]] void content_error(const std::string& message) {
  throw SnapshotError("not a usable torch memory snapshot: " + message, 0);
}

std::string type_of(const PickleValue& v) { return std::string(detail::pickle_type_name(v.type)); }

enum class Action : std::uint8_t {
  Alloc, FreeRequested, FreeCompleted, SegmentAlloc, SegmentFree, SegmentMap, SegmentUnmap, Oom, Annotate, Other
};

Action parse_action(std::string_view a) {
  if (a == "alloc") return Action::Alloc;
  if (a == "free_requested") return Action::FreeRequested;
  if (a == "free_completed" || a == "free") return Action::FreeCompleted;  // "free": legacy
  if (a == "segment_alloc") return Action::SegmentAlloc;
  if (a == "segment_free") return Action::SegmentFree;
  if (a == "segment_map") return Action::SegmentMap;      // expandable segments
  if (a == "segment_unmap") return Action::SegmentUnmap;
  if (a == "oom") return Action::Oom;
  if (a == "annotate") return Action::Annotate;
  return Action::Other;  // "snapshot" and actions of newer torch versions
}

using Frame = detail::SnapshotFrame;
const std::vector<Frame> kNoFrames;

struct Entry {
  Action action = Action::Other;
  std::uint64_t addr = 0, size = 0, stream = 0, time_us = 0, device_free = 0;
  std::optional<std::uint64_t> block_size;  // ridgescope exports: the block's exact bytes
  bool legacy_free = false;                 // old snapshots' "free": no free_requested before it
  const std::vector<Frame>* frames = &kNoFrames;  // owned by the converter's FramesCache
  std::optional<std::string_view> category;
  std::string_view phase, label, module;  // from a dict user_metadata
  std::optional<bool> category_inferred;
  bool outside = false;  // a ridgescope export's memory outside PyTorch (not the allocator's)
};

// ridgescope's exports mark device memory allocated outside PyTorch (its own segments, category
// non_pytorch, for memory_viz; snapshot_writer.cpp): it is not the allocator's, so it is skipped.
bool outside_pytorch(const PickleValue& v) {
  const PickleValue* m = v.is_dict() ? v.get("ridgescope_outside_pytorch") : nullptr;
  return m != nullptr && m->type == PickleValue::Type::Bool && m->boolean;
}

// The items (entries, frames, blocks) the replay may visit. The pickle reader shares a container
// that the memo references again (BINGET, 2 bytes) instead of copying it, so a hostile file can
// reference one large list from thousands of places and make the replay copy it each time (a
// "billion laughs" bomb: a few hundred KiB that would need terabytes). In a real snapshot nearly
// every item visited is its own opcode of at least one byte; torch shares one frames list among
// an allocation's alloc, free_requested and free_completed entries and its block (3-4 visits of
// a list whose references cost 2-5 bytes each), so four visits per byte leave room to spare.
class VisitBudget {
 public:
  explicit VisitBudget(std::uint64_t file_bytes) : left_(kVisitsPerByte * file_bytes + kSlack) {}
  void take(std::uint64_t items, const std::string& where, std::string_view suffix = {}) {
    if (items > left_) {
      content_error(where + std::string(suffix) + " makes the snapshot reference more items than its bytes can hold "
                    "(the same lists referenced many times over: a decompression bomb?)");
    }
    left_ -= items;
  }

 private:
  static constexpr std::uint64_t kVisitsPerByte = 4;
  static constexpr std::uint64_t kSlack = 64 * 1024;
  std::uint64_t left_;
};

// Field readers with messages that name where the problem is.
const PickleValue* field(const PickleValue& d, std::string_view key) { return d.get(key); }

std::uint64_t uint_field(const PickleValue& d, std::string_view key, const std::string& where) {
  const PickleValue* v = field(d, key);
  if (v == nullptr) content_error(where + " has no '" + std::string(key) + "'");
  std::uint64_t out = 0;
  if (v->type == PickleValue::Type::Int) {
    if (!v->to_uint64(&out)) {
      std::int64_t s = 0;
      // torch writes -1 for "unset" in a few places; negative addresses or sizes are not usable
      if (v->to_int64(&s) && s < 0) content_error(where + "['" + std::string(key) + "'] is negative");
      content_error(where + "['" + std::string(key) + "'] does not fit in 64 bits");
    }
    return out;
  }
  content_error(where + "['" + std::string(key) + "'] must be an int, got " + type_of(*v));
}

std::optional<std::uint64_t> opt_uint(const PickleValue& d, std::string_view key, const std::string& where) {
  const PickleValue* v = field(d, key);
  if (v == nullptr || v->type == PickleValue::Type::None) return std::nullopt;
  return uint_field(d, key, where);
}

std::string_view str_field(const PickleValue& d, std::string_view key, const std::string& where) {
  const PickleValue* v = field(d, key);
  if (v == nullptr) content_error(where + " has no '" + std::string(key) + "'");
  if (!v->is_str()) content_error(where + "['" + std::string(key) + "'] must be a str, got " + type_of(*v));
  return v->str();
}

const PickleValue& list_field(const PickleValue& d, std::string_view key, const std::string& where) {
  const PickleValue* v = field(d, key);
  if (v == nullptr) content_error(where + " has no '" + std::string(key) + "'");
  if (!v->is_list_like()) content_error(where + "['" + std::string(key) + "'] must be a list, got " + type_of(*v));
  return *v;
}

// Frames lists, each read once: torch shares one list among an allocation's entries and its
// block (through the pickle's memo), so the replay meets the same list several times. Every
// reference still counts against the visit budget. The lists live as long as the cache.
class FramesCache {
 public:
  const std::vector<Frame>* read(const PickleValue& d, const std::string& where, VisitBudget& budget) {
    const PickleValue* v = field(d, "frames");
    if (v == nullptr || v->type == PickleValue::Type::None) return &none_;
    if (!v->is_list_like()) content_error(where + "['frames'] must be a list, got " + type_of(*v));
    budget.take(v->list().size(), where, "['frames']");
    if (v->list().empty()) return &none_;
    auto [it, inserted] = lists_.try_emplace(v->items.get());
    if (!inserted) return it->second.get();
    auto out = std::make_unique<std::vector<Frame>>();
    out->reserve(v->list().size());
    std::size_t i = 0;
    for (const PickleValue& f : v->list()) {
      auto fw = [&] { return where + "['frames'][" + std::to_string(i) + "]"; };
      if (!f.is_dict()) content_error(fw() + " must be a dict, got " + type_of(f));
      const PickleValue* file = f.get("filename");
      const PickleValue* name = f.get("name");
      if (file == nullptr || !file->is_str() || name == nullptr || !name->is_str()) {
        str_field(f, "filename", fw());  // the error that names the problem
        str_field(f, "name", fw());
      }
      std::int64_t line = 0;
      if (const PickleValue* l = f.get("line"); l != nullptr) l->to_int64(&line);
      out->push_back({file->str(), name->str(), line});
      ++i;
    }
    return (it->second = std::move(out)).get();
  }

 private:
  const std::vector<Frame> none_;
  absl::flat_hash_map<const void*, std::unique_ptr<std::vector<Frame>>> lists_;  // by the pickle's list
};

Entry read_entry(const PickleValue& t, const std::string& where, VisitBudget& budget, FramesCache& frames) {
  if (!t.is_dict()) content_error(where + " must be a dict, got " + type_of(t));
  Entry e;
  const std::string_view action = str_field(t, "action", where);
  e.action = parse_action(action);
  e.legacy_free = action == "free";
  if (outside_pytorch(t)) {
    e.action = Action::Other;
    e.outside = true;
  }
  if (e.action == Action::Other) return e;
  if (e.action == Action::Oom) {
    e.device_free = opt_uint(t, "device_free", where).value_or(0);
  } else {
    e.addr = uint_field(t, "addr", where);
  }
  // torch's annotate entries (_annotate_tensor) need not carry a size
  e.size = e.action == Action::Annotate ? opt_uint(t, "size", where).value_or(0) : uint_field(t, "size", where);
  e.stream = opt_uint(t, "stream", where).value_or(0);
  e.time_us = opt_uint(t, "time_us", where).value_or(0);
  e.block_size = opt_uint(t, "block_size", where);
  e.frames = frames.read(t, where, budget);
  if (const PickleValue* c = field(t, "category"); c != nullptr && c->type != PickleValue::Type::None) {
    if (!c->is_str()) content_error(where + "['category'] must be a str, got " + type_of(*c));
    e.category = c->str();
  }
  if (const PickleValue* m = field(t, "user_metadata"); m != nullptr && m->is_dict()) {
    auto s = [&](std::string_view k) {
      const PickleValue* v = m->get(k);
      return v != nullptr && v->is_str() ? v->str() : std::string_view();
    };
    e.phase = s("phase");
    e.label = s("label");
    e.module = s("module");
    if (const PickleValue* inf = m->get("category_inferred"); inf != nullptr && inf->type == PickleValue::Type::Bool) {
      e.category_inferred = inf->boolean;
    }
  }
  return e;
}

// Category names torch's own tools write (memory profiler categories, lowercase) and ours.
std::optional<Category> category_from_name(std::string_view name) {
  Category c;
  if (parse_category(name, &c)) return c;
  if (name == "autograd_detail") return Category::Temporary;
  return std::nullopt;
}

struct StartBlock {
  std::uint64_t addr = 0, bytes = 0, requested = 0;
  std::optional<std::string_view> category;
  const std::vector<Frame>* frames = &kNoFrames;  // owned by the converter's FramesCache
  bool frames_from_free = false;  // the frames are the free entry's, not the allocation's
  std::string_view label, module;
  std::optional<bool> category_inferred;
};

struct PhaseMark {
  std::uint64_t trace_index = 0;
  std::string name;
  bool begin = true;
  bool step = false;
  std::uint64_t step_value = 0;
  std::uint64_t time_us = 0;
};


class Converter {
 public:
  Converter(const PickleValue& root, int protocol, std::uint64_t file_bytes, const SnapshotReadOptions& options,
            Recorder& rec)
      : root_(root), options_(options), rec_(rec), budget_(file_bytes) {
    info_.protocol = protocol;
  }

  SnapshotImport run() {
    const PickleValue* segments = nullptr;
    const PickleValue* traces = nullptr;
    if (root_.is_list_like()) {  // the oldest format: a bare list of segments
      segments = &root_;
    } else if (root_.is_dict()) {
      segments = field(root_, "segments");
      traces = field(root_, "device_traces");
      if (segments == nullptr && traces == nullptr) content_error("the top-level dict has neither 'segments' nor 'device_traces'");
      if (segments != nullptr && !segments->is_list_like()) content_error("'segments' must be a list, got " + type_of(*segments));
      if (traces != nullptr && !traces->is_list_like()) content_error("'device_traces' must be a list, got " + type_of(*traces));
    } else {
      content_error("the pickle holds a " + type_of(root_) + ", not a snapshot dict");
    }
    if (traces != nullptr) {
      std::size_t i = 0;
      for (const PickleValue& t : traces->list()) {
        if (!t.is_list_like()) content_error("device_traces[" + std::to_string(i) + "] must be a list, got " + type_of(t));
        ++i;
      }
    }
    read_producer();
    set_device();
    if (traces != nullptr && device_index_ < traces->list().size()) {
      const PickleValue& list = traces->list()[device_index_];
      entries_.reserve(list.list().size());
      std::size_t i = 0;
      for (const PickleValue& t : list.list()) {
        const std::string where = "device_traces[" + std::to_string(device_index_) + "][" + std::to_string(i++) + "]";
        budget_.take(1, where);
        entries_.push_back(read_entry(t, where, budget_, frames_));
      }
    }
    info_.trace_entries = entries_.size();
    has_segments_ = segments != nullptr;
    if (segments != nullptr) read_end_segments(*segments);
    read_allocator_settings();
    read_annotations();
    prescan();
    modelled_ = !ours_ && !cpu_;
    if (modelled_) translator_ = std::make_unique<CudaTraceTranslator>(rules_);
    std::unique_ptr<detail::SnapshotInference> inference;
    if (!ours_) {
      try {
        inference = std::make_unique<detail::SnapshotInference>(options_.rules);
      } catch (const std::invalid_argument& e) {
        throw SnapshotError(e.what(), 0);
      }
    }
    sink_ = std::make_unique<detail::SnapshotSink>(rec_, std::move(inference));
    emit();
    sink_->flush();
    finish_info();
    return info_;
  }

  // The highest live bytes of the replay (the analysis's peak of this device).
  std::uint64_t peak_bytes() const { return sink_ ? sink_->peak_bytes() : 0; }

 private:
  void read_producer() {
    const PickleValue* r = root_.is_dict() ? field(root_, "ridgescope") : nullptr;
    if (r != nullptr && r->is_dict()) {
      const PickleValue* p = r->get("producer");
      if (p != nullptr && p->is_str() && p->str() == "ridgescope") ours_ = true;
      if (const PickleValue* d = r->get("devices"); d != nullptr && d->is_list_like()) {
        for (const PickleValue& name : d->list()) {
          if (name.is_str()) device_names_.emplace_back(name.str());
        }
      }
      if (const PickleValue* m = r->get("metadata"); m != nullptr && m->is_dict()) {
        for (const auto& [k, v] : m->dict()) {
          if (k.is_str() && v.is_str()) metadata_.emplace_back(std::string(k.str()), std::string(v.str()));
        }
      }
    }
    info_.producer = ours_ ? "ridgescope" : "pytorch";
  }

  // The device to replay: the caller has chosen it (snapshot_devices(), highest peak).
  void set_device() {
    const int index = options_.device_index.value_or(0);
    if (index < 0) content_error("device index " + std::to_string(index) + " is negative");
    device_index_ = static_cast<std::size_t>(index);
    device_ = Device{DeviceType::CUDA, static_cast<std::int16_t>(device_index_)};
    if (ours_) {
      for (const std::string& n : device_names_) {
        if (n == "cpu" && device_index_ == 0) device_ = Device{};
      }
    }
    cpu_ = device_.type == DeviceType::CPU;
    info_.device = device_name(device_);
  }

  // The allocator's state when the snapshot was taken: blocks live at the end.
  void read_end_segments(const PickleValue& segments) {
    std::size_t si = 0;
    for (const PickleValue& s : segments.list()) {
      const std::string where = "segments[" + std::to_string(si++) + "]";
      if (!s.is_dict()) content_error(where + " must be a dict, got " + type_of(s));
      std::uint64_t device = 0;
      if (const PickleValue* d = s.get("device"); d != nullptr && !d->to_uint64(&device)) {
        content_error(where + "['device'] must be an int, got " + type_of(*d));
      }
      if (device != device_index_ || outside_pytorch(s)) continue;
      const std::uint64_t address = uint_field(s, "address", where);
      const std::uint64_t total = uint_field(s, "total_size", where);
      if (const PickleValue* x = s.get("is_expandable"); x != nullptr && x->type == PickleValue::Type::Bool && x->boolean) {
        add_interval(end_mapped_, address, address + total);
      } else {
        end_segments_.emplace_back(address, total);
      }
      std::uint64_t at = address;
      const PickleValue& blocks = list_field(s, "blocks", where);
      budget_.take(blocks.list().size(), where + "['blocks']");
      std::size_t bi = 0;
      for (const PickleValue& b : blocks.list()) {
        const std::string bw = where + "['blocks'][" + std::to_string(bi++) + "]";
        if (!b.is_dict()) content_error(bw + " must be a dict, got " + type_of(b));
        const std::uint64_t size = uint_field(b, "size", bw);
        const std::string_view state = str_field(b, "state", bw);
        const std::uint64_t addr = opt_uint(b, "address", bw).value_or(at);
        // "active_pending_free" in the C++ source, "active_awaiting_free" in torch's docs
        if (state == "active_allocated" || state == "active_pending_free" || state == "active_awaiting_free") {
          StartBlock sb;
          sb.addr = addr;
          sb.bytes = size;
          sb.requested = opt_uint(b, "requested_size", bw).value_or(size);
          sb.frames = frames_.read(b, bw, budget_);
          // torch 2.0 kept a block's allocation stack in its 'history' (the last entry is the
          // allocation now live)
          const PickleValue* history = b.get("frames") == nullptr ? b.get("history") : nullptr;
          if (history != nullptr && history->is_list_like() && !history->list().empty() &&
              history->list().back().is_dict()) {
            sb.frames = frames_.read(history->list().back(), bw + "['history'][-1]", budget_);
          }
          if (const PickleValue* c = b.get("category"); c != nullptr && c->is_str()) sb.category = c->str();
          end_blocks_.push_back(std::move(sb));
        }
        at = addr + size;
      }
    }
  }

  // allocator_settings (torch/csrc/cuda/Module.cpp): the rules that decide block sizes.
  // max_split_size is int64(SIZE_MAX) = -1 when unlimited; roundup_power2_divisions is a dict
  // {"1": n, "2": n, "4": n, ..., "32768": n}: the key 2^i holds interval i.
  void read_allocator_settings() {
    const PickleValue* a = root_.is_dict() ? field(root_, "allocator_settings") : nullptr;
    if (a == nullptr || a->type == PickleValue::Type::None) return;
    const std::string where = "allocator_settings";
    if (!a->is_dict()) content_error(where + " must be a dict, got " + type_of(*a));
    if (const PickleValue* c = a->get("PYTORCH_CUDA_ALLOC_CONF"); c != nullptr && c->is_str()) {
      info_.alloc_conf = std::string(c->str());
    }
    if (const PickleValue* m = a->get("max_split_size"); m != nullptr && m->type != PickleValue::Type::None) {
      if (m->type != PickleValue::Type::Int) content_error(where + "['max_split_size'] must be an int, got " + type_of(*m));
      std::uint64_t v = 0;
      // negative (SIZE_MAX written as int64) or absurdly large: no limit
      if (m->to_uint64(&v) && v > 0 && v < (1ull << 62)) rules_.max_split_size = v;
    }
    if (const PickleValue* x = a->get("expandable_segments"); x != nullptr && x->type != PickleValue::Type::None) {
      if (x->type != PickleValue::Type::Bool) content_error(where + "['expandable_segments'] must be a bool, got " + type_of(*x));
      rules_.expandable_segments = x->boolean;
    }
    if (const PickleValue* r = a->get("roundup_power2_divisions"); r != nullptr && r->type != PickleValue::Type::None) {
      if (!r->is_dict()) content_error(where + "['roundup_power2_divisions'] must be a dict, got " + type_of(*r));
      for (const auto& [k, v] : r->dict()) {
        std::uint64_t key = 0, divisions = 0;
        if (k.is_str()) {
          const std::string_view ks = k.str();
          if (ks.empty() || ks.size() > 6) continue;
          for (char c : ks) {
            if (c < '0' || c > '9') { key = 0; break; }
            key = key * 10 + static_cast<std::uint64_t>(c - '0');
          }
        }
        if (key == 0 || (key & (key - 1)) != 0) continue;  // not a power of two: not torch's key
        if (!v.to_uint64(&divisions)) {
          content_error(where + "['roundup_power2_divisions'] values must be ints, got " + type_of(v));
        }
        std::size_t i = 0;
        while ((1ull << i) < key) ++i;
        if (i < rules_.roundup_power2_divisions.size()) rules_.roundup_power2_divisions[i] = divisions;
      }
    }
  }

  // torch's record_function annotations (name, stage START/END, time_us): the optimizer's
  // "Optimizer.step#AdamW.step" and "Optimizer.zero_grad#..." give exact optimizer_step and
  // zero_grad phases, and a record_function named like a ridgescope phase gives that phase.
  // Other names (library internals) are not phases. Malformed entries are skipped.
  void read_torch_annotations() {
    const PickleValue* a = field(root_, "external_annotations");
    if (a == nullptr || !a->is_list_like()) return;
    for (const PickleValue& x : a->list()) {
      const PickleValue* name = x.get("name");
      const PickleValue* stage = x.get("stage");
      const PickleValue* time = x.get("time_us");
      const PickleValue* device = x.get("device");
      std::uint64_t t = 0, d = 0;
      if (name == nullptr || !name->is_str() || stage == nullptr || !stage->is_str() || time == nullptr ||
          !time->to_uint64(&t)) {
        continue;
      }
      if (device != nullptr && device->to_uint64(&d) && d != device_index_) continue;
      const std::string_view n = name->str();
      PhaseMark m;
      if (n.substr(0, 15) == "Optimizer.step#") {
        m.name = "optimizer_step";
      } else if (n.substr(0, 20) == "Optimizer.zero_grad#") {
        m.name = "zero_grad";
      } else if (n == "forward" || n == "backward" || n == "optimizer_step" || n == "zero_grad" || n == "recompute") {
        m.name = std::string(n);
      } else {
        continue;
      }
      m.begin = stage->str() == "START";
      if (!m.begin && stage->str() != "END") continue;
      m.time_us = t;
      torch_marks_.push_back(std::move(m));
    }
    std::stable_sort(torch_marks_.begin(), torch_marks_.end(),
                     [](const PhaseMark& a, const PhaseMark& b) { return a.time_us < b.time_us; });
  }

  // The torch annotations due before an entry at `time_us`: a START at or before it, an END
  // before it.
  void emit_torch_marks_before(std::uint64_t time_us) {
    while (next_torch_mark_ < torch_marks_.size()) {
      const PhaseMark& m = torch_marks_[next_torch_mark_];
      if (m.begin ? m.time_us > time_us : m.time_us >= time_us) break;
      ++next_torch_mark_;
      const std::uint64_t t = time_ns(m.time_us);
      if (m.begin) {
        if (!annotated_phase_.empty()) continue;  // nested annotations: the outer one stands
        if (!current_phase_.empty()) phase(false, current_phase_, t);
        current_phase_.clear();
        if (m.name == "forward" && step_has_backward_or_optimizer_) {
          step(inferred_step_++, t);
          step_has_backward_or_optimizer_ = false;
        }
        if (m.name == "backward" || m.name == "optimizer_step") step_has_backward_or_optimizer_ = true;
        annotated_phase_ = m.name;
        phase(true, m.name, t);
        ++annotated_phases_;
      } else if (m.name == annotated_phase_) {
        phase(false, m.name, t);
        annotated_phase_.clear();
      }
    }
  }

  void read_annotations() {
    if (!root_.is_dict()) return;
    if (!ours_) {
      read_torch_annotations();
      return;
    }
    const PickleValue* a = field(root_, "external_annotations");
    if (a == nullptr || !a->is_list_like()) return;
    std::size_t i = 0;
    for (const PickleValue& x : a->list()) {
      const std::string where = "external_annotations[" + std::to_string(i++) + "]";
      if (!x.is_dict()) content_error(where + " must be a dict, got " + type_of(x));
      const std::optional<std::uint64_t> device = opt_uint(x, "device", where);
      if (device && *device != device_index_) continue;
      PhaseMark m;
      m.trace_index = uint_field(x, "trace_index", where);
      m.name = std::string(str_field(x, "name", where));
      const std::string_view stage = str_field(x, "stage", where);
      m.begin = stage == "START";
      m.time_us = opt_uint(x, "time_us", where).value_or(0);
      if (m.name == "ridgescope.step") {
        m.step = true;
        m.step_value = opt_uint(x, "step", where).value_or(0);
      }
      marks_.push_back(std::move(m));
    }
    std::stable_sort(marks_.begin(), marks_.end(),
                     [](const PhaseMark& a, const PhaseMark& b) { return a.trace_index < b.trace_index; });
  }

  // Which blocks and segments were live before the first entry, and the exact size of blocks
  // still live at the end.
  void prescan() {
    absl::flat_hash_map<std::uint64_t, std::size_t> live;  // addr -> alloc entry index (or npos)
    absl::flat_hash_set<std::uint64_t> live_segments;
    absl::flat_hash_set<std::uint64_t> touched;  // block addresses the trace allocates or frees
    constexpr std::size_t kStart = static_cast<std::size_t>(-1);
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (e.action == Action::Alloc || e.action == Action::FreeRequested || e.action == Action::FreeCompleted) {
        touched.insert(e.addr);
      }
      switch (e.action) {
        case Action::Alloc: live[e.addr] = i; break;
        case Action::FreeRequested:
        case Action::FreeCompleted:
          if (!live.contains(e.addr)) {
            StartBlock sb;
            sb.addr = e.addr;
            sb.requested = e.size;
            sb.bytes = e.block_size.value_or(block_bytes(e.size));
            sb.category = e.category;
            sb.frames = e.frames;
            sb.frames_from_free = true;
            sb.label = e.label;
            sb.module = e.module;
            sb.category_inferred = e.category_inferred;
            start_blocks_.push_back(std::move(sb));
            live[e.addr] = kStart;
          }
          if (e.action == Action::FreeCompleted) live.erase(e.addr);
          break;
        case Action::SegmentAlloc: live_segments.insert(e.addr); break;
        case Action::SegmentFree:
          if (!live_segments.contains(e.addr)) start_segments_.emplace_back(e.addr, e.size);
          live_segments.erase(e.addr);
          break;
        default: break;
      }
    }
    for (const StartBlock& b : end_blocks_) {
      auto it = live.find(b.addr);
      if (it == live.end()) {
        // Never in the trace: live throughout. Freed by the trace yet live in the segments: made
        // after the last entry (end_state() allocates it at the end).
        if (!touched.contains(b.addr)) start_blocks_.push_back(b);
      } else if (it->second != kStart) {
        exact_bytes_[it->second] = b.bytes;
      }
    }
    for (const auto& [addr, size] : end_segments_) {
      if (!live_segments.contains(addr)) start_segments_.emplace_back(addr, size);
    }
    // Expandable segments map and unmap ranges that need not line up with each other: what
    // was mapped at the start is what is mapped at the end, walked back through the trace
    // (an unmap means the range was mapped before it; a map, that it was not).
    std::map<std::uint64_t, std::uint64_t> mapped = end_mapped_;
    for (std::size_t i = entries_.size(); i-- > 0;) {
      const Entry& e = entries_[i];
      if (e.action == Action::SegmentUnmap) add_interval(mapped, e.addr, e.addr + e.size);
      if (e.action == Action::SegmentMap) remove_interval(mapped, e.addr, e.addr + e.size);
    }
    for (const auto& [lo, hi] : mapped) {
      start_segments_.emplace_back(lo, hi - lo);
      expandable_starts_.insert(lo);
    }
    info_.live_at_start_blocks = start_blocks_.size();
  }

  // Half-open address intervals [lo, hi), kept merged: start -> end.
  static void add_interval(std::map<std::uint64_t, std::uint64_t>& set, std::uint64_t lo, std::uint64_t hi) {
    if (hi <= lo) return;
    auto it = set.upper_bound(lo);
    if (it != set.begin() && std::prev(it)->second >= lo) {
      --it;
      lo = it->first;
      hi = std::max(hi, it->second);
      it = set.erase(it);
    }
    while (it != set.end() && it->first <= hi) {
      hi = std::max(hi, it->second);
      it = set.erase(it);
    }
    set.emplace(lo, hi);
  }
  static void remove_interval(std::map<std::uint64_t, std::uint64_t>& set, std::uint64_t lo, std::uint64_t hi) {
    if (hi <= lo) return;
    auto it = set.upper_bound(lo);
    if (it != set.begin()) --it;
    while (it != set.end() && it->first < hi) {
      const std::uint64_t a = it->first, b = it->second;
      if (b <= lo) {
        ++it;
        continue;
      }
      it = set.erase(it);
      if (a < lo) set.emplace(a, lo);
      if (b > hi) it = set.emplace(hi, b).first;
    }
  }

  std::uint64_t block_bytes(std::uint64_t requested) const {
    return cpu_ ? requested : cuda_round_size(requested, rules_);
  }

  std::uint64_t time_ns(std::uint64_t time_us) {
    std::uint64_t t = time_us >= base_us_ ? (time_us - base_us_) * 1000 : 0;
    if (t < last_ns_) t = last_ns_;
    last_ns_ = t;
    return t;
  }

  Event make(EventKind kind, std::uint64_t t_ns) const {
    Event e;
    e.kind = kind;
    e.time_ns = t_ns;
    e.device = device_;
    return e;
  }

  void record(const Event& e, const std::vector<Frame>* frames = nullptr, bool after_trace = false) {
    sink_->record(e, frames, after_trace);
  }

  // The category of a block alloc() just recorded. A ridgescope export names it, or says it was
  // inferred from lifetimes (the analysis infers it again from the same phases). For a snapshot
  // PyTorch wrote the inference decides it with hindsight (flush()), from a category the entry
  // names (memory_viz's), the allocation `frames` (null: none recorded) and lifetimes.
  void tag_block(std::uint64_t addr, std::uint64_t t_ns, std::optional<std::string_view> category,
                 const std::vector<Frame>* frames, std::string_view label, std::optional<bool> inferred,
                 bool before_trace) {
    ++allocations_;
    std::optional<Category> named;
    if (category) {
      named = category_from_name(*category);
      if (!named) unknown_category_names_.insert(std::string(*category));
    }
    if (sink_->inferring()) {
      sink_->block(frames, before_trace, named);
      return;
    }
    if (!named) return;
    ++categorised_from_snapshot_;
    if (inferred.value_or(false)) return;  // inferred from lifetimes: the same phases give the same result
    Event e = make(EventKind::Tag, t_ns);
    e.addr = addr;
    e.category = *named;
    e.string_id = rec_.intern(label);
    record(e);
  }

  // An allocation; `frames`: where it was made (null or empty: not recorded), which becomes the
  // event's stack (snapshot_stacks.h).
  void alloc(std::uint64_t addr, std::uint64_t bytes, std::uint64_t requested, std::uint64_t stream,
             std::uint64_t t_ns, std::string_view module, const std::vector<Frame>* frames) {
    Event e = make(EventKind::Alloc, t_ns);
    if (frames != nullptr) e.stack_id = stacks_.stack_of(*frames);
    e.addr = addr;
    e.bytes = bytes;
    e.requested_bytes = requested;
    e.stream = stream;
    e.string_id = module.empty() ? 0 : rec_.intern(module);
    sink_->alloc(e, module);
    live_bytes_[addr] = bytes;
  }

  // Where a block was made, for its label and module: its allocation frames (none when the only
  // frames known are the free entry's).
  const std::string& where(const std::vector<Frame>& frames, bool frames_from_free = false) {
    static const std::string kNowhere;
    if (ours_ || frames_from_free || frames.empty()) return kNowhere;
    auto [it, inserted] = where_.try_emplace(&frames);
    if (inserted) it->second = detail::where_from_frames(frames);
    return it->second;
  }

  void phase(bool begin, std::string_view name, std::uint64_t t_ns) {
    Event e = make(begin ? EventKind::PhaseBegin : EventKind::PhaseEnd, t_ns);
    e.device = Device{};
    e.string_id = rec_.intern(name);
    sink_->phase(e, begin, name);
  }

  void step(std::uint64_t n, std::uint64_t t_ns) {
    Event e = make(EventKind::Step, t_ns);
    e.device = Device{};
    e.value = n;
    record(e);
  }

  void emit_marks_through(std::uint64_t index) {
    while (next_mark_ < marks_.size() && marks_[next_mark_].trace_index <= index) {
      const PhaseMark& m = marks_[next_mark_++];
      const std::uint64_t t = time_ns(m.time_us);
      if (m.step) {
        step(m.step_value, t);
      } else {
        phase(m.begin, m.name, t);
      }
      used_marks_ = true;
    }
  }

  // torch's snapshots: a phase per run of allocations whose frames name the same phase; a new
  // step when a forward follows a backward or an optimizer step.
  void infer_phase(const Entry& e, std::uint64_t t_ns) {
    if (!annotated_phase_.empty()) return;  // inside a phase torch's annotations mark exactly
    auto [cached, inserted] = phases_.try_emplace(e.frames);
    if (inserted) cached->second = detail::phase_from_frames(*e.frames);
    const std::string_view p = cached->second;
    if (p.empty() || p == current_phase_) return;
    if (!current_phase_.empty()) phase(false, current_phase_, t_ns);
    if (p == "forward" && step_has_backward_or_optimizer_) {
      step(inferred_step_++, t_ns);
      step_has_backward_or_optimizer_ = false;
    }
    if (p == "backward" || p == "optimizer_step") step_has_backward_or_optimizer_ = true;
    current_phase_ = std::string(p);
    phase(true, current_phase_, t_ns);
    inferred_phases_ = true;
  }

  void emit() {
    for (const auto& [k, v] : metadata_) rec_.metadata(k, v);
    if (!ours_) {
      for (const Entry& e : entries_) {
        if (e.action != Action::Other) {
          base_us_ = e.time_us;
          break;
        }
      }
    }
    // The state before the first entry.
    const std::uint64_t t0 = 0;
    if (modelled_) {
      adopt_start_state();
    } else {
      if (!cpu_) {
        for (const auto& [addr, size] : start_segments_) {
          Event e = make(EventKind::SegmentAlloc, t0);
          e.addr = addr;
          e.bytes = size;
          record(e);
        }
      }
      for (const StartBlock& b : start_blocks_) {
        alloc(b.addr, b.bytes, b.requested, 0, t0, ours_ ? std::string(b.module) : where(*b.frames, b.frames_from_free),
              b.frames_from_free ? nullptr : b.frames);
        tag_block(b.addr, t0, b.category, b.frames_from_free ? nullptr : b.frames, b.label, b.category_inferred, true);
      }
    }
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      emit_marks_through(i);
      if (e.action == Action::Other) {
        if (!e.outside) ++ignored_entries_;
        continue;
      }
      if (!ours_) emit_torch_marks_before(e.time_us);
      const std::uint64_t t = time_ns(e.time_us);
      if (modelled_ && e.action != Action::Annotate) {
        if (e.action == Action::Alloc) infer_phase(e, t);
        translate(e, i, t);
        continue;
      }
      switch (e.action) {
        case Action::Alloc: {
          if (!ours_) infer_phase(e, t);
          auto exact = exact_bytes_.find(i);
          const std::uint64_t bytes =
              e.block_size ? *e.block_size : exact != exact_bytes_.end() ? exact->second : block_bytes(e.size);
          alloc(e.addr, bytes, e.size, e.stream, t, ours_ ? std::string(e.module) : where(*e.frames), e.frames);
          tag_block(e.addr, t, e.category, e.frames, e.label, e.category_inferred, false);
          break;
        }
        case Action::FreeRequested: break;  // the block stays allocated until free_completed
        case Action::FreeCompleted: {
          if (!live_bytes_.contains(e.addr)) break;
          Event f = make(EventKind::Free, t);
          f.addr = e.addr;
          f.bytes = live_bytes_[e.addr];
          f.stream = e.stream;
          record(f, e.frames);
          live_bytes_.erase(e.addr);
          break;
        }
        case Action::SegmentAlloc:
        case Action::SegmentFree:
        case Action::SegmentMap:
        case Action::SegmentUnmap: {
          if (cpu_) break;  // a CPU export's segments mirror its blocks
          const bool grows = e.action == Action::SegmentAlloc || e.action == Action::SegmentMap;
          Event s = make(grows ? EventKind::SegmentAlloc : EventKind::SegmentFree, t);
          s.addr = e.addr;
          s.bytes = e.size;
          s.stream = e.stream;
          record(s);
          break;
        }
        case Action::Oom: {
          Event o = make(EventKind::Oom, t);
          o.bytes = e.size;
          o.value = e.device_free;
          o.stream = e.stream;
          record(o);
          break;
        }
        case Action::Annotate: {
          if (!e.category || !live_bytes_.contains(e.addr)) break;
          const std::optional<Category> c = category_from_name(*e.category);
          if (!c) break;
          Event g = make(EventKind::Tag, t);
          g.addr = e.addr;
          g.category = *c;
          g.string_id = rec_.intern(e.label);
          record(g);
          break;
        }
        case Action::Other: break;
      }
    }
    emit_marks_through(UINT64_MAX);
    if (!ours_) emit_torch_marks_before(UINT64_MAX);
    if (!annotated_phase_.empty()) phase(false, annotated_phase_, last_ns_);
    if (!current_phase_.empty()) phase(false, current_phase_, last_ns_);
    if (!ours_ && has_segments_) end_state();
  }

  // The segments are the allocator's state when the snapshot was taken. Where the replay ends
  // elsewhere (history recording stopped before the snapshot, so frees or allocations after it
  // are missing), it is brought to that state at the end: blocks the segments no longer hold
  // are freed, blocks the trace never made are allocated, and reserved memory becomes the
  // segments'. So at the end live bytes are always the sum of the segments' allocated_size and
  // reserved bytes the sum of their total_size.
  void end_state() {
    const std::uint64_t t = last_ns_;
    absl::flat_hash_map<std::uint64_t, const StartBlock*> held;
    for (const StartBlock& b : end_blocks_) held[b.addr] = &b;
    std::vector<std::uint64_t> gone;
    for (const auto& [addr, bytes] : live_bytes_) {
      auto it = held.find(addr);
      if (it == held.end() || it->second->bytes != bytes) gone.push_back(addr);
    }
    std::sort(gone.begin(), gone.end());
    for (std::uint64_t addr : gone) {
      Event f = make(EventKind::Free, t);
      f.addr = addr;
      f.bytes = live_bytes_[addr];
      record(f, nullptr, /*after_trace=*/true);
      live_bytes_.erase(addr);
    }
    std::uint64_t made = 0;
    for (const StartBlock& b : end_blocks_) {
      if (live_bytes_.contains(b.addr)) continue;
      alloc(b.addr, b.bytes, b.requested, 0, t, where(*b.frames), b.frames_from_free ? nullptr : b.frames);
      tag_block(b.addr, t, b.category, b.frames, b.label, b.category_inferred, false);
      ++made;
    }
    // Reserved memory: compare what is covered, since ranges of expandable segments may be cut
    // differently.
    std::map<std::uint64_t, std::uint64_t> want;  // address -> bytes
    for (const auto& [addr, size] : end_segments_) want[addr] = size;
    for (const auto& [lo, hi] : end_mapped_) want[lo] = hi - lo;
    auto covered = [](const auto& segments) {
      std::map<std::uint64_t, std::uint64_t> out;
      for (const auto& [addr, size] : segments) add_interval(out, addr, addr + size);
      return out;
    };
    std::uint64_t segments_changed = 0;
    const auto& segments_now = sink_->segments();
    if (!cpu_ && covered(segments_now) != covered(want)) {
      std::vector<std::pair<std::uint64_t, std::uint64_t>> now(segments_now.begin(), segments_now.end());
      std::sort(now.begin(), now.end());
      for (const auto& [addr, size] : now) {
        auto it = want.find(addr);
        if (it != want.end() && it->second == size) continue;
        Event f = make(EventKind::SegmentFree, t);
        f.addr = addr;
        f.bytes = size;
        record(f);
        ++segments_changed;
      }
      for (const auto& [addr, size] : want) {
        auto it = segments_now.find(addr);
        if (it != segments_now.end() && it->second == size) continue;
        Event a = make(EventKind::SegmentAlloc, t);
        a.addr = addr;
        a.bytes = size;
        record(a);
        ++segments_changed;
      }
    }
    if (!gone.empty() || made > 0 || segments_changed > 0) {
      end_state_note_ = (
          "The trace ends in another state than the snapshot's segments (history recording stopped before "
          "the snapshot was taken?): at the end " + std::to_string(gone.size()) + " blocks the trace left "
          "allocated were freed, " + std::to_string(made) + " blocks it never allocated were allocated and " +
          std::to_string(segments_changed) + " segments were set as the snapshot holds them.");
    }
  }

  // --- PyTorch's CUDA snapshots: block sizes from a model of the segments -----------------
  // torch's trace records the *requested* bytes of each allocation. The block it got (what
  // memory_allocated() counts) is the rounded size, or a whole free block when the allocator
  // did not split it (up to 1 MiB more; oversize blocks more still). CudaTraceTranslator
  // models the segments from the trace's segment entries and recomputes each block exactly
  // under the snapshot's allocator_settings (the same code as the live CUDA source).

  CudaTraceEntry cuda_entry(const Entry& e) const {
    CudaTraceEntry c;
    switch (e.action) {
      case Action::Alloc: c.action = CudaTraceAction::Alloc; break;
      case Action::FreeRequested: c.action = CudaTraceAction::FreeRequested; break;
      case Action::FreeCompleted: c.action = CudaTraceAction::FreeCompleted; break;
      case Action::SegmentAlloc: c.action = CudaTraceAction::SegmentAlloc; break;
      case Action::SegmentFree: c.action = CudaTraceAction::SegmentFree; break;
      case Action::SegmentMap: c.action = CudaTraceAction::SegmentMap; break;
      case Action::SegmentUnmap: c.action = CudaTraceAction::SegmentUnmap; break;
      case Action::Oom: c.action = CudaTraceAction::Oom; break;
      default: c.action = CudaTraceAction::Unknown; break;
    }
    c.device = device_.index;
    c.addr = e.action == Action::Oom ? e.device_free : e.addr;
    c.size = e.size;
    c.stream = e.stream;
    return c;
  }

  // A legacy "free" is replayed as free_requested then free_completed.
  // `index`: the entry's place in the trace (a block live at the end takes the segments' exact
  // size, which holds even where the replay began from a guessed start state).
  void translate(const Entry& e, std::size_t index, std::uint64_t t) {
    scratch_.clear();
    CudaTraceEntry entry = cuda_entry(e);
    if (e.legacy_free) {
      entry.action = CudaTraceAction::FreeRequested;
      translator_->translate(entry, &scratch_);
      entry.action = CudaTraceAction::FreeCompleted;
    }
    translator_->translate(entry, &scratch_);
    for (Event ev : scratch_) {
      if (ev.kind == EventKind::Alloc) {
        auto exact = exact_bytes_.find(index);
        const std::uint64_t bytes = exact != exact_bytes_.end() ? exact->second : ev.bytes;
        ++blocks_modelled_;
        if (bytes != block_bytes(e.size)) ++blocks_larger_than_rounded_;
        alloc(ev.addr, bytes, ev.requested_bytes, ev.stream, t, where(*e.frames), e.frames);
        tag_block(ev.addr, t, e.category, e.frames, e.label, e.category_inferred, false);
        continue;
      }
      record_translated(ev, t, e.frames);
    }
  }

  // A segment or free event from the translator, at time t.
  void record_translated(Event ev, std::uint64_t t, const std::vector<Frame>* frames = nullptr) {
    ev.time_ns = t;
    ev.device = device_;
    if (ev.kind == EventKind::Free) live_bytes_.erase(ev.addr);
    record(ev, frames);
  }

  // The segments and blocks that existed before the first entry, adopted by the translator
  // (segments in address order, each followed by its blocks); blocks in no known segment are
  // plain allocations with the rounded size.
  void adopt_start_state() {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> segs = start_segments_;
    std::sort(segs.begin(), segs.end());
    std::vector<const StartBlock*> blocks;
    for (const StartBlock& b : start_blocks_) blocks.push_back(&b);
    std::sort(blocks.begin(), blocks.end(), [](const StartBlock* a, const StartBlock* b) { return a->addr < b->addr; });
    absl::flat_hash_set<const StartBlock*> placed;
    auto emit_adopted = [&](const StartBlock* b) {
      for (const Event& ev : scratch_) {
        if (ev.kind == EventKind::Alloc && b != nullptr) {
          alloc(ev.addr, ev.bytes, ev.requested_bytes, ev.stream, 0, where(*b->frames, b->frames_from_free),
              b->frames_from_free ? nullptr : b->frames);
          tag_block(ev.addr, 0, b->category, b->frames_from_free ? nullptr : b->frames, b->label,
                    b->category_inferred, true);
        } else {
          record_translated(ev, 0);
        }
      }
    };
    std::size_t bi = 0;
    for (const auto& [addr, size] : segs) {
      scratch_.clear();
      translator_->adopt_segment(device_.index, addr, size, 0, expandable_starts_.contains(addr), &scratch_);
      emit_adopted(nullptr);
      while (bi < blocks.size() && blocks[bi]->addr < addr) ++bi;
      for (std::size_t j = bi; j < blocks.size() && blocks[j]->addr < addr + size; ++j) {
        const StartBlock* b = blocks[j];
        scratch_.clear();
        translator_->adopt_block(device_.index, b->addr, b->bytes, b->requested, true, 0, &scratch_);
        emit_adopted(b);
        placed.insert(b);
      }
    }
    for (const StartBlock* b : blocks) {
      if (placed.contains(b)) continue;
      alloc(b->addr, b->bytes, b->requested, 0, 0, where(*b->frames, b->frames_from_free),
            b->frames_from_free ? nullptr : b->frames);
      tag_block(b->addr, 0, b->category, b->frames_from_free ? nullptr : b->frames, b->label, b->category_inferred,
                true);
    }
  }

  void finish_info() {
    info_.reasons = sink_->reasons();
    info_.categorised_from_snapshot = categorised_from_snapshot_ + sink_->decided_by_snapshot();
    info_.categorised_from_frames = sink_->decided_by_frames();
    info_.categories_inferred = info_.categorised_from_snapshot < allocations_;
    info_.phases_inferred = inferred_phases_;
    info_.block_sizes_inferred = !ours_ && !cpu_;
    if (ours_) {
      info_.notes.push_back("A ridgescope export: categories, labels, phases and steps are read back from the "
                            "snapshot's 'category' keys, user_metadata and external_annotations.");
    } else {
      info_.notes.push_back(
          "A snapshot written by PyTorch: it records no categories or phases. Each block's category is "
          "inferred by the first rule that fires (docs/snapshot.md): frames (the optimizer's _init_group, "
          "AccumulateGrad, Module._apply/load_state_dict/from_pretrained, workspaces, the data loader), "
          "sizes (a block live before the first forward that a gradient of its size matches is a "
          "parameter), the step's structure and lifetimes over the phases. Each label ends with the "
          "rule's id; 'reasons' says how many bytes each rule decided.");
      if (!end_state_note_.empty()) info_.notes.push_back(end_state_note_);
      if (annotated_phases_ > 0) {
        info_.notes.push_back(std::to_string(annotated_phases_) +
                              " phases come from torch's record_function annotations (the optimizer's "
                              "step and zero_grad, or record_functions named like a phase): exact.");
      }
      if (inferred_phases_) {
        info_.notes.push_back("Phases are inferred from stack frames (Module forward calls, backward, "
                              "torch.optim, zero_grad); steps begin where a forward follows a backward "
                              "or an optimizer step.");
      } else if (annotated_phases_ == 0) {
        info_.notes.push_back("No frame names a phase (the snapshot was recorded without stacks?): "
                              "the report has no phases, and lifetime categories need phases.");
      }
      const CudaTranslatorStats ts = translator_ ? translator_->stats() : CudaTranslatorStats{};
      info_.block_sizes_modelled = blocks_modelled_;
      info_.blocks_larger_than_rounded = blocks_larger_than_rounded_;
      info_.unmatched_entries = ts.unmatched_frees + ts.unmatched_segment_frees + ts.allocs_outside_segments;
      info_.notes.push_back(
          "PyTorch's trace records requested sizes; block sizes (what memory_allocated() counts) are "
          "recomputed by replaying the segments under the snapshot's allocator_settings: rounding, and "
          "blocks handed out whole when the allocator does not split them (" +
          std::to_string(blocks_larger_than_rounded_) + " of " + std::to_string(blocks_modelled_) +
          " allocations got a block larger than the rounded request).");
      if (info_.unmatched_entries > 0) {
        info_.notes.push_back(
            std::to_string(info_.unmatched_entries) + " trace entries did not match the replayed segments (" +
            std::to_string(ts.allocs_outside_segments) + " allocations outside any known segment, " +
            std::to_string(ts.unmatched_frees) + " frees of unknown blocks, " +
            std::to_string(ts.unmatched_segment_frees) +
            " segment releases of unknown segments; the trace probably began after these were made): "
            "their blocks use the rounded request size.");
      }
    }
    if (info_.live_at_start_blocks > 0) {
      info_.notes.push_back(std::to_string(info_.live_at_start_blocks) +
                            " blocks were live before the first trace entry (from the segments or from "
                            "frees without an alloc); they are counted from time 0.");
    }
    if (ignored_entries_ > 0) {
      info_.notes.push_back(std::to_string(ignored_entries_) + " trace entries of other kinds (snapshot "
                            "markers, newer actions) were skipped.");
    }
    for (const std::string& n : unknown_category_names_) {
      info_.notes.push_back("category '" + n + "' is not a ridgescope category; those blocks were treated "
                            "as uncategorised.");
    }
    (void)used_marks_;
  }

  const PickleValue& root_;
  const SnapshotReadOptions& options_;
  Recorder& rec_;
  VisitBudget budget_;
  SnapshotImport info_;
  bool ours_ = false;
  bool cpu_ = false;
  std::vector<std::string> device_names_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::size_t device_index_ = 0;
  Device device_;
  std::vector<Entry> entries_;
  std::vector<StartBlock> end_blocks_, start_blocks_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> end_segments_, start_segments_;
  absl::flat_hash_map<std::size_t, std::uint64_t> exact_bytes_;
  absl::flat_hash_map<std::uint64_t, std::uint64_t> live_bytes_;
  std::vector<PhaseMark> marks_;
  std::size_t next_mark_ = 0;
  bool used_marks_ = false;
  std::uint64_t base_us_ = 0, last_ns_ = 0;
  std::string current_phase_;
  bool step_has_backward_or_optimizer_ = false;
  std::uint64_t inferred_step_ = 0;
  bool inferred_phases_ = false;
  std::vector<PhaseMark> torch_marks_;
  std::size_t next_torch_mark_ = 0;
  std::string annotated_phase_;
  std::uint64_t annotated_phases_ = 0;
  std::uint64_t allocations_ = 0, categorised_from_snapshot_ = 0;
  std::uint64_t ignored_entries_ = 0;
  std::set<std::string> unknown_category_names_;
  // PyTorch's CUDA snapshots: the segment model that sizes blocks (see translate()).
  bool modelled_ = false;
  CudaRoundingRules rules_;
  std::unique_ptr<CudaTraceTranslator> translator_;
  std::vector<Event> scratch_;
  absl::flat_hash_set<std::uint64_t> expandable_starts_;  // start segments that are mapped ranges
  std::map<std::uint64_t, std::uint64_t> end_mapped_;      // expandable ranges mapped at the end
  std::uint64_t blocks_modelled_ = 0, blocks_larger_than_rounded_ = 0;
  std::string end_state_note_;
  bool has_segments_ = false;  // the snapshot has 'segments' (its end state)
  FramesCache frames_;  // every frames list read, once (entries and blocks point into it)
  detail::SnapshotStacks stacks_{rec_};  // each frames list as a trace stack, once
  absl::flat_hash_map<const std::vector<Frame>*, std::string> where_;  // where_from_frames, per list
  absl::flat_hash_map<const std::vector<Frame>*, std::string_view> phases_;  // phase_from_frames, per list
  std::unique_ptr<detail::SnapshotSink> sink_;  // where events go (PyTorch's snapshots: the inference)
};

}  // namespace

namespace detail {

SnapshotImport replay_snapshot_device(const detail::PickleValue& root, int protocol, std::uint64_t file_bytes,
                                      const SnapshotReadOptions& options, Recorder& rec, std::uint64_t* peak_bytes) {
  Converter converter(root, protocol, file_bytes, options, rec);
  SnapshotImport info = converter.run();
  if (peak_bytes != nullptr) *peak_bytes = converter.peak_bytes();
  return info;
}

}  // namespace detail
}  // namespace ridgescope
