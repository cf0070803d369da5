// snapshot_writer.cpp — a ridgescope trace as a torch.cuda.memory._snapshot() pickle
// (see ridgescope/snapshot.h and docs/snapshot.md).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "peak_sites.h"
#include "pickle_writer.h"
#include "ridgescope/analysis.h"
#include "ridgescope/external_alloc.h"
#include "ridgescope/snapshot.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope {
namespace {

using detail::PickleWriter;

constexpr std::uint64_t kSmallSegmentBytes = 1ull << 20;  // torch's small pool: blocks <= 1 MiB
constexpr std::size_t kFlushBytes = 1u << 20;
constexpr std::string_view kStepAnnotation = "ridgescope.step";
// Device memory allocated outside PyTorch (external_alloc events): exported as segments and
// blocks of their own, with this category so that memory_viz draws them in their own colour,
// and marked with kOutsideKey so that ridgescope's reader leaves them out of PyTorch's memory.
constexpr std::string_view kOutsideCategory = "non_pytorch";
constexpr std::string_view kOutsideKey = "ridgescope_outside_pytorch";

// The file being written: streams the writer's buffer out in pieces.
class Output {
 public:
  explicit Output(const std::string& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "wb");
    if (file_ == nullptr) throw std::runtime_error("cannot write '" + path + "': " + std::strerror(errno));
  }
  ~Output() {
    if (file_ != nullptr) std::fclose(file_);
  }
  void drain(PickleWriter& w, bool force) {
    if (!force && w.buffered_bytes() < kFlushBytes) return;
    const std::string bytes = w.take();
    if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
      throw std::runtime_error("cannot write '" + path_ + "': " + std::strerror(errno));
    }
    written_ += bytes.size();
  }
  std::uint64_t close() {
    const int rc = std::fclose(file_);
    file_ = nullptr;
    if (rc != 0) throw std::runtime_error("cannot write '" + path_ + "': " + std::strerror(errno));
    return written_;
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::uint64_t written_ = 0;
};

struct LiveInfo {
  std::uint64_t bytes = 0, requested = 0, step = 0;
  Category category = Category::Unknown;
  bool inferred = false;
  std::string label, phase, module;
  std::uint32_t stack_id = 0;  // where it was made (the trace's stack), 0: none
  bool outside = false;        // allocated outside PyTorch (label: the library and the API)
};

std::string_view category_text(const LiveInfo& b) {
  return b.outside ? kOutsideCategory : category_name(b.category);
}

struct Annotation {
  std::string name, stage;
  int device = 0;
  std::uint64_t time_us = 0, trace_index = 0;
  std::optional<std::uint64_t> step;
};

struct SegmentOut {
  int device = 0;
  std::uint64_t address = 0, total_size = 0, stream = 0;
  // blocks: (address, size, requested, state, live info or null)
  struct BlockOut {
    std::uint64_t address = 0, size = 0, requested = 0;
    const LiveInfo* live = nullptr;  // null: an inactive (free) block
  };
  std::vector<BlockOut> blocks;
  bool outside = false;  // memory allocated outside PyTorch (non_pytorch)
};

int export_index(Device d) { return d.type == DeviceType::CPU ? 0 : d.index; }

// One recorded frame as torch writes it ({filename, line, name}); frames ridgescope makes up
// (autograd nodes, markers) get a file name in angle brackets, as Python's own pseudo files.
void write_frame(PickleWriter& w, const TraceReader& reader, std::uint32_t id) {
  const FrameRecord f = reader.frame(id);
  const std::string_view function = reader.string(f.function_id);
  w.begin_dict();
  switch (f.kind) {
    case FrameKind::Python:
    case FrameKind::Native:
      w.key("filename").str(reader.string(f.file_id));
      w.key("line").unsigned_integer(f.line);
      w.key("name").str(function);
      break;
    case FrameKind::Autograd: {
      const std::string_view module = reader.string(f.module_id);
      w.key("filename").str("<autograd>");
      w.key("line").integer(0);
      w.key("name").str(module.empty() ? std::string(function) : std::string(function) + " of " + std::string(module));
      break;
    }
    case FrameKind::Untracked:
      w.key("filename").str("<ridgescope>");
      w.key("line").integer(0);
      w.key("name").str(function);
      break;
  }
  w.end_dict();
}

