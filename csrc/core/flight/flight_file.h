// flight_file.h — the file of a bounded flight trace: a list of pieces (byte ranges of whole
// chunks), each kept for good (definitions, summaries) or belonging to one step's events, and
// the rewrite that drops the pieces of steps no longer kept. A rewrite copies the kept pieces,
// in order and byte for byte, into `<path>.rewrite`, then renames it over `<path>` (atomic on
// POSIX): at every instant the path holds a whole trace, the old one or the new one.
//
// Internal to the core. Thread-safety: one writer thread; stats() from any thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "ridgescope/chunk_sink.h"

namespace ridgescope::detail {

class FlightFile {
 public:
  static constexpr std::int64_t kKept = -1;      // a piece kept for good
  static constexpr std::int64_t kResolved = -2;  // a piece a rewrite replaces (Resolve records)
  // Whether the pieces of `step` (>= 0; kKept for pieces kept for good) are to be kept.
  using Keep = std::function<bool(std::int64_t step)>;

  explicit FlightFile(const std::string& path);  // creates the file; throws std::runtime_error
  ~FlightFile();

  // Writes one chunk belonging to `step` (or kKept); not flushed.
  bool append(std::string_view payload, std::uint32_t records, std::int64_t step);
  bool flush();
  // Whether the file holds enough dropped bytes to be rewritten: at least `slack` and at least
  // as much as it keeps (checked again only once the file has grown by slack / 4).
  bool rewrite_due(std::uint64_t slack, const Keep& keep);
  // Records to put after the last kept step of a window (the step after it is not kept):
  // (payload, records), empty for none.
  using WindowEnd = std::function<std::pair<std::string, std::uint32_t>(std::int64_t last_step)>;
  // Rewrites the file with the pieces `keep` keeps; the kResolved pieces are replaced by what
  // `window_end` gives for each window that ends before another kept step.
  bool rewrite(const Keep& keep, const WindowEnd& window_end);
  bool close();

  const std::string& path() const noexcept { return path_; }
  std::string error() const;
  void set_error(std::string message);
  ChunkSinkStats stats() const noexcept;
  std::uint64_t rewrites() const noexcept { return rewrites_; }

 private:
  struct Piece {
    std::uint64_t offset = 0, bytes = 0;
    std::int64_t step = kKept;
  };
  bool fail(const std::string& what);

  const std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<Piece> pieces_;
  std::uint64_t next_check_ = 0;
  std::uint64_t rewrites_ = 0;
  mutable std::mutex mutex_;  // guards stats_ and error_
  ChunkSinkStats stats_;
  std::string error_;
};

}  // namespace ridgescope::detail
