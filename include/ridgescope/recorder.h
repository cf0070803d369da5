// ridgescope/recorder.h — the session's event sink: stamps, encodes and streams events to a
// .rstrace file (format: ridgescope/trace_format.h, docs/trace_format.md), through a ChunkSink
// (ridgescope/chunk_sink.h): the plain file, or the flight recorder's (ridgescope/flight.h).
//
// Hot path: record() is called from allocator callbacks on any thread. It takes one leaf mutex
// (no other lock is ever taken while holding it), never throws, never calls torch or Python and
// appends to a bounded buffer. The chunk buffers and the intern tables are on pages of their
// own, never in the C heap (csrc/core/util/page_arena.h), where they would sit between the
// user's tensors. A background thread writes full chunks and flushes a partial one every flush
// interval, so a process killed mid-run leaves a readable prefix. When the writer falls behind
// by more than the queue bound, every append (record, record_timed, intern, metadata) waits for
// it: memory stays bounded, at most (max_queued_chunks + one per recording thread + the chunk
// being written + the one being filled) x the chunk size; the written buffers kept for the next
// hand-offs are among these.
// A thread that waits for the writer (a full queue, flush(), close()) writes the queued chunks
// itself, in order, whenever the writer is not writing one: a writer that gets no CPU time
// (RecorderOptions::idle_writer) can delay the file but never stall recording for long.
// A String or Metadata text over kMaxRecordBytes is dropped and counted. Once close() has
// begun, further events are dropped and counted.
//
// An I/O error never propagates: the recorder marks itself failed, counts what it drops, and
// failed()/error() say why. Thread-safety: every member function is safe from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <memory>
#include <memory_resource>
#include <thread>
#include <vector>

#include "ridgescope/chunk_sink.h"
#include "ridgescope/event.h"
#include "ridgescope/stack.h"

namespace ridgescope {

namespace detail {
class InternTable;  // page_arena.h
}  // namespace detail

struct RecorderStats {
  std::uint64_t events = 0;           // records accepted (all kinds)
  std::uint64_t dropped_events = 0;   // records that never reach the file: refused after a
                                      // failure or close() (or too large), or held in memory
                                      // or in the failing write when the failure came
  std::uint64_t bytes_written = 0;    // bytes written to disk, headers included (a flight
                                      // recorder rewrites its file: this counts every write)
  std::uint64_t chunks_written = 0;   // complete chunks written
  std::uint64_t file_bytes = 0;       // bytes of the trace file now
  std::uint64_t buffer_bytes_peak = 0;  // most bytes ever held in memory by the recorder
  std::uint64_t buffer_bytes = 0;       // bytes held in memory now: the queued chunks, the one
                                        // being filled and the written ones kept for reuse (0
                                        // once closed: close() gives them back)
};

struct RecorderOptions {
  // Bytes of payload per chunk before it is handed off (capped at a quarter of the readers'
  // chunk limit).
  std::uint32_t chunk_bytes = 256 * 1024;
  std::uint32_t flush_interval_ms = 100;   // a partial chunk older than this is written
  std::uint32_t max_queued_chunks = 64;    // memory bound: record() waits beyond this
  // The writer thread runs at the idle scheduling class (Linux SCHED_IDLE): only on CPU time no
  // other thread wants, so that it never preempts the threads that record. Its work then waits
  // for idle time, or for a thread that waits for it and writes the chunks itself; close()
  // returns the writer to the normal class where the process may (EPERM ignored). Elsewhere,
  // and when the class cannot be set, no effect. Sessions: RIDGESCOPE_WRITER=idle.
  bool idle_writer = false;
};

class Recorder {
 public:
  // The writer thread's name (Linux: /proc/<pid>/task/<tid>/comm, `top -H`; at most 15 bytes).
  static constexpr const char* kWriterThreadName = "rs-trace-writer";
  // Largest text a String or Metadata record may carry (bytes); larger ones are dropped.
  static constexpr std::size_t kMaxRecordBytes = 16 * 1024 * 1024;

  // Creates (truncates) `path` and writes the file header. Throws std::runtime_error naming the
  // path and the system's reason when the file cannot be written.
  explicit Recorder(const std::string& path, RecorderOptions options = {});
  // Streams into `sink` (which has created its file).
  explicit Recorder(std::unique_ptr<ChunkSink> sink, RecorderOptions options = {});
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Appends one event, stamped with the time (nanoseconds since this recorder was created) and
  // the calling thread in place of its own time_ns and thread. String and Metadata events are
  // written by intern() and metadata() instead.
  void record(const Event& event) noexcept;

  // Appends an event keeping its time_ns and thread (a replay source that carries its own clock).
  void record_timed(const Event& event) noexcept;

  // Returns the id of `text`, writing a String record the first time it is seen. Id 0 is the
  // empty string and is never written.
  std::uint32_t intern(std::string_view text) noexcept;

