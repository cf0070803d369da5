// snapshot_document.cpp — one device of a torch memory snapshot as the replay reads it: the
// producer, the device, its entries, the end state, the allocator settings and the annotations
// (see snapshot_document.h).
#include "snapshot_document.h"

#include <algorithm>

#include "ridgescope/phase.h"

namespace ridgescope::detail {

SnapshotDocument::SnapshotDocument(const PickleValue& root, std::uint64_t file_bytes,
                                   const SnapshotReadOptions& options)
    : root_(&root), budget_(file_bytes) {
  const PickleValue* segments = nullptr;
  const PickleValue* traces = nullptr;
  if (root_->is_list_like()) {  // the oldest format: a bare list of segments
    segments = root_;
  } else if (root_->is_dict()) {
    segments = field(*root_, "segments");
    traces = field(*root_, "device_traces");
    if (segments == nullptr && traces == nullptr) snapshot_content_error("the top-level dict has neither 'segments' nor 'device_traces'");
    if (segments != nullptr && !segments->is_list_like()) snapshot_content_error("'segments' must be a list, got " + pickle_type_of(*segments));
    if (traces != nullptr && !traces->is_list_like()) snapshot_content_error("'device_traces' must be a list, got " + pickle_type_of(*traces));
  } else {
    snapshot_content_error("the pickle holds a " + pickle_type_of(*root_) + ", not a snapshot dict");
  }
  if (traces != nullptr) {
    std::size_t i = 0;
    for (const PickleValue& t : traces->list()) {
      if (!t.is_list_like()) snapshot_content_error("device_traces[" + std::to_string(i) + "] must be a list, got " + pickle_type_of(t));
      ++i;
    }
  }
  read_producer();
  set_device(options);
  if (traces != nullptr && device_index < traces->list().size()) {
    const PickleValue& list = traces->list()[device_index];
    entries.reserve(list.list().size());
    std::size_t i = 0;
    for (const PickleValue& t : list.list()) {
      const Where where("device_traces", device_index, i++);
      budget_.take(1, where);
      entries.push_back(read_entry(t, where, budget_, frames_, extras_));
    }
  }
  has_segments = segments != nullptr;
  if (segments != nullptr) read_end_segments(*segments);
  read_allocator_settings();
  read_annotations();
  root_ = nullptr;  // the tree may go now: nothing refers to it
}

void SnapshotDocument::read_producer() {
  const PickleValue* r = root_->is_dict() ? field(*root_, "ridgescope") : nullptr;
  if (r != nullptr && r->is_dict()) {
    const PickleValue* p = r->get("producer");
    if (p != nullptr && p->is_str() && p->str() == "ridgescope") ours = true;
    if (const PickleValue* d = r->get("devices"); d != nullptr && d->is_list_like()) {
      for (const PickleValue& name : d->list()) {
        if (name.is_str()) device_names_.emplace_back(name.str());
      }
    }
    if (const PickleValue* m = r->get("metadata"); m != nullptr && m->is_dict()) {
      for (const auto& [k, v] : m->dict()) {
        if (k.is_str() && v.is_str()) metadata.emplace_back(std::string(k.str()), std::string(v.str()));
      }
    }
  }
}

// The device to replay: the caller has chosen it (snapshot_devices(), highest peak).
void SnapshotDocument::set_device(const SnapshotReadOptions& options) {
  const int index = options.device_index.value_or(0);
  if (index < 0) snapshot_content_error("device index " + std::to_string(index) + " is negative");
  device_index = static_cast<std::size_t>(index);
  device = Device{DeviceType::CUDA, static_cast<std::int16_t>(device_index)};
  if (ours) {
    for (const std::string& n : device_names_) {
      if (n == "cpu" && device_index == 0) device = Device{};
    }
  }
  cpu = device.type == DeviceType::CPU;
}

// The allocator's state when the snapshot was taken: blocks live at the end.
void SnapshotDocument::read_end_segments(const PickleValue& segments) {
  std::size_t si = 0;
  for (const PickleValue& s : segments.list()) {
    const std::string where = "segments[" + std::to_string(si++) + "]";
    if (!s.is_dict()) snapshot_content_error(where + " must be a dict, got " + pickle_type_of(s));
    std::uint64_t segment_device = 0;
    if (const PickleValue* d = s.get("device"); d != nullptr && !d->to_uint64(&segment_device)) {
      snapshot_content_error(where + "['device'] must be an int, got " + pickle_type_of(*d));
    }
    if (segment_device != device_index || outside_pytorch(s)) continue;
    const std::uint64_t address = uint_field(s, "address", where);
    const std::uint64_t total = uint_field(s, "total_size", where);
    if (const PickleValue* x = s.get("is_expandable"); x != nullptr && x->type == PickleValue::Type::Bool && x->boolean) {
      add_interval(end_mapped, address, address + total);
    } else {
      end_segments.emplace_back(address, total);
    }
    std::uint64_t at = address;
    const PickleValue& blocks = list_field(s, "blocks", where);
    budget_.take(blocks.list().size(), where + "['blocks']");
    std::size_t bi = 0;
    for (const PickleValue& b : blocks.list()) {
      const std::string bw = where + "['blocks'][" + std::to_string(bi++) + "]";
      if (!b.is_dict()) snapshot_content_error(bw + " must be a dict, got " + pickle_type_of(b));
      const std::uint64_t size = uint_field(b, "size", bw);
      const std::string_view state = str_field(b, "state", bw);
      const std::uint64_t addr = opt_uint(b, "address", bw).value_or(at);
      // "active_pending_free" in the C++ source, "active_awaiting_free" in torch's docs
      if (state == "active_allocated" || state == "active_pending_free" || state == "active_awaiting_free") {
        SnapshotBlock sb;
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
        end_blocks.push_back(std::move(sb));
      }
      at = addr + size;
    }
  }
}

// allocator_settings (torch/csrc/cuda/Module.cpp): the rules that decide block sizes.
// max_split_size is int64(SIZE_MAX) = -1 when unlimited; roundup_power2_divisions is a dict
// {"1": n, "2": n, "4": n, ..., "32768": n}: the key 2^i holds interval i.
void SnapshotDocument::read_allocator_settings() {
  const PickleValue* a = root_->is_dict() ? field(*root_, "allocator_settings") : nullptr;
  if (a == nullptr || a->type == PickleValue::Type::None) return;
  const std::string where = "allocator_settings";
  if (!a->is_dict()) snapshot_content_error(where + " must be a dict, got " + pickle_type_of(*a));
  if (const PickleValue* c = a->get("PYTORCH_CUDA_ALLOC_CONF"); c != nullptr && c->is_str()) {
    alloc_conf = std::string(c->str());
  }
  if (const PickleValue* m = a->get("max_split_size"); m != nullptr && m->type != PickleValue::Type::None) {
    if (m->type != PickleValue::Type::Int) snapshot_content_error(where + "['max_split_size'] must be an int, got " + pickle_type_of(*m));
    std::uint64_t v = 0;
    // negative (SIZE_MAX written as int64) or absurdly large: no limit
    if (m->to_uint64(&v) && v > 0 && v < (1ull << 62)) rules.max_split_size = v;
  }
  if (const PickleValue* x = a->get("expandable_segments"); x != nullptr && x->type != PickleValue::Type::None) {
    if (x->type != PickleValue::Type::Bool) snapshot_content_error(where + "['expandable_segments'] must be a bool, got " + pickle_type_of(*x));
    rules.expandable_segments = x->boolean;
  }
  if (const PickleValue* r = a->get("roundup_power2_divisions"); r != nullptr && r->type != PickleValue::Type::None) {
    if (!r->is_dict()) snapshot_content_error(where + "['roundup_power2_divisions'] must be a dict, got " + pickle_type_of(*r));
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
        snapshot_content_error(where + "['roundup_power2_divisions'] values must be ints, got " + pickle_type_of(v));
      }
      std::size_t i = 0;
      while ((1ull << i) < key) ++i;
      if (i < rules.roundup_power2_divisions.size()) rules.roundup_power2_divisions[i] = divisions;
    }
  }
}

