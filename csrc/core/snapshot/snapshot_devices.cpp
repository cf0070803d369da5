// snapshot_devices.cpp — a snapshot pickle, device by device: which devices it holds memory for,
// each one replayed on its own (snapshot_reader.cpp) and analysed, the per-device summary, and
// the report of the device asked for or of the one whose live bytes peak highest (see
// ridgescope/snapshot.h and docs/snapshot.md, "Devices").
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include "pickle_reader.h"
#include "ridgescope/snapshot.h"
#include "snapshot_document.h"
#include "snapshot_entries.h"
#include "snapshot_replay.h"

namespace ridgescope {
namespace {

using detail::PickleValue;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw SnapshotError("cannot read '" + path + "': " + std::strerror(errno), 0);
  const std::streamoff size = f.tellg();
  std::string out;
  if (size > 0) {  // read in place: one copy of the file, not two
    out.resize(static_cast<std::size_t>(size));
    f.seekg(0);
    f.read(out.data(), size);
    if (f.gcount() != size) throw SnapshotError("cannot read '" + path + "': it changed while being read", 0);
  } else {  // a pipe or a special file: whatever it yields
    f.clear();
    f.seekg(0);
    std::ostringstream ss;
    ss << f.rdbuf();
    out = ss.str();
  }
  return out;
}

// A temporary trace file, removed when done.
class TempTrace {
 public:
  TempTrace() {
    const char* dir = std::getenv("TMPDIR");
    std::string tmpl = std::string(dir != nullptr && *dir ? dir : "/tmp") + "/ridgescope-snapshot-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const int fd = ::mkstemp(buf.data());
    if (fd < 0) throw SnapshotError(std::string("cannot create a temporary file: ") + std::strerror(errno), 0);
    ::close(fd);
    path_ = buf.data();
  }
  ~TempTrace() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};


// The file's bytes, the tree read from them, and the documents each device's replay reads from
// the tree. The tree is the largest thing held (about 5 bytes per byte of the file); once the
// documents are read it is released (their strings point into the bytes, which stay; they are
// held by pointer so that moving this never moves them).
struct ParsedSnapshot {
  std::unique_ptr<const std::string> file;
  detail::PickleResult parsed;
  int protocol = 0;
  std::map<int, std::unique_ptr<detail::SnapshotDocument>> documents;
  std::uint64_t size() const { return file->size(); }

  // Reads the documents of `devices` (each with `options` and its device index), then releases the tree.
  void read_documents(const std::vector<int>& devices, const SnapshotReadOptions& options) {
    for (int d : devices) {
      SnapshotReadOptions o = options;
      o.device_index = d;
      documents[d] = detail::read_snapshot_device(parsed.root, size(), o);
    }
    parsed = detail::PickleResult{};
  }
};

ParsedSnapshot parse_snapshot(const std::string& pickle_path) {
  ParsedSnapshot p;
  p.file = std::make_unique<const std::string>(read_file(pickle_path));
  try {
    p.parsed = detail::parse_pickle(*p.file);
    p.protocol = p.parsed.protocol;
  } catch (const detail::PickleError& e) {
    throw SnapshotError("'" + pickle_path + "' is not a readable snapshot pickle: " + e.what(), e.offset());
  }
  return p;
}

// CUDA ordinals a device index can hold (ridgescope's Device::index is 16 bits).
constexpr std::uint64_t kMaxDevices = 32768;

[[noreturn]] void too_many_devices(std::uint64_t device) {
  throw SnapshotError("not a usable torch memory snapshot: it names device " + std::to_string(device) +
                          "; CUDA devices are numbered 0 to " + std::to_string(kMaxDevices - 1),
                      0);
}

// The devices a snapshot holds memory for, with their segment counts: every `device` of its
// segments and every device_traces list with an entry that replays something (an allocation, a
// free, a segment, an OOM). Segments and traces may disagree (device_traces has one list per
// visible GPU, most of them empty, or holding only a `snapshot` marker). Like the replay, the
// scan visits at most four entries per byte of the file (plus 65536): device lists that share
// one huge list through the memo are a decompression bomb, refused.
std::map<int, std::uint64_t> snapshot_devices(const PickleValue& root, std::uint64_t file_bytes) {
  std::map<int, std::uint64_t> out;
  detail::VisitBudget budget(file_bytes);  // (one budget for the scan; each replay then has its own)
  const std::string where = "device_traces";
  const PickleValue* segments = root.is_list_like() ? &root : root.is_dict() ? root.get("segments") : nullptr;
  if (segments != nullptr && segments->is_list_like()) {
    for (const PickleValue& s : segments->list()) {
      if (!s.is_dict()) continue;
      // a ridgescope export's memory outside PyTorch is not one of the allocator's segments
      if (outside_pytorch(s)) continue;
      std::uint64_t d = 0;
      if (const PickleValue* v = s.get("device"); v != nullptr && !v->to_uint64(&d)) continue;
      if (d >= kMaxDevices) too_many_devices(d);
      ++out[static_cast<int>(d)];
    }
  }
  const PickleValue* traces = root.is_dict() ? root.get("device_traces") : nullptr;
  if (traces != nullptr && traces->is_list_like()) {
    for (std::size_t i = 0; i < traces->list().size(); ++i) {
      const PickleValue& t = traces->list()[i];
      if (!t.is_list_like()) continue;
      for (const PickleValue& e : t.list()) {
        budget.take(1, where);
        const PickleValue* a = e.is_dict() ? e.get("action") : nullptr;
        if (a != nullptr && a->is_str() && detail::replays(detail::parse_entry_action(a->str()))) {
          if (i >= kMaxDevices) too_many_devices(i);
          out.try_emplace(static_cast<int>(i), 0);
          break;
        }
      }
    }
  }
  // Each device's replay walks every segment: many devices over many segments is more work
  // than a file of this size can ask for.
  const std::uint64_t n_segments = segments != nullptr && segments->is_list_like() ? segments->list().size() : 0;
  if (out.size() > 1 && out.size() * (n_segments + 1) > detail::VisitBudget::allowance(file_bytes)) {
    throw SnapshotError("not a usable torch memory snapshot: " + std::to_string(out.size()) + " devices over " +
                            std::to_string(n_segments) + " segments is more than its " + std::to_string(file_bytes) +
                            " bytes can hold (each device is replayed on its own)",
                        0);
  }
  return out;
}

std::string device_list(const std::map<int, std::uint64_t>& devices) {
  std::string out;
  for (const auto& [d, n] : devices) out += (out.empty() ? "" : ", ") + ("cuda:" + std::to_string(d));
  return out;
}

// Replays one device (options.device_index, resolved; its document read) into a trace at `trace_path`.
SnapshotImport convert(const ParsedSnapshot& p, const std::string& trace_path, const SnapshotReadOptions& options,
                       std::uint64_t* peak_bytes = nullptr) {
  Recorder rec(trace_path);
  SnapshotImport info = detail::replay_snapshot_document(*p.documents.at(*options.device_index), p.protocol, options,
                                                         rec, peak_bytes);
  rec.close();
  if (rec.failed()) throw SnapshotError("cannot write the replayed trace '" + trace_path + "': " + rec.error(), 0);
  return info;
}

// The devices to replay: the one asked for (which must hold memory when any does), else all.
std::vector<int> devices_to_replay(const std::map<int, std::uint64_t>& devices, const SnapshotReadOptions& options) {
  if (options.device_index) {
    const int d = *options.device_index;
    if (d < 0) throw SnapshotError("device index " + std::to_string(d) + " is negative", 0);
    if (!devices.empty() && !devices.contains(d)) {
      throw SnapshotError("the snapshot records no memory on cuda:" + std::to_string(d) + " (it has " +
                              device_list(devices) + ")",
                          0);
    }
    return {d};
  }
  std::vector<int> out;
  for (const auto& [d, n] : devices) out.push_back(d);
  if (out.empty()) out.push_back(0);  // an empty snapshot: an empty report of cuda:0
  return out;
}

}  // namespace

