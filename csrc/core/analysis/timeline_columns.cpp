// timeline_columns.cpp — Report::timeline's columns of live bytes (see timeline_columns.h).
#include "timeline_columns.h"

#include <algorithm>

namespace ridgescope::detail {

TimelineColumnsBuilder::TimelineColumnsBuilder(Timeline& out, std::uint64_t end_time_ns, std::size_t max_columns)
    : out_(out) {
  // [0, end_time_ns] inclusive (a hostile trace's last time may be the largest value)
  const std::uint64_t span = end_time_ns == UINT64_MAX ? end_time_ns : end_time_ns + 1;
  const std::uint64_t n = std::max<std::uint64_t>(1, max_columns);
  out_.end_time_ns = end_time_ns;
  out_.column_ns = std::max<std::uint64_t>(1, span / n + (span % n != 0));
  out_.columns.assign(static_cast<std::size_t>(span / out_.column_ns + (span % out_.column_ns != 0)), {});
}

void TimelineColumnsBuilder::observe(std::uint64_t time_ns, std::uint64_t live, std::uint64_t reserved,
                                     const CategoryBytes& by_category) {
  advance_to(time_ns);
  TimelineColumn& c = out_.columns[current_];
  ++c.changes;
  if (live > c.max_bytes) {
    c.max_bytes = live;
    c.max_time_ns = time_ns;
    c.max_by_category = by_category;
  }
  c.min_bytes = std::min(c.min_bytes, live);
  c.reserved_bytes = std::max(c.reserved_bytes, reserved);
  live_ = live;
  reserved_ = reserved;
  by_category_ = by_category;
}

void TimelineColumnsBuilder::finish() {
  fill(current_ + 1, out_.columns.size());
}

void TimelineColumnsBuilder::advance_to(std::uint64_t time_ns) {
  const std::size_t last = out_.columns.size() - 1;
  const std::size_t col = std::min<std::uint64_t>(last, time_ns / out_.column_ns);
  if (!started_) {  // before the first change nothing is live
    started_ = true;
    fill(0, col + 1);
    current_ = col;
    return;
  }
  if (col <= current_) return;  // same column (or a time that went backwards)
  fill(current_ + 1, col + 1);
  current_ = col;
}

void TimelineColumnsBuilder::fill(std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    TimelineColumn& c = out_.columns[i];
    c.min_bytes = c.max_bytes = live_;
    c.max_time_ns = i * out_.column_ns;
    c.reserved_bytes = reserved_;
    c.max_by_category = by_category_;
  }
}

}  // namespace ridgescope::detail
