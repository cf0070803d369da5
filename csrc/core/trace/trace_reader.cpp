#include "ridgescope/trace_reader.h"

#include <cerrno>
#include <cstring>

#include "byte_codec.h"
#include "record_codec.h"
#include "ridgescope/trace_format.h"

namespace ridgescope {
namespace {
constexpr std::uint32_t kMaxStrings = 16'000'000;
}  // namespace

struct TraceReader::Flight {
  detail::FlightPayload payload;
};

TraceReader::TraceReader(const std::string& path) : path_(path), flight_(std::make_unique<Flight>()) {
  file_ = std::fopen(path.c_str(), "rb");
  if (file_ == nullptr) {
    throw TraceError("cannot open trace '" + path + "': " + std::strerror(errno), 0);
  }
  std::fseek(file_, 0, SEEK_END);
  const long size = std::ftell(file_);
  file_bytes_ = size > 0 ? static_cast<std::uint64_t>(size) : 0;
  std::fseek(file_, 0, SEEK_SET);
  char header[trace_format::kFileHeaderBytes];
  const std::size_t got = std::fread(header, 1, sizeof header, file_);
  if (got < 8 || std::memcmp(header, trace_format::kFileMagic, 8) != 0) {
    std::fclose(file_);
    file_ = nullptr;
    throw TraceError("'" + path + "' is not a ridgescope trace (bad magic at byte offset 0)", 0);
  }
  if (got < sizeof header) {
    std::fclose(file_);
    file_ = nullptr;
    throw TraceError("'" + path + "' is truncated inside its file header (byte offset " +
                         std::to_string(got) + ")",
                     got);
  }
  version_ = detail::get_u32(header + 8);
  if (version_ < trace_format::kMinVersion || version_ > trace_format::kVersion) {
    std::fclose(file_);
    file_ = nullptr;
    throw TraceError("'" + path + "' has trace format version " + std::to_string(version_) +
                         "; this ridgescope reads versions " +
                         std::to_string(trace_format::kMinVersion) + " to " +
                         std::to_string(trace_format::kVersion) + " (byte offset 8)",
                     8);
  }
  offset_ = trace_format::kFileHeaderBytes;
  strings_.emplace_back();  // id 0: the empty string
  frames_.emplace_back();
  stacks_.emplace_back();
}

TraceReader::~TraceReader() {
  if (file_ != nullptr) std::fclose(file_);
}

void TraceReader::stop(std::uint64_t offset, std::string problem) {
  done_ = true;
  truncated_ = true;
  truncated_at_ = offset;
  problem_ = std::move(problem);
}

bool TraceReader::load_chunk() {
  if (offset_ == file_bytes_) {
    done_ = true;
    return false;
  }
  char header[trace_format::kChunkHeaderBytes];
  std::fseek(file_, static_cast<long>(offset_), SEEK_SET);
  if (std::fread(header, 1, sizeof header, file_) != sizeof header) {
    stop(offset_, "trace ends inside a chunk header at byte offset " + std::to_string(offset_) +
                      " (the recording process probably stopped while writing)");
    return false;
  }
  if (detail::get_u32(header) != trace_format::kChunkMagic) {
    stop(offset_, "corrupt trace: no chunk marker at byte offset " + std::to_string(offset_));
    return false;
  }
  const std::uint32_t length = detail::get_u32(header + 4);
  const std::uint32_t records = detail::get_u32(header + 8);
  const std::uint32_t crc = detail::get_u32(header + 12);
  if (length > trace_format::kMaxChunkBytes) {
    stop(offset_, "corrupt trace: chunk at byte offset " + std::to_string(offset_) + " claims " +
                      std::to_string(length) + " bytes (limit " +
                      std::to_string(trace_format::kMaxChunkBytes) + ")");
    return false;
  }
  const std::uint64_t payload_offset = offset_ + sizeof header;
  if (payload_offset + length > file_bytes_) {
    stop(offset_, "trace ends inside the chunk at byte offset " + std::to_string(offset_) +
                      " (" + std::to_string(file_bytes_ - payload_offset) + " of " +
                      std::to_string(length) +
                      " bytes present; the recording process probably stopped while writing)");
    return false;
  }
  chunk_.resize(length);
  if (length > 0 && std::fread(&chunk_[0], 1, length, file_) != length) {
    stop(offset_, "read error in the chunk at byte offset " + std::to_string(offset_));
    return false;
  }
  if (detail::crc32(chunk_) != crc) {
    stop(offset_, "corrupt trace: checksum mismatch in the chunk at byte offset " +
                      std::to_string(offset_));
    return false;
  }
  chunk_offset_ = payload_offset;
  offset_ = payload_offset + length;
  pos_ = 0;
  chunk_records_left_ = records;
  return true;
}

bool TraceReader::next(Event& out) {
  while (!done_) {
    if (pos_ >= chunk_.size() || chunk_records_left_ == 0) {
      if (pos_ != chunk_.size() || chunk_records_left_ != 0) {
        stop(chunk_offset_ + pos_, "corrupt trace: the chunk's record count disagrees with its "
                                   "contents (byte offset " + std::to_string(chunk_offset_ + pos_) + ")");
        return false;
      }
      if (!load_chunk()) return false;
      continue;
    }
    const std::size_t record_start = pos_;
    detail::CodecClock clock{last_time_ns_};
    Event e;
    detail::Definition definition;
    const auto status = detail::decode_record(chunk_, &pos_, clock, &e, version_, &definition, &flight_->payload);
    --chunk_records_left_;
    if (status == detail::DecodeStatus::Malformed) {
      stop(chunk_offset_ + record_start,
           "corrupt trace: malformed record at byte offset " +
               std::to_string(chunk_offset_ + record_start));
      return false;
    }
    last_time_ns_ = clock.last_time_ns;  // unknown timed kinds advance the clock too
    if (status == detail::DecodeStatus::UnknownKind) {
      ++skipped_records_;
      continue;
    }
    if (e.kind == EventKind::TimeBase) continue;  // absorbed: the chain restarts here
    if (e.kind == EventKind::String || e.kind == EventKind::Metadata ||
        static_cast<std::uint8_t>(e.kind) >= 64) {
      e.time_ns = last_time_ns_;  // untimed records happen "now"
    }
    if ((e.kind == EventKind::Frame || e.kind == EventKind::Stack) && 
        !define(e, record_start, definition.frame, definition.site, definition.frames)) {
      return false;
    }
    if (e.kind == EventKind::String && e.string_id != 0) {  // id 0 is always ""
      if (e.string_id >= strings_.size()) {
        // Ids are dense in a well-formed trace; cap the table so a hostile file cannot exhaust
        // memory.
        if (e.string_id > strings_.size() + 1'000'000 || e.string_id > kMaxStrings) {
          stop(chunk_offset_ + record_start, "corrupt trace: string id out of range at byte offset " +
                                                 std::to_string(chunk_offset_ + record_start));
          return false;
        }
        strings_.resize(e.string_id + 1);
      }
      strings_[e.string_id].assign(e.text.data(), e.text.size());
    }
    e.seq = seq_++;
    out = e;
    return true;
  }
  return false;
}

void TraceReader::rewind() {
  offset_ = trace_format::kFileHeaderBytes;
  chunk_.clear();
  pos_ = 0;
  chunk_records_left_ = 0;
  seq_ = 0;
  last_time_ns_ = 0;
  skipped_records_ = 0;
  done_ = false;
  truncated_ = false;
  truncated_at_ = 0;
  problem_.clear();
}

namespace {
// Ids are dense in a well-formed trace; a table grows by at most this much past its size, so a
// hostile file cannot make it allocate without bound.
template <class Table>
bool fits(const Table& table, std::uint32_t id) {
  return id <= table.size() + 1'000'000 && id <= kMaxStrings;
}
}  // namespace

bool TraceReader::define(const Event& e, std::size_t record_start, const FrameRecord& frame_record,
                         std::uint32_t site, const std::vector<std::uint32_t>& frames) {
  const std::uint32_t id = e.string_id;
  if (id == 0) return true;  // id 0 is always "none"
  const bool frame = e.kind == EventKind::Frame;
  if (!(frame ? fits(frames_, id) : fits(stacks_, id))) {
    stop(chunk_offset_ + record_start, std::string("corrupt trace: ") + (frame ? "frame" : "stack") +
                                           " id out of range at byte offset " +
                                           std::to_string(chunk_offset_ + record_start));
    return false;
  }
  if (frame) {
    if (id >= frames_.size()) frames_.resize(id + 1);
    frames_[id] = frame_record;
    return true;
  }
  if (id >= stacks_.size()) stacks_.resize(id + 1);
  if (stacks_[id].size != 0) return true;  // read before (a second pass): the first definition stays
  stacks_[id] = StackEntry{stack_frames_.size(), static_cast<std::uint32_t>(frames.size()), site};
  stack_frames_.insert(stack_frames_.end(), frames.begin(), frames.end());
  return true;
}

const StepSummary& TraceReader::summary() const noexcept { return flight_->payload.summary; }
const Checkpoint& TraceReader::checkpoint() const noexcept { return flight_->payload.checkpoint; }
const CheckpointBlock& TraceReader::checkpoint_block() const noexcept { return flight_->payload.block; }

FrameRecord TraceReader::frame(std::uint32_t id) const noexcept {
  return id < frames_.size() ? frames_[id] : FrameRecord{};
}

StackView TraceReader::stack(std::uint32_t id) const noexcept {
  if (id == 0 || id >= stacks_.size()) return StackView{};
  const StackEntry& s = stacks_[id];
  return StackView{stack_frames_.data() + s.offset, s.size, s.site};
}

std::string_view TraceReader::string(std::uint32_t id) const noexcept {
  return id < strings_.size() ? std::string_view(strings_[id]) : std::string_view();
}

}  // namespace ridgescope