bool looks_like_pickle(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  const int c = std::fgetc(f);
  std::fclose(f);
  return c == 0x80;
}

SnapshotImport snapshot_to_trace(const std::string& pickle_path, const std::string& trace_path,
                                 const SnapshotReadOptions& options) {
  ParsedSnapshot p = parse_snapshot(pickle_path);
  const std::vector<int> devices = devices_to_replay(snapshot_devices(p.parsed.root, p.size()), options);
  p.read_documents(devices, options);
  SnapshotReadOptions chosen = options;
  chosen.device_index = devices.front();
  if (devices.size() > 1) {  // the device whose live bytes peak highest
    std::uint64_t best = 0;
    for (int d : devices) {
      TempTrace temp;
      SnapshotReadOptions o = options;
      o.device_index = d;
      std::uint64_t peak = 0;
      convert(p, temp.path(), o, &peak);
      if (peak > best) {
        best = peak;
        chosen.device_index = d;
      }
    }
  }
  return convert(p, trace_path, chosen);
}

Report analyze_snapshot(const std::string& pickle_path, const AnalysisOptions& analysis,
                        const SnapshotReadOptions& options) {
  // Every device is replayed into a trace of its own first. The parsed tree (the largest thing
  // held) is released once the devices' documents are read, before their replays; the file's
  // bytes, which the documents point into, before the analyses run.
  struct Replayed {
    int device;
    std::unique_ptr<TempTrace> trace;
    SnapshotImport info;
  };
  std::vector<Replayed> replayed;
  std::map<int, std::uint64_t> held;
  std::uint64_t file_bytes = 0;
  {
    ParsedSnapshot p = parse_snapshot(pickle_path);
    file_bytes = p.size();
    held = snapshot_devices(p.parsed.root, p.size());
    const std::vector<int> devices = devices_to_replay(held, options);
    p.read_documents(devices, options);
    for (int d : devices) {
      auto temp = std::make_unique<TempTrace>();
      SnapshotReadOptions o = options;
      o.device_index = d;
      SnapshotImport info = convert(p, temp->path(), o);
      replayed.push_back({d, std::move(temp), std::move(info)});
    }
  }
  std::optional<Report> report;
  std::vector<SnapshotDevice> rows;
  for (Replayed& x : replayed) {
    AnalysisOptions a = analysis;
    a.device = x.info.device == "cpu" ? Device{} : Device{DeviceType::CUDA, static_cast<std::int16_t>(x.device)};
    Report r = analyze_trace(x.trace->path(), a);
    x.trace.reset();
    SnapshotDevice row;
    row.device = x.info.device;
    if (auto it = held.find(x.device); it != held.end()) row.segments = it->second;
    row.trace_entries = x.info.trace_entries;
    row.peak_bytes = r.peak.bytes;
    row.peak_reserved_bytes = r.peak.reserved_bytes;
    row.peak_by_category = r.peak.by_category;
    row.end_live_bytes = r.final_live_bytes;
    row.end_reserved_bytes = r.final_reserved_bytes;
    rows.push_back(row);
    if (!report || r.peak.bytes > report->peak.bytes) {
      r.snapshot = std::move(x.info);
      report = std::move(r);
    }
  }
  report->trace.path = pickle_path;
  report->trace.file_bytes = file_bytes;
  report->snapshot->devices = std::move(rows);
  report->snapshot->device_choice = options.device_index ? "asked" : "highest_peak";
  return *std::move(report);
}

}  // namespace ridgescope
