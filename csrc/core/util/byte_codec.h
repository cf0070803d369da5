// byte_codec.h — LEB128 varints, little-endian fixed integers and CRC-32 for the trace format.
// Internal to csrc/core. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ridgescope::detail {

inline void put_varint(std::string& out, std::uint64_t v) {
  char bytes[10];  // built here and appended once: a byte-by-byte push_back checks room each time
  std::size_t n = 0;
  while (v >= 0x80) {
    bytes[n++] = static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  bytes[n++] = static_cast<char>(v);
  out.append(bytes, n);
}

// Reads a varint at p (moved past it); false when it runs past `end` or exceeds 64 bits (p is
// then anywhere up to `end`). The one rule for every varint the reader and the writer thread read;
// inlined into the decoders, which read several a record.
[[gnu::always_inline]] inline bool read_varint(const unsigned char*& p, const unsigned char* end, std::uint64_t* v) {
  std::uint64_t result = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const unsigned byte = *p++;
    if (shift == 63 && (byte & 0x7E) != 0) return false;
    result |= static_cast<std::uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) {
      *v = result;
      return true;
    }
  }
  return false;
}

// Reads a varint at *pos; returns false (without moving *pos) when it runs past the end or
// exceeds 64 bits.
inline bool get_varint(std::string_view in, std::size_t* pos, std::uint64_t* v) {
  if (*pos > in.size()) return false;
  const auto* begin = reinterpret_cast<const unsigned char*>(in.data());
  const unsigned char* p = begin + *pos;
  if (!read_varint(p, begin + in.size(), v)) return false;
  *pos = static_cast<std::size_t>(p - begin);
  return true;
}

inline void put_u32(char* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

inline std::uint32_t get_u32(const char* in) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(in[i])) << (8 * i);
  return v;
}

// CRC-32 (IEEE 802.3, the zlib polynomial), so `python -c "zlib.crc32(...)"` can check a chunk.
// Uses the CPU's carry-less multiply where it has one (x86-64 with PCLMULQDQ), else tables.
std::uint32_t crc32(std::string_view data) noexcept;
// The same checksum by tables alone, on every CPU (what crc32() is checked against).
std::uint32_t crc32_portable(std::string_view data) noexcept;

}  // namespace ridgescope::detail
