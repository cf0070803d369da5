// snapshot_entries.cpp — a snapshot's entries, blocks and frames read from the pickle (see
// snapshot_entries.h).
#include "snapshot_entries.h"

#include <utility>

#include "ridgescope/snapshot.h"

namespace ridgescope::detail {

void snapshot_content_error(const std::string& message) {
  throw SnapshotError("not a usable torch memory snapshot: " + message, 0);
}

std::string pickle_type_of(const PickleValue& v) { return std::string(pickle_type_name(v.type)); }

EntryAction parse_entry_action(std::string_view a) {
  if (a == "alloc") return EntryAction::Alloc;
  if (a == "free_requested") return EntryAction::FreeRequested;
  if (a == "free_completed" || a == "free") return EntryAction::FreeCompleted;  // "free": legacy
  if (a == "segment_alloc") return EntryAction::SegmentAlloc;
  if (a == "segment_free") return EntryAction::SegmentFree;
  if (a == "segment_map") return EntryAction::SegmentMap;      // expandable segments
  if (a == "segment_unmap") return EntryAction::SegmentUnmap;
  if (a == "oom") return EntryAction::Oom;
  if (a == "annotate") return EntryAction::Annotate;
  return EntryAction::Other;  // "snapshot" and actions of newer torch versions
}

std::string Where::str() const {
  if (text_ != nullptr) return *text_;
  return std::string(list_) + "[" + std::to_string(i_) + "][" + std::to_string(j_) + "]";
}

void VisitBudget::take(std::uint64_t items, const Where& where, std::string_view suffix) {
  if (items > left_) {
    snapshot_content_error(where + suffix + " makes the snapshot reference more items than its bytes can "
                           "hold (the same lists referenced many times over: a decompression bomb?)");
  }
  left_ -= items;
}

const PickleValue* field(const PickleValue& d, std::string_view key) { return d.get(key); }

std::uint64_t uint_field(const PickleValue& d, std::string_view key, const Where& where) {
  const PickleValue* v = field(d, key);
  if (v == nullptr) snapshot_content_error(where + " has no '" + std::string(key) + "'");
  std::uint64_t out = 0;
  if (v->type == PickleValue::Type::Int) {
    if (!v->to_uint64(&out)) {
      std::int64_t s = 0;
      // torch writes -1 for "unset" in a few places; negative addresses or sizes are not usable
      if (v->to_int64(&s) && s < 0) snapshot_content_error(where + "['" + std::string(key) + "'] is negative");
      snapshot_content_error(where + "['" + std::string(key) + "'] does not fit in 64 bits");
    }
    return out;
  }
  snapshot_content_error(where + "['" + std::string(key) + "'] must be an int, got " + pickle_type_of(*v));
}

std::optional<std::uint64_t> opt_uint(const PickleValue& d, std::string_view key, const Where& where) {
  const PickleValue* v = field(d, key);
  if (v == nullptr || v->type == PickleValue::Type::None) return std::nullopt;
  return uint_field(d, key, where);
}

std::string_view str_field(const PickleValue& d, std::string_view key, const Where& where) {
  const PickleValue* v = field(d, key);
  if (v == nullptr) snapshot_content_error(where + " has no '" + std::string(key) + "'");
  if (!v->is_str()) snapshot_content_error(where + "['" + std::string(key) + "'] must be a str, got " + pickle_type_of(*v));
  return v->str();
}

const PickleValue& list_field(const PickleValue& d, std::string_view key, const Where& where) {
  const PickleValue* v = field(d, key);
  if (v == nullptr) snapshot_content_error(where + " has no '" + std::string(key) + "'");
  if (!v->is_list_like()) snapshot_content_error(where + "['" + std::string(key) + "'] must be a list, got " + pickle_type_of(*v));
  return *v;
}

const SnapshotFrames* FramesCache::read(const PickleValue& d, const Where& where, VisitBudget& budget) {
  const PickleValue* v = field(d, "frames");
  if (v == nullptr || v->type == PickleValue::Type::None) return &kNoFrames;
  if (!v->is_list_like()) snapshot_content_error(where + "['frames'] must be a list, got " + pickle_type_of(*v));
  budget.take(v->list().size(), where, "['frames']");
  if (v->list().empty()) return &kNoFrames;
  auto [it, inserted] = lists_.try_emplace(v->identity());
  if (!inserted) return it->second.get();
  auto out = std::make_unique<SnapshotFrames>();
  out->reserve(v->list().size());
  std::size_t i = 0;
  for (const PickleValue& f : v->list()) {
    auto fw = [&] { return where + "['frames'][" + std::to_string(i) + "]"; };
    if (!f.is_dict()) snapshot_content_error(fw() + " must be a dict, got " + pickle_type_of(f));
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

bool outside_pytorch(const PickleValue& v) {
  const PickleValue* m = v.is_dict() ? v.get("ridgescope_outside_pytorch") : nullptr;
  return m != nullptr && m->type == PickleValue::Type::Bool && m->boolean;
}

SnapshotEntry read_entry(const PickleValue& t, const Where& where, VisitBudget& budget, FramesCache& frames,
                         SnapshotExtras& extras) {
  if (!t.is_dict()) snapshot_content_error(where + " must be a dict, got " + pickle_type_of(t));
  SnapshotEntry e;
  const std::string_view action = str_field(t, "action", where);
  e.action = parse_entry_action(action);
  e.legacy_free = action == "free";
  if (outside_pytorch(t)) {
    e.action = EntryAction::Other;
    e.outside = true;
  }
  if (e.action == EntryAction::Other) return e;
  SnapshotEntryExtra x;
  if (e.action == EntryAction::Oom) {
    x.device_free = opt_uint(t, "device_free", where).value_or(0);
  } else {
    e.addr = uint_field(t, "addr", where);
  }
  // torch's annotate entries (_annotate_tensor) need not carry a size
  e.size = e.action == EntryAction::Annotate ? opt_uint(t, "size", where).value_or(0) : uint_field(t, "size", where);
  e.stream = opt_uint(t, "stream", where).value_or(0);
  e.time_us = opt_uint(t, "time_us", where).value_or(0);
  x.block_size = opt_uint(t, "block_size", where);
  e.frames = frames.read(t, where, budget);
  if (const PickleValue* c = field(t, "category"); c != nullptr && c->type != PickleValue::Type::None) {
    if (!c->is_str()) snapshot_content_error(where + "['category'] must be a str, got " + pickle_type_of(*c));
    x.category = c->str();
  }
  if (const PickleValue* m = field(t, "user_metadata"); m != nullptr && m->is_dict()) {
    auto s = [&](std::string_view k) {
      const PickleValue* v = m->get(k);
      return v != nullptr && v->is_str() ? v->str() : std::string_view();
    };
    x.phase = s("phase");
    x.label = s("label");
    x.module = s("module");
    if (const PickleValue* inf = m->get("category_inferred"); inf != nullptr && inf->type == PickleValue::Type::Bool) {
      x.category_inferred = inf->boolean;
    }
  }
  if (x.block_size || x.device_free != 0 || x.category || !x.phase.empty() || !x.label.empty() || !x.module.empty() ||
      x.category_inferred) {
    e.extra = &extras.emplace_back(x);
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

}  // namespace ridgescope::detail