// Where and what the allocation was: the recorded stack (innermost first, as torch writes
// frames), then one pseudo frame with ridgescope's category, label, phase, step and module, so
// memory_viz shows both when an entry is selected.
void write_pseudo_frames(PickleWriter& w, const TraceReader& reader, const LiveInfo& b) {
  w.begin_list();
  const StackView stack = reader.stack(b.stack_id);
  for (std::uint32_t i = 0; i < stack.size; ++i) {
    if (stack.frames[i] != 0) write_frame(w, reader, stack.frames[i]);
  }
  w.begin_dict();
  w.key("filename").str("ridgescope");
  w.key("line").integer(0);
  std::string name(category_text(b));
  if (b.inferred) name += " (inferred)";
  if (!b.label.empty()) name += ": " + b.label;
  name += " [phase " + b.phase + ", step " + std::to_string(b.step);
  if (!b.module.empty()) name += ", module " + b.module;
  name += "]";
  w.key("name").str(name);
  w.end_dict().end_list();
}

void write_user_metadata(PickleWriter& w, const TraceReader& reader, const LiveInfo& b) {
  w.key("user_metadata").begin_dict();
  w.key("phase").str(b.phase);
  w.key("label").str(b.label);
  w.key("module").str(b.module);
  w.key("step").unsigned_integer(b.step);
  w.key("category_inferred").boolean(b.inferred);
  if (const std::uint32_t site = reader.stack(b.stack_id).site_frame(); site != 0) {
    w.key("site").str(detail::site_text(reader, site));
  }
  w.end_dict();
}

class DevicePass {
 public:
  DevicePass(TraceReader& reader, const std::vector<BlockAttribution>& attribution, Device device,
             bool has_segments, bool collect_metadata, PickleWriter& w, Output& out,
             SnapshotWriteStats& stats)
      : reader_(reader), attribution_(attribution), device_(device), index_(export_index(device)),
        has_segments_(has_segments), collect_metadata_(collect_metadata), w_(w), out_(out), stats_(stats) {}

  // Writes this device's trace list (the entries) and keeps the end state.
  void run() {
    reader_.rewind();
    w_.begin_list();
    Event e;
    while (reader_.next(e)) {
      time_us_ = std::max(time_us_, e.time_ns / 1000);
      switch (e.kind) {
        case EventKind::Alloc: on_alloc(e); break;
        case EventKind::Free:
          if (e.device == device_) on_free(e);
          break;
        case EventKind::SegmentAlloc:
          if (e.device == device_) on_segment(e, true);
          break;
        case EventKind::SegmentFree:
          if (e.device == device_) on_segment(e, false);
          break;
        case EventKind::Oom:
          if (e.device == device_) on_oom(e);
          break;
        case EventKind::ExternalAlloc:
        case EventKind::ExternalFree:
          if (e.device == device_) on_external(e);
          break;
        case EventKind::Tag:
          if (e.device == device_) on_tag(e);
          break;
        case EventKind::PhaseBegin: on_phase(e, true); break;
        case EventKind::PhaseEnd: on_phase(e, false); break;
        case EventKind::Step: on_step(e); break;
        case EventKind::Metadata:
          if (collect_metadata_) metadata_[std::string(reader_.string(e.string_id))] = std::string(e.text);
          break;
        default: break;
      }
      out_.drain(w_, false);
    }
    // A closing SNAPSHOT entry, as torch records when a snapshot is taken; it also guarantees
    // that `unknown` is among the categories (older MemoryViz.js fails without it).
    begin_entry("snapshot", 0, live_bytes_, 0);
    w_.key("frames").begin_list().end_list();
    end_entry(Category::Unknown);
    w_.end_list();
  }

