// chunk_file.cpp — the file header and chunk framing (chunk_file.h).
#include "chunk_file.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "byte_codec.h"

namespace ridgescope::detail {

std::FILE* create_trace_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    throw std::runtime_error("ridgescope: cannot write the trace file '" + path + "': " + std::strerror(errno));
  }
  char header[trace_format::kFileHeaderBytes] = {};
  std::memcpy(header, trace_format::kFileMagic, 8);
  put_u32(header + 8, trace_format::kVersion);
  put_u32(header + 12, 0);
  if (std::fwrite(header, 1, sizeof header, file) != sizeof header || std::fflush(file) != 0) {
    const std::string reason = std::strerror(errno);
    std::fclose(file);
    throw std::runtime_error("ridgescope: cannot write the trace file '" + path + "': " + reason);
  }
  return file;
}

bool write_chunk(std::FILE* file, std::string_view payload, std::uint32_t records) {
  if (file == nullptr) return false;
  char header[trace_format::kChunkHeaderBytes];
  put_u32(header, trace_format::kChunkMagic);
  put_u32(header + 4, static_cast<std::uint32_t>(payload.size()));
  put_u32(header + 8, records);
  put_u32(header + 12, crc32(payload));
  errno = 0;
  return std::fwrite(header, 1, sizeof header, file) == sizeof header &&
         std::fwrite(payload.data(), 1, payload.size(), file) == payload.size();
}

}  // namespace ridgescope::detail
