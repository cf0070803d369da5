// ridgescope/chunk_sink.h — where a Recorder's chunks go (docs/trace_format.md, "Chunks").
//
// The Recorder encodes events into chunk payloads on the recording threads and hands whole
// payloads, in order, to one ChunkSink on its writer thread. The plain sink (make_file_sink)
// writes each as a chunk of one .rstrace file, as every trace was written before format 4; the
// flight recorder's sink (ridgescope/flight.h) summarises every step and keeps only some steps'
// events (keep_steps). A sink never throws from its calls: it returns false and error() says
// why.
//
// Thread-safety: a sink is called by one thread at a time (the Recorder's writer thread, then
// close() from the thread that closes the Recorder); stats() may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace ridgescope {

struct ChunkSinkStats {
  std::uint64_t bytes_written = 0;   // bytes the sink wrote, headers included (all files)
  std::uint64_t chunks_written = 0;  // chunks it wrote
  std::uint64_t file_bytes = 0;      // bytes of the trace file now (less after a compaction)
};

class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  // The trace file's path.
  virtual const std::string& path() const noexcept = 0;
  // One chunk payload of `records` records (docs/trace_format.md), in recording order. Returns
  // false when it could not be written; error() then says why.
  virtual bool write_chunk(std::string_view payload, std::uint32_t records) noexcept = 0;
  // The last call: writes what the sink still holds and closes the file.
  virtual bool close() noexcept = 0;
  virtual std::string error() const = 0;
  virtual ChunkSinkStats stats() const noexcept = 0;
};

// The plain sink: creates (truncates) `path`, writes the file header and then every payload as
// one chunk, flushed to the OS at once. Throws std::runtime_error naming the path and the
// system's reason when the file cannot be written.
std::unique_ptr<ChunkSink> make_file_sink(const std::string& path);

}  // namespace ridgescope
