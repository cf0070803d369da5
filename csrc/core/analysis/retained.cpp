// retained.cpp — tensors kept across steps (retained.h, docs/sites.md).
#include "retained.h"

#include <algorithm>

#include "ridgescope/forensics.h"

namespace ridgescope::detail {

std::uint32_t RetentionDetector::site_index(std::uint32_t frame, Category category) {
  const std::uint64_t key = (static_cast<std::uint64_t>(frame) << 8) | static_cast<std::uint64_t>(category);
  auto [it, inserted] = index_.try_emplace(key, static_cast<std::uint32_t>(sites_.size()));
  if (inserted) {
    Site s;
    s.frame = frame;
    s.category = category;
    sites_.push_back(s);
  }
  return it->second;
}

void RetentionDetector::on_alloc(std::uint64_t block_id, std::uint32_t site_frame, Category category,
                                 std::uint64_t bytes, std::uint64_t seq) {
  const std::uint32_t i = site_index(site_frame, category);
  Site& s = sites_[i];
  s.bytes += bytes;
  ++s.blocks;
  seq_ = seq;
  live_[block_id] = Live{i, bytes, seq};
}

void RetentionDetector::on_free(std::uint64_t block_id) {
  auto it = live_.find(block_id);
  if (it == live_.end()) return;
  Site& s = sites_[it->second.site];
  s.bytes -= std::min(s.bytes, it->second.bytes);
  if (s.blocks > 0) --s.blocks;
  live_.erase(it);
}

void RetentionDetector::on_step_end(std::uint64_t step) {
  const std::size_t slot = step_ends_ % kWindow;
  steps_[slot] = step;
  for (Site& s : sites_) {
    // The first step end only sets the baseline: everything live then is new.
    if (step_ends_ > 0 && s.bytes > s.end_bytes) {
      s.growth[slot] = s.bytes - s.end_bytes;
      ++s.run;
    } else {
      s.run = 0;
    }
    s.end_bytes = s.bytes;
    s.end_blocks = s.blocks;
  }
  last_end_seq_ = seq_;
  ++step_ends_;
}

std::optional<RetainedGrowth> RetentionDetector::result(FrameTable& frames) const {
  std::vector<const Site*> growing;
  std::uint64_t window = kWindow;
  for (const Site& s : sites_) {
    if (s.run < kMinGrowthSteps) continue;
    growing.push_back(&s);
    window = std::min(window, s.run);
  }
  if (growing.empty()) return std::nullopt;
  const std::uint64_t last = step_ends_ - 1;  // the last step end's position
  // Per step end of the window (the step ends at which every growing site grew): the total.
  std::vector<std::uint64_t> totals(window, 0);
  std::array<std::uint64_t, kCategoryCount> by_category{};
  for (const Site* s : growing) {
    for (std::uint64_t j = 0; j < window; ++j) {
      const std::uint64_t g = s->growth[(last - j) % kWindow];
      totals[j] += g;
      by_category[category_index(s->category)] += g;
    }
  }
  std::uint64_t sum = 0, lo = UINT64_MAX, hi = 0;
  for (std::uint64_t t : totals) {
    sum += t;
    lo = std::min(lo, t);
    hi = std::max(hi, t);
  }
  if (sum / window < kMinGrowthBytes) return std::nullopt;

  RetainedGrowth r;
  r.since_step = steps_[(last - (window - 1)) % kWindow];
  r.last_step = steps_[last % kWindow];
  r.growth_steps = window;
  r.growth_per_step_bytes = sum / window;
  r.growth_constant = lo == hi;
  r.min_growth_bytes = lo;
  r.max_growth_bytes = hi;
  std::vector<std::pair<std::uint64_t, const Site*>> ranked;  // (growth over the window, site)
  for (const Site* s : growing) {
    std::uint64_t g = 0;
    for (std::uint64_t j = 0; j < window; ++j) g += s->growth[(last - j) % kWindow];
    ranked.emplace_back(g, s);
    r.bytes += s->end_bytes;
    r.blocks += s->end_blocks;
  }
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return a.second->frame != b.second->frame ? a.second->frame < b.second->frame
                                              : a.second->category < b.second->category;
  });
  // The site made last: of the blocks still live that were made by the last step end, the one
  // allocated latest (in a graph kept alive, its output: the loss).
  absl::flat_hash_map<const Site*, std::uint64_t> latest_live;
  for (const auto& [id, l] : live_) {
    if (l.seq > last_end_seq_) continue;
    const Site* s = &sites_[l.site];
    auto [it, inserted] = latest_live.try_emplace(s, l.seq);
    if (!inserted && l.seq > it->second) it->second = l.seq;
  }
  std::uint64_t latest_seq = 0;
  for (const auto& [g, s] : ranked) {
    RetainedSite rs;
    rs.frame = frames.index(s->frame);
    rs.site = s->frame == 0 ? std::string("(no site recorded)") : frames.site_text(s->frame);
    rs.category = s->category;
    rs.growth_per_step_bytes = g / window;
    rs.bytes = s->end_bytes;
    rs.blocks = s->end_blocks;
    const auto it = latest_live.find(s);
    const std::uint64_t seq = it == latest_live.end() ? 0 : it->second;
    if (r.latest < 0 || seq > latest_seq) {
      r.latest = static_cast<std::int64_t>(r.sites.size());
      latest_seq = seq;
    }
    r.sites.push_back(std::move(rs));
  }

  RetentionContext c;
  c.since_step = r.since_step;
  c.growth_steps = r.growth_steps;
  c.growth_per_step_bytes = r.growth_per_step_bytes;
  c.min_growth_bytes = lo;
  c.max_growth_bytes = hi;
  c.growth_constant = r.growth_constant;
  c.bytes = r.bytes;
  c.blocks = r.blocks;
  c.sites = r.sites.size();
  const RetainedSite& latest = r.sites[static_cast<std::size_t>(r.latest)];
  const ReportFrame* frame = latest.frame >= 0 ? &frames.frame(latest.frame) : nullptr;
  c.site = latest.site;
  if (frame != nullptr && (frame->kind == FrameKind::Python || frame->kind == FrameKind::Native)) {
    ReportFrame where;  // the file and line alone: the function is the candidate's own field
    where.kind = frame->kind;
    where.file = frame->file;
    where.line = frame->line;
    c.location = format_site(where);
    c.function = frame->function;
  }
  c.category = latest.category;
  for (std::size_t i = 0; i < kCategoryCount; ++i) c.growth_by_category[i] = by_category[i] / window;
  for (std::size_t i = 0; i < r.sites.size() && i < 5; ++i) {
    const RetainedSite& s = r.sites[i];
    c.evidence_sites.push_back(s.site + " (" + std::string(category_name(s.category)) + "): +" +
                               std::to_string(s.growth_per_step_bytes) + " bytes a step, " +
                               std::to_string(s.blocks) + " blocks live");
  }
  for (std::uint64_t j = std::min<std::uint64_t>(window, 5); j-- > 0;) {
    c.evidence_steps.emplace_back(steps_[(last - j) % kWindow], totals[j]);
  }
  r.verdict = explain_retention(c);
  return r;
}

}  // namespace ridgescope::detail
