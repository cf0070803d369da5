// format_bytes.h — bytes as a person reads them ("1.50 GiB"): below 1024, the integer and " B";
// else the value in the largest binary unit (KiB .. PiB) it reaches, with 2 decimals below 10, 1
// below 100, none above, rounded as printf rounds (the exact binary value, ties to even).
// Internal to csrc/core (util: the named internal interface); exported as _C.format_bytes.
//
// Thread-safety: a pure function; safe from any thread.
#pragma once

#include <cstdint>
#include <string>

namespace ridgescope::detail {

std::string format_bytes(std::uint64_t bytes);

}  // namespace ridgescope::detail