  std::vector<SegmentOut> end_segments() const {
    std::vector<SegmentOut> out;
    for (const auto& [addr, b] : outside_) {  // memory outside PyTorch: one segment each
      SegmentOut s;
      s.device = index_;
      s.address = addr;
      s.total_size = b.bytes;
      s.outside = true;
      s.blocks.push_back({addr, b.bytes, b.requested, &b});
      out.push_back(std::move(s));
    }
    std::vector<std::pair<std::uint64_t, const LiveInfo*>> blocks;
    for (const auto& [addr, b] : live_) blocks.emplace_back(addr, &b);
    std::sort(blocks.begin(), blocks.end());
    if (!has_segments_) {  // the CPU: one segment per block, allocated == reserved
      for (const auto& [addr, b] : blocks) {
        SegmentOut s;
        s.device = index_;
        s.address = addr;
        s.total_size = b->bytes;
        s.blocks.push_back({addr, b->bytes, b->requested, b});
        out.push_back(std::move(s));
      }
      return out;
    }
    std::size_t bi = 0;
    for (const auto& [addr, seg] : segments_) {
      const std::uint64_t size = seg.first;
      SegmentOut s;
      s.device = index_;
      s.address = addr;
      s.total_size = size;
      s.stream = seg.second;
      std::uint64_t at = addr;
      while (bi < blocks.size() && blocks[bi].first < addr) ++bi;  // blocks outside any segment
      while (bi < blocks.size() && blocks[bi].first < addr + size) {
        const auto& [baddr, b] = blocks[bi++];
        if (baddr < at || baddr + b->bytes > addr + size) continue;  // overlapping: inconsistent
        if (baddr > at) s.blocks.push_back({at, baddr - at, 0, nullptr});
        s.blocks.push_back({baddr, b->bytes, b->requested, b});
        at = baddr + b->bytes;
      }
      if (at < addr + size) s.blocks.push_back({at, addr + size - at, 0, nullptr});
      out.push_back(std::move(s));
    }
    return out;
  }

