// flight_file.cpp — the pieces of a bounded flight trace and their rewrite (flight_file.h).
#include "flight_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "chunk_file.h"
#include "ridgescope/trace_format.h"

namespace ridgescope::detail {

FlightFile::FlightFile(const std::string& path) : path_(path) {
  file_ = create_trace_file(path);
  stats_.bytes_written = stats_.file_bytes = trace_format::kFileHeaderBytes;
}

FlightFile::~FlightFile() { close(); }

std::string FlightFile::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void FlightFile::set_error(std::string message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_.empty()) error_ = std::move(message);
}

bool FlightFile::fail(const std::string& what) {
  set_error(what + " '" + path_ + "': " + std::strerror(errno));
  return false;
}

ChunkSinkStats FlightFile::stats() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

bool FlightFile::append(std::string_view payload, std::uint32_t records, std::int64_t step) {
  if (file_ == nullptr) return false;
  if (!write_chunk(file_, payload, records)) return fail("cannot write the trace file");
  const std::uint64_t n = trace_format::kChunkHeaderBytes + payload.size();
  std::uint64_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    offset = stats_.file_bytes;
    stats_.bytes_written += n;
    stats_.file_bytes += n;
    ++stats_.chunks_written;
  }
  if (!pieces_.empty() && pieces_.back().step == step && pieces_.back().offset + pieces_.back().bytes == offset) {
    pieces_.back().bytes += n;  // the same step (or kept for good) right after: one piece
  } else {
    pieces_.push_back(Piece{offset, n, step});
  }
  return true;
}

bool FlightFile::flush() {
  if (file_ == nullptr) return false;
  return std::fflush(file_) == 0 || fail("cannot write the trace file");
}

bool FlightFile::rewrite_due(std::uint64_t slack, const Keep& keep) {
  const std::uint64_t size = stats().file_bytes;
  if (size < next_check_) return false;
  std::uint64_t dropped = 0;
  for (const Piece& p : pieces_) {
    if (!keep(p.step)) dropped += p.bytes;
  }
  if (dropped > 0 && dropped >= slack && dropped >= size - dropped) return true;
  next_check_ = size + slack / 4;
  return false;
}

bool FlightFile::rewrite(const Keep& keep, const WindowEnd& window_end) {
  if (file_ == nullptr) return false;
  bool any_dropped = false;
  for (const Piece& p : pieces_) any_dropped = any_dropped || p.step == kResolved || !keep(p.step);
  if (!any_dropped) return true;
  if (std::fflush(file_) != 0) return fail("cannot write the trace file");
  const std::string tmp = path_ + ".rewrite";
  std::FILE* out = nullptr;
  try {
    out = create_trace_file(tmp);
  } catch (const std::exception& ex) {
    set_error(ex.what());
    return false;
  }
  std::FILE* in = std::fopen(path_.c_str(), "rb");
  if (in == nullptr) {
    std::fclose(out);
    std::remove(tmp.c_str());
    return fail("cannot read back the trace file");
  }
  std::vector<Piece> kept;
  std::uint64_t size = trace_format::kFileHeaderBytes;
  // Below glibc's default mmap threshold (128 KiB): a larger buffer would be mmapped, and its
  // free would raise the threshold of the whole (the user's) process to its size.
  std::vector<char> buffer(64u << 10);
  bool ok = true;
  std::int64_t last_step = kKept;
  auto add = [&](std::uint64_t bytes, std::int64_t step) {
    if (!kept.empty() && kept.back().step == step && kept.back().offset + kept.back().bytes == size) {
      kept.back().bytes += bytes;
    } else {
      kept.push_back(Piece{size, bytes, step});
    }
    size += bytes;
  };
  for (const Piece& p : pieces_) {
    if (p.step == kResolved || !keep(p.step)) continue;
    if (p.step >= 0 && last_step >= 0 && p.step != last_step && p.step != last_step + 1) {
      // A window ended with last_step: what its live blocks' later lives decided.
      auto [payload, records] = window_end(last_step);
      if (records > 0) {
        if (!write_chunk(out, payload, records)) {
          ok = false;
          break;
        }
        add(trace_format::kChunkHeaderBytes + payload.size(), kResolved);
      }
    }
    if (p.step >= 0) last_step = p.step;
    if (std::fseek(in, static_cast<long>(p.offset), SEEK_SET) != 0) {
      ok = false;
      break;
    }
    for (std::uint64_t left = p.bytes; left > 0 && ok;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, buffer.size()));
      ok = std::fread(buffer.data(), 1, n, in) == n && std::fwrite(buffer.data(), 1, n, out) == n;
      left -= n;
    }
    if (!ok) break;
    add(p.bytes, p.step);
  }
  std::fclose(in);
  if (!ok || std::fflush(out) != 0) {
    std::fclose(out);
    std::remove(tmp.c_str());
    return fail("cannot rewrite the trace file");
  }
  // The new file takes the old one's name in one step; the old handle's inode goes with it.
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    std::fclose(out);
    std::remove(tmp.c_str());
    return fail("cannot rename the rewritten trace over");
  }
  std::fclose(file_);
  file_ = out;
  pieces_ = std::move(kept);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_written += size;
    stats_.file_bytes = size;
  }
  next_check_ = 0;
  ++rewrites_;
  return true;
}

bool FlightFile::close() {
  if (file_ == nullptr) return true;
  const bool ok = std::fclose(file_) == 0;
  file_ = nullptr;
  return ok || fail("cannot close the trace file");
}

}  // namespace ridgescope::detail
