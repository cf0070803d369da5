// format_bytes.h — bytes as a person reads them ("1.5 GiB"). Internal to csrc/core.
#pragma once

#include <cstdint>
#include <string>

namespace ridgescope::detail {

std::string format_bytes(std::uint64_t bytes);

}  // namespace ridgescope::detail