// torch's record_function annotations (name, stage START/END, time_us): the optimizer's
// "Optimizer.step#AdamW.step" and "Optimizer.zero_grad#..." give exact optimizer_step and
// zero_grad phases, and a record_function named like a ridgescope phase gives that phase.
// Other names (library internals) are not phases. Malformed entries are skipped.
void SnapshotDocument::read_torch_annotations() {
  const PickleValue* a = field(*root_, "external_annotations");
  if (a == nullptr || !a->is_list_like()) return;
  for (const PickleValue& x : a->list()) {
    const PickleValue* name = x.get("name");
    const PickleValue* stage = x.get("stage");
    const PickleValue* time = x.get("time_us");
    const PickleValue* mark_device = x.get("device");
    std::uint64_t t = 0, d = 0;
    if (name == nullptr || !name->is_str() || stage == nullptr || !stage->is_str() || time == nullptr ||
        !time->to_uint64(&t)) {
      continue;
    }
    if (mark_device != nullptr && mark_device->to_uint64(&d) && d != device_index) continue;
    const std::string_view n = name->str();
    PhaseMark m;
    if (n.substr(0, 15) == "Optimizer.step#") {
      m.name = builtin_phase_name(PhaseKind::OptimizerStep);
    } else if (n.substr(0, 20) == "Optimizer.zero_grad#") {
      m.name = builtin_phase_name(PhaseKind::ZeroGrad);
    } else if (is_step_phase(parse_phase_kind(n))) {
      m.name = std::string(n);
    } else {
      continue;
    }
    m.begin = stage->str() == "START";
    if (!m.begin && stage->str() != "END") continue;
    m.time_us = t;
    torch_marks.push_back(std::move(m));
  }
  std::stable_sort(torch_marks.begin(), torch_marks.end(),
                   [](const PhaseMark& a, const PhaseMark& b) { return a.time_us < b.time_us; });
}

void SnapshotDocument::read_annotations() {
  if (!root_->is_dict()) return;
  if (!ours) {
    read_torch_annotations();
    return;
  }
  const PickleValue* a = field(*root_, "external_annotations");
  if (a == nullptr || !a->is_list_like()) return;
  std::size_t i = 0;
  for (const PickleValue& x : a->list()) {
    const std::string where = "external_annotations[" + std::to_string(i++) + "]";
    if (!x.is_dict()) snapshot_content_error(where + " must be a dict, got " + pickle_type_of(x));
    const std::optional<std::uint64_t> mark_device = opt_uint(x, "device", where);
    if (mark_device && *mark_device != device_index) continue;
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
    marks.push_back(std::move(m));
  }
  std::stable_sort(marks.begin(), marks.end(),
                   [](const PhaseMark& a, const PhaseMark& b) { return a.trace_index < b.trace_index; });
}

}  // namespace ridgescope::detail
