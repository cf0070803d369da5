// file_sink.cpp — the plain chunk sink: every payload as one chunk of one file
// (ridgescope/chunk_sink.h).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "chunk_file.h"
#include "ridgescope/chunk_sink.h"

namespace ridgescope {
namespace {

class FileSink final : public ChunkSink {
 public:
  explicit FileSink(const std::string& path) : path_(path) {
    file_ = detail::create_trace_file(path);  // throws, naming the path
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_written = stats_.file_bytes = trace_format::kFileHeaderBytes;
  }
  ~FileSink() override { close(); }

  const std::string& path() const noexcept override { return path_; }

  bool write_chunk(std::string_view payload, std::uint32_t records) noexcept override {
    if (file_ == nullptr) return false;
    if (!detail::write_chunk(file_, payload, records) || std::fflush(file_) != 0) {
      error_ = "cannot write the trace file '" + path_ + "': " + std::strerror(errno);
      return false;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t n = trace_format::kChunkHeaderBytes + payload.size();
    stats_.bytes_written += n;
    stats_.file_bytes += n;
    ++stats_.chunks_written;
    return true;
  }

  bool close() noexcept override {
    if (file_ == nullptr) return true;
    const bool ok = std::fclose(file_) == 0;
    file_ = nullptr;
    if (!ok && error_.empty()) error_ = "cannot close '" + path_ + "'";
    return ok;
  }

  std::string error() const override { return error_; }
  ChunkSinkStats stats() const noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  const std::string path_;
  std::FILE* file_ = nullptr;
  std::string error_;
  mutable std::mutex mutex_;  // guards stats_ (read from any thread)
  ChunkSinkStats stats_;
};

}  // namespace

std::unique_ptr<ChunkSink> make_file_sink(const std::string& path) { return std::make_unique<FileSink>(path); }

}  // namespace ridgescope