  // Returns the id of a frame (ridgescope/stack.h), writing its texts' String records and a
  // Frame record the first time it is seen; 0 on failure. Ids are dense from 1.
  std::uint32_t intern_frame(const FrameText& frame) noexcept;
  // The same for a frame whose texts are interned already (string ids).
  std::uint32_t intern_frame(const FrameRecord& frame) noexcept;

  // Returns the id of a stack (frame ids innermost first, `site` the index of the site frame,
  // or `count` for none), writing a Stack record the first time it is seen; 0 for an empty
  // stack or on failure. A stack longer than kMaxStackFrames keeps its innermost frames.
  std::uint32_t intern_stack(const std::uint32_t* frames, std::size_t count,
                             std::uint32_t site) noexcept;

  // Writes a Metadata record: a key and a JSON text describing the run.
  void metadata(std::string_view key, std::string_view json) noexcept;

  // Writes everything recorded so far to disk and returns when it is there.
  void flush() noexcept;

  // Flushes, stops the writer thread and closes the file. Later records are dropped.
  void close() noexcept;

  bool failed() const noexcept;
  std::string error() const;
  RecorderStats stats() const;
  const std::string& path() const noexcept { return sink_->path(); }
  // steady-clock nanoseconds (ridgescope::monotonic_now_ns) at which the session started.
  std::uint64_t origin_ns() const noexcept { return origin_ns_; }

  // Testing aid: the next chunk write fails as a full disk would.
  void inject_write_failure() noexcept;
  // Testing aid: the writer thread stops writing chunks (as one that gets no CPU time would) and
  // leaves them to the threads that wait for it.
  void pause_writer_for_testing() noexcept;
  // The writer thread's scheduling policy now (SCHED_OTHER, SCHED_IDLE, ...; -1 if unknown).
  int writer_policy() const noexcept;

 private:
  // `time_ns` and `thread` stand for the event's own (text records have neither).
  void append_locked(const Event& event, std::uint64_t time_ns, std::uint32_t thread);
  void append_definition_locked(const std::string& record);
  // Bounded memory: after each record, waits (or writes the oldest chunk itself) while the queue
  // is over its limit. The check is inline: it is on every record's path, the wait is rare.
  void wait_for_room(std::unique_lock<std::mutex>& lock) noexcept {
    if (queue_.size() > options_.max_queued_chunks) wait_for_room_slow(lock);
  }
  void wait_for_room_slow(std::unique_lock<std::mutex>& lock) noexcept;
  void hand_off_locked();
  bool write_front_locked(std::unique_lock<std::mutex>& lock);
  std::uint64_t held_locked() const noexcept;
  void note_held_locked() noexcept;
  void writer_loop();
  void fail_locked(std::string message);

  const std::unique_ptr<ChunkSink> sink_;
  const RecorderOptions options_;
  const std::uint64_t origin_ns_;

  mutable std::mutex mutex_;  // leaf lock: guards everything below
  std::condition_variable wake_writer_;
  std::condition_variable written_;
  // The chunks' bytes, on pages of their own (detail::page_mappings()), never in the C heap: a
  // session's chunk buffers live as long as it does, and in the heap they would sit between the
  // user's tensors.
  using ChunkBytes = std::pmr::string;
  ChunkBytes new_chunk() const;  // empty, with room for a chunk
  ChunkBytes current_;
  std::uint32_t current_records_ = 0;
  std::uint64_t current_started_ns_ = 0;
  std::deque<std::pair<ChunkBytes, std::uint32_t>> queue_;
  // Written chunks' buffers, kept for the next hand-offs (at most kSpareChunks): a session makes
  // its chunk buffers once, so that recording does not map and unmap a chunk's pages on the
  // training thread at every hand-off.
  static constexpr std::size_t kSpareChunks = 2;
  std::vector<ChunkBytes> spare_;
  std::uint64_t spare_bytes_ = 0;  // their capacity, bytes
  std::uint64_t queued_bytes_ = 0;
  bool writing_ = false;
  bool closing_ = false;
  bool closed_ = false;
  bool failed_ = false;
  bool inject_failure_ = false;
  bool writer_paused_ = false;
  int writer_tid_ = 0;  // the writer thread's kernel id (0 until it runs; Linux)
  std::string error_;
  RecorderStats stats_;
  std::uint64_t codec_time_ns_ = 0;  // time of the last encoded record (delta base)
  // Interned text -> id, in memory of their own (page_arena.h: never in the C heap, where the
  // entries a session adds during the user's first steps would sit between their tensors).
  const std::unique_ptr<detail::InternTable> strings_;
  const std::unique_ptr<detail::InternTable> frames_;  // encoded FrameRecord -> id
  const std::unique_ptr<detail::InternTable> stacks_;  // encoded site and frames -> id
  std::thread writer_;
};

}  // namespace ridgescope
