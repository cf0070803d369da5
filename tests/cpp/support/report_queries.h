// report_queries.h — small questions the specifications ask of a Report (ridgescope/report.h).
#pragma once

#include <cstdint>
#include <string>

#include "ridgescope/report.h"

namespace ridgescope::testing {

// Bytes live at the peak under `label` (0 when no block there carries it).
inline std::uint64_t peak_label_bytes(const Report& r, const std::string& label) {
  std::uint64_t n = 0;
  for (const auto& l : r.peak.by_label)
    if (l.label == label) n += l.bytes;
  return n;
}

}  // namespace ridgescope::testing
