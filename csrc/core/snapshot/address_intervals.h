// address_intervals.h — sets of half-open address intervals [lo, hi), kept merged, as a map
// start -> end (internal to the snapshot layer): what expandable segments have mapped, whose
// maps and unmaps need not line up with each other.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

namespace ridgescope::detail {

using AddressIntervals = std::map<std::uint64_t, std::uint64_t>;

// Adds [lo, hi), merging it with the intervals it overlaps or touches.
inline void add_interval(AddressIntervals& set, std::uint64_t lo, std::uint64_t hi) {
  if (hi <= lo) return;
  auto it = set.upper_bound(lo);
  if (it != set.begin() && std::prev(it)->second >= lo) {
    --it;
    lo = it->first;
    hi = std::max(hi, it->second);
    it = set.erase(it);
  }
  while (it != set.end() && it->first <= hi) {
    hi = std::max(hi, it->second);
    it = set.erase(it);
  }
  set.emplace(lo, hi);
}

// Removes [lo, hi), cutting the intervals it overlaps.
inline void remove_interval(AddressIntervals& set, std::uint64_t lo, std::uint64_t hi) {
  if (hi <= lo) return;
  auto it = set.upper_bound(lo);
  if (it != set.begin()) --it;
  while (it != set.end() && it->first < hi) {
    const std::uint64_t a = it->first, b = it->second;
    if (b <= lo) {
      ++it;
      continue;
    }
    it = set.erase(it);
    if (a < lo) set.emplace(a, lo);
    if (b > hi) it = set.emplace(hi, b).first;
  }
}

}  // namespace ridgescope::detail
