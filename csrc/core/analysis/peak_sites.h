// peak_sites.h — the peak by allocation site and by stack (docs/sites.md): an aggregator over
// the blocks live at the peak, and the table that turns a trace's frames into the report's.
// Internal to csrc/core. Thread-safety: one analysis owns each object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "frame_text.h"
#include "ridgescope/ledger.h"
#include "ridgescope/report.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope::detail {

// Trace frame `id` as a report frame: kind, file, line, function and module (not yet marked
// library nor spelled: FrameTable::describe).
ReportFrame read_report_frame(const TraceReader& reader, std::uint32_t id);
// The site of trace frame `id` as a person reads it ("train.py:10 in train",
// "MmBackward0 of layers.3.mlp.fc1"); "" for 0.
std::string site_text(const TraceReader& reader, std::uint32_t id);

// The report's frames (Report::frames): each trace frame the report refers to, once, in order
// of first reference.
class FrameTable {
 public:
  FrameTable(const TraceReader& reader, std::vector<ReportFrame>& out) : reader_(reader), out_(out) {}

  // The report index of trace frame `id`; -1 for 0 (no frame).
  std::int64_t index(std::uint32_t id);
  // site_text of trace frame `id` in this table's trace.
  std::string site_text(std::uint32_t id) const { return detail::site_text(reader_, id); }
  // The site frame of trace stack `stack_id` (0: none).
  std::uint32_t site_of_stack(std::uint32_t stack_id) const { return reader_.stack(stack_id).site_frame(); }
  const TraceReader& reader() const { return reader_; }
  const ReportFrame& frame(std::int64_t index) const { return out_[static_cast<std::size_t>(index)]; }
  // Marks every report frame library or not and spells it (frame_text.h), once all are in;
  // `roots`: the directories the tracking process knew (the trace's `sites` metadata).
  void describe(const CodeRoots& roots);

 private:
  const TraceReader& reader_;
  std::vector<ReportFrame>& out_;
  absl::flat_hash_map<std::uint32_t, std::int64_t> index_;
};

// The site of a report frame as a person reads it (the file's last component; format_frame).
std::string format_site(const ReportFrame& frame);

// Fills peak.by_site (the largest `top_sites` (site, category) rows) and peak.stacks (every
// live block, by stack; beyond `max_stacks` the smallest are merged into one entry without
// frames, counted in peak.stacks_merged) from the blocks live at the peak.
void collect_peak_sites(const Ledger& ledger, FrameTable& frames, std::size_t top_sites,
                        std::size_t max_stacks, PeakInfo& peak);

}  // namespace ridgescope::detail
