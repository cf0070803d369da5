// chunk_file.h — the file header and chunk framing of docs/trace_format.md, written with stdio.
// Internal to the core (the plain sink, the flight recorder's writer). Thread-safety: one
// caller per FILE at a time.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "ridgescope/trace_format.h"

namespace ridgescope::detail {

// Creates (truncates) `path` and writes the 16-byte file header of format kVersion. Throws
// std::runtime_error naming the path and the system's reason.
std::FILE* create_trace_file(const std::string& path);

// Writes one chunk (its 16-byte header and the payload); false on an I/O error (errno says
// why). Does not flush.
bool write_chunk(std::FILE* file, std::string_view payload, std::uint32_t records);

}  // namespace ridgescope::detail
