// ridgescope/trace_reader.h — streams the events of a .rstrace file, in order, in bounded
// memory (one chunk at a time plus the string, frame and stack tables). Reads every format
// version from trace_format::kMinVersion to kVersion (a version-1 file has no frames or
// stacks: every alloc's stack_id is 0).
//
// A file that is not a trace, or of an unsupported version, is refused at construction with a
// TraceError naming the problem and the byte offset. A torn or corrupt chunk later in the file
// ends the stream: next() returns false, truncated() is true and problem() names the byte
// offset; everything before it was delivered (a killed process leaves such a prefix). Readers
// that want no partial data check truncated() after the loop.
//
// Thread-safety: a TraceReader is used by one thread at a time.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ridgescope/event.h"
#include "ridgescope/flight_records.h"
#include "ridgescope/stack.h"

namespace ridgescope {

class TraceError : public std::runtime_error {
 public:
  TraceError(const std::string& message, std::uint64_t offset)
      : std::runtime_error(message), offset_(offset) {}
  std::uint64_t offset() const noexcept { return offset_; }  // byte offset of the problem

 private:
  std::uint64_t offset_;
};

class TraceReader {
 public:
  explicit TraceReader(const std::string& path);  // throws TraceError
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  // Fills `out` with the next event (String, Frame and Stack records are absorbed into their
  // tables and also returned, so callers may ignore them). Returns false at the end of the
  // usable data.
  bool next(Event& out);

  // Goes back to the first record, for a second pass. Strings seen stay known.
  void rewind();

  // The text of string `id` ("" for 0 or an id never defined).
  std::string_view string(std::uint32_t id) const noexcept;
  // Frame `id` (an Untracked frame with no texts for 0 or an id never defined).
  FrameRecord frame(std::uint32_t id) const noexcept;
  // Stack `id` (empty for 0 or an id never defined). Valid until the next next() or rewind().
  StackView stack(std::uint32_t id) const noexcept;
  // The content of the last StepSummary, Checkpoint and CheckpointBlock event delivered (format
  // 4, ridgescope/flight_records.h); valid until the next event of the same kind.
  const StepSummary& summary() const noexcept;
  const Checkpoint& checkpoint() const noexcept;
  const CheckpointBlock& checkpoint_block() const noexcept;

  bool truncated() const noexcept { return truncated_; }
  std::uint64_t truncated_at() const noexcept { return truncated_at_; }  // byte offset
  const std::string& problem() const noexcept { return problem_; }
  std::uint32_t version() const noexcept { return version_; }
  std::uint64_t file_bytes() const noexcept { return file_bytes_; }
  std::uint64_t skipped_records() const noexcept { return skipped_records_; }

 private:
  bool load_chunk();
  void stop(std::uint64_t offset, std::string problem);
  // Absorbs a frame or stack record (its content: a FrameRecord, or the site and frame ids).
  bool define(const Event& e, std::size_t record_start, const FrameRecord& frame, std::uint32_t site,
              const std::vector<std::uint32_t>& frames);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::uint32_t version_ = 0;
  std::uint64_t file_bytes_ = 0;
  std::uint64_t offset_ = 0;       // byte offset of the next chunk header
  std::uint64_t chunk_offset_ = 0;  // byte offset of the current chunk's payload
  std::string chunk_;
  std::size_t pos_ = 0;
  std::uint32_t chunk_records_left_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t last_time_ns_ = 0;
  std::vector<std::string> strings_;
  std::vector<FrameRecord> frames_;  // by id; [0] unused
  struct StackEntry {
    std::uint64_t offset = 0;  // into stack_frames_
    std::uint32_t size = 0, site = 0;
  };
  std::vector<StackEntry> stacks_;  // by id; [0] empty
  std::vector<std::uint32_t> stack_frames_;
  struct Flight;  // the last flight payloads (record_codec.h), kept out of this header
  std::unique_ptr<Flight> flight_;
  bool done_ = false;
  bool truncated_ = false;
  std::uint64_t truncated_at_ = 0;
  std::string problem_;
  std::uint64_t skipped_records_ = 0;
};

}  // namespace ridgescope
