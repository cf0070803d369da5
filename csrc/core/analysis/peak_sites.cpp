// peak_sites.cpp — the peak by allocation site and by stack (peak_sites.h, docs/sites.md).
#include "peak_sites.h"

#include <algorithm>
#include <utility>

namespace ridgescope::detail {

std::int64_t FrameTable::index(std::uint32_t id) {
  if (id == 0) return -1;
  auto [it, inserted] = index_.try_emplace(id, static_cast<std::int64_t>(out_.size()));
  if (inserted) {
    out_.push_back(read_report_frame(reader_, id));
  }
  return it->second;
}

ReportFrame read_report_frame(const TraceReader& reader, std::uint32_t id) {
  const FrameRecord f = reader.frame(id);
  ReportFrame r;
  r.kind = f.kind;
  r.file = std::string(reader.string(f.file_id));
  r.line = f.line;
  r.function = std::string(reader.string(f.function_id));
  r.module = std::string(reader.string(f.module_id));
  return r;
}

std::string site_text(const TraceReader& reader, std::uint32_t id) {
  return id == 0 ? std::string() : format_site(read_report_frame(reader, id));
}

std::string format_site(const ReportFrame& f) { return format_frame(f.kind, f.file, f.line, f.function, f.module); }

void FrameTable::describe(const CodeRoots& roots) {
  for (ReportFrame& f : out_) {
    f.library = is_library_frame(f.kind, f.file, &roots);
    f.text = format_frame(f.kind, f.file, f.line, f.function, f.module, FramePath::Base);
    f.location = format_frame(f.kind, f.file, f.line, f.function, f.module, FramePath::Full);
  }
}

void collect_peak_sites(const Ledger& ledger, FrameTable& frames, std::size_t top_sites,
                        std::size_t max_stacks, PeakInfo& peak) {
  // (site frame << 8 | category) -> bytes
  auto key_of = [](std::uint32_t frame, Category c) {
    return (static_cast<std::uint64_t>(frame) << 8) | static_cast<std::uint64_t>(c);
  };
  absl::flat_hash_map<std::uint64_t, SiteBytes> sites;
  absl::flat_hash_map<std::uint32_t, StackBytes> stacks;  // by trace stack id (0: none)
  ledger.for_each_live([&](std::uint64_t, const LiveBlock& b) {
    const std::uint32_t site = frames.site_of_stack(b.stack_id);
    SiteBytes& s = sites[key_of(site, b.category)];
    s.bytes += b.bytes;
    ++s.blocks;
    s.category = b.category;
    StackBytes& st = stacks[b.stack_id];
    st.bytes += b.bytes;
    ++st.blocks;
    st.by_category[category_index(b.category)] += b.bytes;
  });

  std::vector<std::pair<std::uint64_t, SiteBytes>> site_rows(sites.begin(), sites.end());
  auto by_bytes = [](const auto& a, const auto& b) {
    return a.second.bytes != b.second.bytes ? a.second.bytes > b.second.bytes : a.first < b.first;
  };
  std::sort(site_rows.begin(), site_rows.end(), by_bytes);
  if (site_rows.size() > top_sites) site_rows.resize(top_sites);
  for (auto& [key, row] : site_rows) {
    const auto frame = static_cast<std::uint32_t>(key >> 8);
    row.frame = frames.index(frame);
    row.site = frame == 0 ? std::string("(no site recorded)") : frames.site_text(frame);
    peak.by_site.push_back(std::move(row));
  }

  std::vector<std::pair<std::uint32_t, StackBytes>> stack_rows(stacks.begin(), stacks.end());
  std::sort(stack_rows.begin(), stack_rows.end(), [](const auto& a, const auto& b) {
    return a.second.bytes != b.second.bytes ? a.second.bytes > b.second.bytes : a.first < b.first;
  });
  StackBytes merged;
  for (std::size_t i = 0; i < stack_rows.size(); ++i) {
    auto& [id, row] = stack_rows[i];
    if (i >= max_stacks) {  // the smallest: one entry without frames keeps the total exact
      merged.bytes += row.bytes;
      merged.blocks += row.blocks;
      for (std::size_t c = 0; c < kCategoryCount; ++c) merged.by_category[c] += row.by_category[c];
      ++peak.stacks_merged;
      continue;
    }
    const StackView view = frames.reader().stack(id);
    for (std::uint32_t f = 0; f < view.size; ++f) {
      // A frame id of 0 inside a stack (only a corrupt trace has one) is left out.
      const std::int64_t index = frames.index(view.frames[f]);
      if (index < 0) continue;
      if (f == view.site) row.site = static_cast<std::int64_t>(row.frames.size());
      row.frames.push_back(static_cast<std::uint32_t>(index));
    }
    peak.stacks.push_back(std::move(row));
  }
  if (peak.stacks_merged > 0) peak.stacks.push_back(std::move(merged));
}

}  // namespace ridgescope::detail