  std::vector<Annotation>& annotations() { return annotations_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  void begin_entry(std::string_view action, std::uint64_t addr, std::uint64_t size, std::uint64_t stream) {
    w_.begin_dict();
    w_.key("action").str(action);
    w_.key("addr").unsigned_integer(addr);
    w_.key("size").unsigned_integer(size);
    w_.key("stream").unsigned_integer(stream);
    w_.key("time_us").unsigned_integer(time_us_);
  }
  void end_entry(Category c) { end_entry(category_name(c)); }
  void end_entry(std::string_view category) {
    w_.key("category").str(category);
    w_.end_dict();
    ++entries_;
    ++stats_.trace_entries;
  }

  std::string current_phase() const {
    return phase_stack_.empty() ? std::string("idle") : std::string(reader_.string(phase_stack_.back()));
  }

  void write_block_entry(std::string_view action, std::uint64_t addr, const LiveInfo& b, std::uint64_t stream) {
    begin_entry(action, addr, b.requested, stream);
    w_.key("frames");
    write_pseudo_frames(w_, reader_, b);
    write_user_metadata(w_, reader_, b);
    if (action == "alloc") w_.key("block_size").unsigned_integer(b.bytes);
    if (b.outside) w_.key(kOutsideKey).boolean(true);
    end_entry(category_text(b));
  }

  void write_segment_entry(std::string_view action, std::uint64_t addr, std::uint64_t bytes, Category c,
                           std::uint64_t stream) {
    begin_entry(action, addr, bytes, stream);
    w_.key("frames").begin_list().end_list();
    end_entry(c);
  }

  void on_alloc(const Event& e) {
    const std::uint64_t ordinal = next_alloc_++;
    if (e.device != device_) return;
    LiveInfo b;
    b.bytes = e.bytes;
    b.requested = e.requested_bytes != 0 ? e.requested_bytes : e.bytes;
    b.step = step_;
    b.phase = current_phase();
    b.module = std::string(reader_.string(e.string_id));
    b.stack_id = e.stack_id;
    if (ordinal < attribution_.size()) {
      const BlockAttribution& a = attribution_[ordinal];
      b.category = a.category;
      b.inferred = a.inferred;
      b.label = std::string(reader_.string(a.label_id));
    }
    // An alloc over a live block means the trace missed its free (the analysis drops the old
    // block there): say so to memory_viz with a free, so its picture stays consistent.
    if (live_.contains(e.addr)) on_free(e);
    if (!has_segments_) write_segment_entry("segment_alloc", e.addr, b.bytes, b.category, e.stream);
    auto [it, inserted] = live_.insert_or_assign(e.addr, std::move(b));
    (void)inserted;
    write_block_entry("alloc", e.addr, it->second, e.stream);
    live_bytes_ += it->second.bytes;
    ++stats_.allocations;
  }

  void on_free(const Event& e) {
    auto it = live_.find(e.addr);
    if (it == live_.end()) return;  // a block the trace never saw allocated: not exported
    const LiveInfo& b = it->second;
    write_block_entry("free_requested", e.addr, b, e.stream);
    write_block_entry("free_completed", e.addr, b, e.stream);
    if (!has_segments_) write_segment_entry("segment_free", e.addr, b.bytes, b.category, e.stream);
    live_bytes_ -= b.bytes;
    live_.erase(it);
  }

  // A strong tag that changes a live block's category or label (the analysis applies it from
  // then on): an "annotate" entry carrying the new category, as torch records annotations.
  void on_tag(const Event& e) {
    if (e.flags & kTagWeak) return;  // weak tags only decide the category at allocation
    auto it = live_.find(e.addr);
    if (it == live_.end()) return;
    LiveInfo& b = it->second;
    const std::string label(reader_.string(e.string_id));
    if (b.category == e.category && (e.string_id == 0 || b.label == label)) return;
    b.category = e.category;
    b.inferred = false;
    if (e.string_id != 0) b.label = label;
    begin_entry("annotate", e.addr, b.requested, e.stream);
    w_.key("frames");
    write_pseudo_frames(w_, reader_, b);
    write_user_metadata(w_, reader_, b);
    end_entry(b.category);
  }

  // Memory outside PyTorch: a segment of its own holding one block, both in the non_pytorch
  // category, from its external_alloc to its external_free.
  void on_external(const Event& e) {
    if (e.kind == EventKind::ExternalAlloc) {
      if (outside_.contains(e.addr)) close_external(e.addr, e.stream);
      LiveInfo b;
      b.bytes = b.requested = e.bytes;
      b.step = step_;
      b.phase = current_phase();
      b.outside = true;
      const std::string_view library = reader_.string(e.string_id);
      b.label = (library.empty() ? std::string("unknown") : std::string(library)) + " (" +
                std::string(external_api_name(external_api_from_byte(e.flags))) + ")";
      b.stack_id = e.stack_id;
      auto [it, inserted] = outside_.insert_or_assign(e.addr, std::move(b));
      (void)inserted;
      write_outside_segment_entry("segment_alloc", e.addr, it->second, e.stream);
      write_block_entry("alloc", e.addr, it->second, e.stream);
      ++stats_.outside_allocations;
    } else {
      close_external(e.addr, e.stream);
    }
  }
  void close_external(std::uint64_t addr, std::uint64_t stream) {
    auto it = outside_.find(addr);
    if (it == outside_.end()) return;
    write_block_entry("free_requested", addr, it->second, stream);
    write_block_entry("free_completed", addr, it->second, stream);
    write_outside_segment_entry("segment_free", addr, it->second, stream);
    outside_.erase(it);
  }
  void write_outside_segment_entry(std::string_view action, std::uint64_t addr, const LiveInfo& b,
                                   std::uint64_t stream) {
    begin_entry(action, addr, b.bytes, stream);
    w_.key("frames").begin_list().end_list();
    w_.key(kOutsideKey).boolean(true);
    end_entry(kOutsideCategory);
  }

  void on_segment(const Event& e, bool alloc) {
    if (alloc) {
      segments_[e.addr] = {e.bytes, e.stream};
      write_segment_entry("segment_alloc", e.addr, e.bytes, Category::Unknown, e.stream);
    } else {
      auto it = segments_.find(e.addr);
      const std::uint64_t bytes = it == segments_.end() ? e.bytes : it->second.first;
      if (it != segments_.end()) segments_.erase(it);
      write_segment_entry("segment_free", e.addr, bytes, Category::Unknown, e.stream);
    }
  }

  void on_oom(const Event& e) {
    w_.begin_dict();
    w_.key("action").str("oom");
    w_.key("size").unsigned_integer(e.bytes);
    w_.key("device_free").unsigned_integer(e.value);
    w_.key("stream").unsigned_integer(e.stream);
    w_.key("time_us").unsigned_integer(time_us_);
    w_.key("frames").begin_list().end_list();
    end_entry(Category::Unknown);
  }

  void on_phase(const Event& e, bool begin) {
    Annotation a;
    a.name = std::string(reader_.string(e.string_id));
    a.stage = begin ? "START" : "END";
    a.device = index_;
    a.time_us = time_us_;
    a.trace_index = entries_;
    annotations_.push_back(std::move(a));
    if (begin) {
      phase_stack_.push_back(e.string_id);
      return;
    }
    for (std::size_t i = phase_stack_.size(); i-- > 0;) {
      if (phase_stack_[i] == e.string_id) {
        phase_stack_.resize(i);
        break;
      }
    }
  }

  void on_step(const Event& e) {
    Annotation a;
    a.name = std::string(kStepAnnotation);
    a.stage = "END";
    a.device = index_;
    a.time_us = time_us_;
    a.trace_index = entries_;
    a.step = e.value;
    annotations_.push_back(std::move(a));
    step_ = e.value + 1;
  }

  TraceReader& reader_;
  const std::vector<BlockAttribution>& attribution_;
  const Device device_;
  const int index_;
  const bool has_segments_;
  const bool collect_metadata_;
  PickleWriter& w_;
  Output& out_;
  SnapshotWriteStats& stats_;
  std::uint64_t next_alloc_ = 0;
  std::uint64_t entries_ = 0;
  std::uint64_t time_us_ = 0;
  std::uint64_t step_ = 0;
  std::uint64_t live_bytes_ = 0;
  std::vector<std::uint32_t> phase_stack_;
  absl::flat_hash_map<std::uint64_t, LiveInfo> live_;
  std::map<std::uint64_t, LiveInfo> outside_;  // memory outside PyTorch, by address
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> segments_;  // addr -> (bytes, stream)
  std::vector<Annotation> annotations_;
  std::map<std::string, std::string> metadata_;
};

void write_segment(PickleWriter& w, const TraceReader& reader, const SegmentOut& s) {
  std::uint64_t allocated = 0, requested = 0;
  for (const auto& b : s.blocks) {
    if (b.live == nullptr) continue;
    allocated += b.size;
    requested += b.requested;
  }
  w.begin_dict();
  w.key("device").integer(s.device);
  w.key("address").unsigned_integer(s.address);
  w.key("total_size").unsigned_integer(s.total_size);
  w.key("allocated_size").unsigned_integer(allocated);
  w.key("active_size").unsigned_integer(allocated);
  w.key("requested_size").unsigned_integer(requested);
  w.key("stream").unsigned_integer(s.stream);
  w.key("segment_type").str(s.total_size <= kSmallSegmentBytes ? "small" : "large");
  w.key("segment_pool_id").begin_tuple().integer(0).integer(0).end_tuple();
  w.key("is_expandable").boolean(false);
  if (s.outside) w.key(kOutsideKey).boolean(true);
  w.key("frames").begin_list().end_list();
  w.key("blocks").begin_list();
  for (const auto& b : s.blocks) {
    w.begin_dict();
    w.key("address").unsigned_integer(b.address);
    w.key("size").unsigned_integer(b.size);
    w.key("requested_size").unsigned_integer(b.requested);
    w.key("state").str(b.live != nullptr ? "active_allocated" : "inactive");
    w.key("frames");
    if (b.live != nullptr) {
      write_pseudo_frames(w, reader, *b.live);
      w.key("category").str(category_text(*b.live));
    } else {
      w.begin_list().end_list();
    }
    w.end_dict();
  }
  w.end_list();
  w.end_dict();
}

}  // namespace

