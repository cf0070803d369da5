// ridgescope/flight.h — the flight recorder: a trace that stays bounded on disk however long the
// run (keep_steps), with a summary of every step (docs/long-runs.md, docs/trace_format.md "The
// flight recorder").
//
// make_flight_sink() is the ChunkSink (ridgescope/chunk_sink.h) a Recorder streams into. On the
// Recorder's writer thread, off the recording threads' path, it decodes each chunk, summarises
// every step (ridgescope/flight_records.h, StepSummary) and writes a summary record per step.
// With keep_steps == 0 it writes every event as well (a full trace). With keep_steps = K it
// writes the events step by step, each step beginning with a checkpoint of the ledger, and
// keeps on disk only the events of: the last K steps and the one running; the step with the
// highest peak so far and the one before it (per device); the steps around each OOM, each
// rs.mark() and each retained-tensor warning (the step before, the step, the step after); and
// the first keep_first_steps steps. The
// file is rewritten without the rest from time to time, into a new file renamed over the old
// one, so at every instant the path holds a whole trace: a process killed at any moment leaves
// every chunk written before the kill (as a full trace does).
//
// compact_trace() re-records a full trace through the same sink (the same events, string and
// stack ids), and TraceFollower reads a trace that is still being written (ridgescope watch).
//
// Errors: make_flight_sink and compact_trace throw std::runtime_error naming the path; the
// sink's own calls never throw (ChunkSink). Thread-safety: as ChunkSink; a TraceFollower belongs
// to one thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ridgescope/chunk_sink.h"
#include "ridgescope/event.h"
#include "ridgescope/flight_records.h"

namespace ridgescope {

struct FlightOptions {
  std::uint64_t keep_steps = 0;        // 0: every step's events (a full trace); else the last N
  std::uint64_t event_windows = 32;    // OOM, mark and warning windows kept (the most recent)
  // The first steps of the recording, always kept: those in which the saved-tensor hook ran and
  // the savers were learned (docs/categories.md), so that a kept window's analysis learns them
  // as the whole trace's does. 0: none.
  std::uint64_t keep_first_steps = 0;
  // Bytes of dropped events the file may hold before it is rewritten without them (at least
  // this much and at least as much as it keeps: the rewrites copy at most what was dropped).
  std::uint64_t rewrite_bytes = 8u << 20;
};

// Creates (truncates) `path` for a Recorder. Throws std::runtime_error naming the path.
std::unique_ptr<ChunkSink> make_flight_sink(const std::string& path, const FlightOptions& options);

// The `flight` metadata a recording with these options writes (docs/report_schema.md):
// {"keep_steps": N or null (all), "event_windows": N, "keep_first_steps": N}.
std::string flight_metadata(const FlightOptions& options);

struct CompactResult {
  std::uint64_t events = 0;      // records read from the full trace
  std::uint64_t steps = 0;       // steps summarised
  std::uint64_t in_bytes = 0, out_bytes = 0;
  bool truncated = false;        // the input ended in a torn or corrupt chunk (its prefix was used)
};

// Re-records the full trace `in` as `out` with `options` (a bounded trace when keep_steps > 0).
// With options.keep_first_steps 0, the keep_first_steps of the recording that wrote `in` (its
// saved-tensor hook's steps, from its `flight` metadata).
// Throws TraceError for an unreadable `in`, std::runtime_error when `out` cannot be written or
// `in` is itself bounded (it lacks the events of the steps it dropped).
CompactResult compact_trace(const std::string& in, const std::string& out, const FlightOptions& options);

// Follows a trace as it grows (ridgescope watch): each poll() reads the chunks written since the
// last one (from the start again after the writer rewrote the file) and updates the view.
class TraceFollower {
 public:
  explicit TraceFollower(std::string path);
  ~TraceFollower();
  TraceFollower(const TraceFollower&) = delete;
  TraceFollower& operator=(const TraceFollower&) = delete;

  struct DeviceNow {
    Device device;
    std::uint64_t live_bytes = 0, reserved_bytes = 0;
    std::array<std::uint64_t, kCategoryCount> by_category{};  // bytes, as the summaries count them
  };
  struct View {
    bool readable = false;        // the file exists and is a trace
    std::string problem;          // why not, or where the readable part ends
    std::uint64_t file_bytes = 0;
    std::uint64_t step = 0;       // the step running
    std::vector<std::string> phases;  // open phases, outermost first
    std::uint64_t time_ns = 0;    // the last event's time (nanoseconds since the session started)
    std::vector<DeviceNow> devices;
    std::vector<StepSummary> summaries;  // every summary read so far, in file order
    bool ended = false;           // the session's end record is there
    std::uint64_t rewrites = 0;   // times the file was found replaced (a flight recorder's rewrite)
  };
  // Reads what was appended since the last poll. Never throws.
  const View& poll() noexcept;
  // The text of string `id` in the trace ("" when unknown).
  std::string string(std::uint32_t id) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ridgescope
