// trace_follower.cpp — TraceFollower (ridgescope/flight.h): reads a trace while it is written.
// Each poll reads the whole chunks appended since the last one (a chunk still being written is
// read at the next poll), feeding them to a step summarizer for the current state and keeping
// the summary records. A file whose identity changed or that shrank was rewritten (a flight
// recorder's rewrite): it is read again from its start.
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "byte_codec.h"
#include "record_codec.h"
#include "ridgescope/flight.h"
#include "ridgescope/trace_format.h"
#include "step_summarizer.h"

namespace ridgescope {

struct TraceFollower::State {
  std::string path;
  View view;
  std::uint64_t inode = 0, device = 0;
  bool started = false;
  std::uint32_t version = 0;
  std::uint64_t offset = 0;  // of the next chunk to read
  detail::CodecClock clock;
  detail::StepSummarizer summarizer;
  detail::FlightPayload flight;
  std::vector<std::string> strings{std::string()};

  void restart() {
    const std::uint64_t rewrites = view.rewrites;
    view = View{};
    view.rewrites = rewrites;
    started = false;
    offset = 0;
    clock = detail::CodecClock{};
    summarizer = detail::StepSummarizer{};
    strings.assign(1, std::string());
  }

  void on_record(const Event& e) {
    switch (e.kind) {
      case EventKind::String:
        if (e.string_id != 0 && e.string_id < strings.size() + 1'000'000) {
          if (e.string_id >= strings.size()) strings.resize(e.string_id + 1);
          strings[e.string_id].assign(e.text.data(), e.text.size());
        }
        break;
      case EventKind::Metadata:
        if (e.string_id < strings.size() && strings[e.string_id] == "session") view.ended = true;
        break;
      case EventKind::StepSummary: view.summaries.push_back(flight.summary); break;
      default: break;
    }
    summarizer.on_event(e);
    if (e.kind == EventKind::Checkpoint) summarizer.on_checkpoint(flight.checkpoint);
    if (e.kind == EventKind::CheckpointBlock) summarizer.on_checkpoint_block(flight.block);
    summarizer.completed().clear();  // the trace's own summary records are the ones shown
  }

  // Reads what the file holds past `offset`; false when it could not be read at all.
  void read(std::FILE* f, std::uint64_t size) {
    if (!started) {
      char header[trace_format::kFileHeaderBytes];
      if (size < sizeof header || std::fread(header, 1, sizeof header, f) != sizeof header) {
        view.problem = "the trace has no file header yet";
        return;
      }
      if (std::memcmp(header, trace_format::kFileMagic, 8) != 0) {
        view.problem = "'" + path + "' is not a ridgescope trace (bad magic at byte offset 0)";
        return;
      }
      version = detail::get_u32(header + 8);
      if (version < trace_format::kMinVersion || version > trace_format::kVersion) {
        view.problem = "'" + path + "' has trace format version " + std::to_string(version);
        return;
      }
      started = true;
      offset = trace_format::kFileHeaderBytes;
    }
    view.readable = true;
    view.problem.clear();
    std::string payload;
    while (offset + trace_format::kChunkHeaderBytes <= size) {
      char header[trace_format::kChunkHeaderBytes];
      if (std::fseek(f, static_cast<long>(offset), SEEK_SET) != 0 ||
          std::fread(header, 1, sizeof header, f) != sizeof header) {
        return;
      }
      const std::uint32_t length = detail::get_u32(header + 4);
      if (detail::get_u32(header) != trace_format::kChunkMagic || length > trace_format::kMaxChunkBytes) {
        view.problem = "corrupt trace: no chunk at byte offset " + std::to_string(offset);
        return;
      }
      if (offset + sizeof header + length > size) return;  // still being written
      payload.resize(length);
      if (length > 0 && std::fread(&payload[0], 1, length, f) != length) return;
      if (detail::crc32(payload) != detail::get_u32(header + 12)) {
        view.problem = "corrupt trace: checksum mismatch in the chunk at byte offset " + std::to_string(offset);
        return;
      }
      std::size_t pos = 0;
      while (pos < payload.size()) {
        Event e;
        detail::Definition definition;
        const auto status = detail::decode_record(payload, &pos, clock, &e, version, &definition, &flight);
        if (status == detail::DecodeStatus::Malformed) {
          view.problem = "corrupt trace: malformed record in the chunk at byte offset " + std::to_string(offset);
          return;
        }
        if (status == detail::DecodeStatus::Ok) on_record(e);
      }
      offset += sizeof header + length;
    }
  }
};

TraceFollower::TraceFollower(std::string path) : state_(std::make_unique<State>()) { state_->path = std::move(path); }
TraceFollower::~TraceFollower() = default;

std::string TraceFollower::string(std::uint32_t id) const {
  return id < state_->strings.size() ? state_->strings[id] : std::string();
}

const TraceFollower::View& TraceFollower::poll() noexcept {
  State& s = *state_;
  try {
    // The open file's own identity and size: a rewrite renamed over the path between a stat
    // and an open would otherwise be read at the old file's offset.
    std::FILE* f = std::fopen(s.path.c_str(), "rb");
    struct stat st {};
    if (f == nullptr || ::fstat(fileno(f), &st) != 0) {
      if (f != nullptr) std::fclose(f);
      s.view.readable = false;
      s.view.problem = "no trace at '" + s.path + "' yet";
      return s.view;
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    const bool replaced = s.started && (static_cast<std::uint64_t>(st.st_ino) != s.inode ||
                                        static_cast<std::uint64_t>(st.st_dev) != s.device || size < s.offset);
    if (replaced) {
      s.restart();
      ++s.view.rewrites;
    }
    s.inode = static_cast<std::uint64_t>(st.st_ino);
    s.device = static_cast<std::uint64_t>(st.st_dev);
    s.read(f, size);
    std::fclose(f);
    s.view.file_bytes = size;
    s.view.step = s.summarizer.current_step();
    s.view.phases.clear();
    for (std::uint32_t id : s.summarizer.open_phases()) s.view.phases.push_back(string(id));
    s.view.time_ns = s.summarizer.last_time_ns();
    s.view.devices.clear();
    for (const auto& d : s.summarizer.devices()) {
      s.view.devices.push_back(DeviceNow{d.device, d.live_bytes, d.reserved_bytes, d.by_category});
    }
  } catch (const std::exception& ex) {
    s.view.problem = ex.what();
  } catch (...) {
    s.view.problem = "cannot read the trace";
  }
  return s.view;
}

}  // namespace ridgescope
