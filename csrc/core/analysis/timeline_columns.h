// timeline_columns.h — live bytes over time in a bounded number of columns (Report::timeline),
// built by the analysis's replay pass. Every state change is observed, so each column's minimum
// and maximum are exact; a column starts from the state carried into it, and columns no event
// touches carry it unchanged. Internal to the analysis layer.
//
// Thread-safety: none; one builder per report.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ridgescope/report.h"

namespace ridgescope::detail {

class TimelineColumnsBuilder {
 public:
  // Columns of equal width over [0, end_time_ns], at most max_columns of them, into `out`.
  TimelineColumnsBuilder(Timeline& out, std::uint64_t end_time_ns, std::size_t max_columns);

  // The state just changed (at time_ns) to these live and reserved bytes.
  void observe(std::uint64_t time_ns, std::uint64_t live, std::uint64_t reserved, const CategoryBytes& by_category);

  // Columns after the last change carry the final state.
  void finish();

 private:
  void advance_to(std::uint64_t time_ns);
  void fill(std::size_t from, std::size_t to);

  Timeline& out_;
  std::size_t current_ = 0;
  bool started_ = false;
  std::uint64_t live_ = 0, reserved_ = 0;
  CategoryBytes by_category_{};
};

}  // namespace ridgescope::detail