SnapshotWriteStats write_snapshot(const std::string& trace_path, const std::string& out_path,
                                  const SnapshotWriteOptions& options) {
  const std::vector<BlockAttribution> attribution = attribute_blocks(trace_path);
  TraceReader reader(trace_path);

  // Which devices allocate, and which have segments (the CUDA caching allocator).
  std::set<std::pair<int, int>> alloc_devices, segment_devices;
  auto key = [](Device d) { return std::make_pair(static_cast<int>(d.type), static_cast<int>(d.index)); };
  {
    Event e;
    while (reader.next(e)) {
      if (e.kind == EventKind::Alloc) alloc_devices.insert(key(e.device));
      if (e.kind == EventKind::SegmentAlloc) segment_devices.insert(key(e.device));
    }
  }
  std::vector<Device> devices;  // in device_traces order
  if (options.device) {
    devices.push_back(*options.device);
  } else {
    for (const auto& [type, index] : alloc_devices) {
      if (type == static_cast<int>(DeviceType::CUDA) && index >= 0) {
        devices.push_back(Device{DeviceType::CUDA, static_cast<std::int16_t>(index)});
      }
    }
    if (devices.empty()) devices.push_back(Device{});  // the CPU (also for an empty trace)
  }
  std::sort(devices.begin(), devices.end(), [](Device a, Device b) { return export_index(a) < export_index(b); });

  SnapshotWriteStats stats;
  Output out(out_path);
  PickleWriter w(/*memoize_strings=*/true);  // keys, categories, labels: written once each
  w.begin_dict();
  w.key("device_traces").begin_list();
  std::vector<SegmentOut> segments;
  std::vector<Annotation> annotations;
  std::map<std::string, std::string> metadata;
  std::vector<std::unique_ptr<DevicePass>> passes;  // kept alive: segments point into them
  int next_index = 0;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const Device d = devices[i];
    for (; next_index < export_index(d); ++next_index) w.begin_list().end_list();  // devices not exported
    passes.push_back(std::make_unique<DevicePass>(reader, attribution, d, segment_devices.count(key(d)) > 0,
                                                  i == 0, w, out, stats));
    passes.back()->run();
    ++next_index;
    for (auto& s : passes.back()->end_segments()) segments.push_back(std::move(s));
    for (auto& a : passes.back()->annotations()) annotations.push_back(std::move(a));
    if (i == 0) metadata = passes.back()->metadata();
  }
  w.end_list();

  w.key("segments").begin_list();
  for (const SegmentOut& s : segments) {
    write_segment(w, reader, s);
    out.drain(w, false);
  }
  w.end_list();
  stats.segments = segments.size();

  // Phases as torch's record_function annotations (name, stage START/END), with the position in
  // the device's trace so that a reader can place them exactly.
  w.key("external_annotations").begin_list();
  for (const Annotation& a : annotations) {
    w.begin_dict();
    w.key("name").str(a.name);
    w.key("stage").str(a.stage);
    w.key("device").integer(a.device);
    w.key("time_us").unsigned_integer(a.time_us);
    w.key("trace_index").unsigned_integer(a.trace_index);
    if (a.step) w.key("step").unsigned_integer(*a.step);
    w.end_dict();
    out.drain(w, false);
  }
  w.end_list();
  stats.annotations = annotations.size();

  const bool cpu = devices.size() == 1 && devices[0].type == DeviceType::CPU;
  w.key("allocator_settings").begin_dict();
  w.key("PYTORCH_CUDA_ALLOC_CONF").str("");
  w.key("expandable_segments").boolean(false);
  w.key("ridgescope_allocator").str(cpu ? "cpu (no cache: one segment per block, allocated == reserved)"
                                        : "cuda caching allocator");
  w.end_dict();

  // What a ridgescope reader needs to read its own export back exactly.
  w.key("ridgescope").begin_dict();
  w.key("producer").str("ridgescope");
  w.key("format").integer(1);
  w.key("devices").begin_list();
  for (Device d : devices) w.str(device_name(d));
  w.end_list();
  w.key("trace").str(trace_path);
  w.key("truncated").boolean(reader.truncated());
  w.key("metadata").begin_dict();
  for (const auto& [k, v] : metadata) w.key(k).str(v);
  w.end_dict();
  w.end_dict();

  w.end_dict();
  w.finish();
  out.drain(w, true);
  stats.bytes = out.close();
  return stats;
}

}  // namespace ridgescope
