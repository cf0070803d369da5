// ridgescope/trace_reader.h — streams the events of a .rstrace file, in order, in bounded
// memory (one chunk at a time plus the string table).
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
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ridgescope/event.h"

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

  // Fills `out` with the next event (String records are absorbed into the string table and
  // also returned, so callers may ignore them). Returns false at the end of the usable data.
  bool next(Event& out);

  // Goes back to the first record, for a second pass. Strings seen stay known.
  void rewind();

  // The text of string `id` ("" for 0 or an id never defined).
  std::string_view string(std::uint32_t id) const noexcept;

  bool truncated() const noexcept { return truncated_; }
  std::uint64_t truncated_at() const noexcept { return truncated_at_; }  // byte offset
  const std::string& problem() const noexcept { return problem_; }
  std::uint32_t version() const noexcept { return version_; }
  std::uint64_t file_bytes() const noexcept { return file_bytes_; }
  std::uint64_t skipped_records() const noexcept { return skipped_records_; }

 private:
  bool load_chunk();
  void stop(std::uint64_t offset, std::string problem);

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
  bool done_ = false;
  bool truncated_ = false;
  std::uint64_t truncated_at_ = 0;
  std::string problem_;
  std::uint64_t skipped_records_ = 0;
};

}  // namespace ridgescope
