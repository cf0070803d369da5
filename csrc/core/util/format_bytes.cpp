// format_bytes.cpp — bytes as a person reads them: the one definition of the rule. The reports'
// texts (C++), the Python reporters (through _C.format_bytes) and the HTML pages (whose
// _reporters/_html_assets/common.js repeats it, checked against this by
// tests/python/test_format_bytes.py) all print what this prints.
#include "format_bytes.h"

#include <cstdio>

namespace ridgescope::detail {

std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, kUnits[unit]);
  return buf;
}

}  // namespace ridgescope::detail
