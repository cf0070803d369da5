// run_glance.cpp — the run at a glance (run_glance.h, ridgescope/run_glance.h).
#include "run_glance.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "json_value.h"
#include "ridgescope/phase.h"

namespace ridgescope::detail {
namespace {

std::uint64_t median(std::vector<std::uint64_t> v) {
  if (v.empty()) return 0;
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

// A number of the `flight` metadata (docs/report_schema.md): keep_steps, keep_first_steps.
std::optional<std::uint64_t> flight_option(const Report& report, const char* name) {
  for (const auto& [key, text] : report.metadata) {
    if (key != "flight") continue;
    std::string error;
    auto v = parse_json(text, &error);
    if (v) return v->get_uint(name);
  }
  return std::nullopt;
}

// The categories whose bytes at the step peaks grew: the first and last tenth of the steady
// state (after two warm-up steps when there are more than four) compared by their medians.
void find_growth(RunGlance& g) {
  const std::size_t skip = g.steps.size() > 4 ? 2 : 0;
  const std::size_t n = g.steps.size() - std::min(skip, g.steps.size());
  if (n < 2) return;
  const std::size_t tenth = std::max<std::size_t>(1, n / 10);
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    std::vector<std::uint64_t> first, last;
    for (std::size_t i = 0; i < tenth; ++i) {
      first.push_back(g.steps[skip + i].peak_by_category[c]);
      last.push_back(g.steps[g.steps.size() - tenth + i].peak_by_category[c]);
    }
    const std::uint64_t a = median(first), b = median(last);
    // More than 2 % of the median peak and at least 4 KiB: growth, not noise.
    if (b <= a || b - a < 4096 || static_cast<double>(b - a) < 0.02 * static_cast<double>(g.median_peak_bytes)) continue;
    GrowingCategory gc;
    gc.category = static_cast<Category>(c);
    gc.first_bytes = a;
    gc.last_bytes = b;
    gc.growth_bytes = b - a;
    const double span = static_cast<double>(n - tenth);  // between the two tenths' middles
    gc.growth_per_step_bytes = span > 0 ? static_cast<double>(b - a) / span : 0;
    g.growing.push_back(gc);
  }
  std::sort(g.growing.begin(), g.growing.end(),
            [](const GrowingCategory& x, const GrowingCategory& y) { return x.growth_bytes > y.growth_bytes; });
}

void find_standouts(RunGlance& g) {
  struct Candidate {
    StandoutStep s;
    int rank;  // lower is listed first when the list is cut
  };
  std::vector<Candidate> all;
  std::uint64_t highest = 0;
  const double median_peak = static_cast<double>(g.median_peak_bytes);
  for (std::size_t i = 0; i < g.steps.size(); ++i) {
    const GlanceStep& st = g.steps[i];
    StandoutStep s;
    s.step = st.step;
    s.peak_bytes = st.peak_bytes;
    s.over_median = median_peak > 0 ? static_cast<double>(st.peak_bytes) / median_peak - 1.0 : 0.0;
    int rank = 5;
    if (st.ooms > 0) s.reasons.push_back("oom"), rank = std::min(rank, 0);
    if (st.marks > 0) s.reasons.push_back("mark"), rank = std::min(rank, 1);
    if (st.flags & kSummaryGrowth) s.reasons.push_back("growth"), rank = std::min(rank, 2);
    if (i > 0 && st.peak_bytes > highest) s.reasons.push_back("new_maximum"), rank = std::min(rank, 3);
    if (median_peak > 0 && static_cast<double>(st.peak_bytes) > median_peak * (1.0 + g.standout_fraction)) {
      s.reasons.push_back("above_median");
      rank = std::min(rank, 4);
    }
    highest = std::max(highest, st.peak_bytes);
    if (!s.reasons.empty()) all.push_back(Candidate{std::move(s), rank});
  }
  g.standouts_total = all.size();
  if (all.size() > RunGlance::kMaxStandouts) {
    std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
      if (a.rank != b.rank) return a.rank < b.rank;
      return a.s.over_median > b.s.over_median;
    });
    all.resize(RunGlance::kMaxStandouts);
    std::sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) { return a.s.step < b.s.step; });
  }
  for (Candidate& c : all) g.standouts.push_back(std::move(c.s));
}

// Runs of consecutive steps the replay found events for, and why each was kept.
void find_windows(RunGlance& g, const Report& report) {
  const std::uint64_t first_steps = flight_option(report, "keep_first_steps").value_or(0);
  std::vector<std::uint64_t> kept;
  for (const StepStats& s : report.steps) {
    if (kept.empty() || kept.back() != s.step) kept.push_back(s.step);
  }
  std::map<std::uint64_t, const GlanceStep*> by_step;
  for (const GlanceStep& s : g.steps) by_step[s.step] = &s;
  for (std::size_t i = 0; i < kept.size();) {
    std::size_t j = i;
    while (j + 1 < kept.size() && kept[j + 1] == kept[j] + 1) ++j;
    KeptWindow w{kept[i], kept[j], {}};
    auto reason = [&w](const char* r) {
      if (std::find(w.reasons.begin(), w.reasons.end(), r) == w.reasons.end()) w.reasons.emplace_back(r);
    };
    if (!g.keep_steps) {
      reason("all");
    } else {
      if (j + 1 == kept.size()) reason("last_steps");  // the window the trace ends with
      if (w.first_step < first_steps) reason("first_steps");  // the saved-tensor hook's steps
      if (w.first_step <= g.max_peak_step && g.max_peak_step <= w.last_step) reason("highest_peak");
      for (std::uint64_t s = w.first_step; s <= w.last_step + 1; ++s) {
        auto it = by_step.find(s);
        if (it == by_step.end()) continue;
        const bool inside = s <= w.last_step;
        if (it->second->ooms > 0) reason("oom");
        if (it->second->marks > 0) reason("mark");
        if (inside && (it->second->flags & kSummaryGrowth)) reason("growth");
      }
    }
    g.windows.push_back(std::move(w));
    i = j + 1;
  }
}

}  // namespace

void build_glance(const std::vector<StepSummary>& summaries, bool recorded, const TraceReader& reader,
                  double standout_fraction, Report& report) {
  RunGlance& g = report.glance;
  g.recorded = recorded;
  g.keep_steps = flight_option(report, "keep_steps");
  g.standout_fraction = standout_fraction;
  std::map<std::uint32_t, std::size_t> phase_column;  // name id -> column, in order of appearance
  std::vector<std::uint64_t> peaks;
  for (const StepSummary& s : summaries) {
    if (s.device != report.device) continue;
    GlanceStep st;
    st.step = s.step;
    st.begin_time_ns = s.begin_time_ns;
    st.duration_ns = s.end_time_ns - s.begin_time_ns;
    st.peak_bytes = s.peak_bytes;
    st.peak_reserved_bytes = s.peak_reserved_bytes;
    st.start_bytes = s.start_bytes;
    st.end_bytes = s.end_bytes;
    st.allocations = s.allocations;
    st.ooms = s.ooms;
    st.marks = s.marks;
    st.flags = s.flags;
    st.peak_by_category = s.peak_by_category;
    if (s.mark_id != 0) st.mark = std::string(reader.string(s.mark_id));
    for (const PhasePeak& p : s.phases) {
      auto [it, inserted] = phase_column.try_emplace(p.name_id, g.phases.size());
      if (inserted) {
        const std::string_view name = reader.string(p.name_id);
        g.phases.emplace_back(name.empty() ? std::string("idle") : std::string(name));
      }
      if (st.phase_peaks.size() <= it->second) st.phase_peaks.resize(it->second + 1, 0);
      st.phase_peaks[it->second] = std::max(st.phase_peaks[it->second], p.peak_bytes);
    }
    peaks.push_back(st.peak_bytes);
    if (st.peak_bytes > g.max_peak_bytes) {
      g.max_peak_bytes = st.peak_bytes;
      g.max_peak_step = st.step;
    }
    g.steps.push_back(std::move(st));
  }
  for (GlanceStep& st : g.steps) st.phase_peaks.resize(g.phases.size(), 0);
  g.median_peak_bytes = median(peaks);
  find_growth(g);
  find_standouts(g);
  find_windows(g, report);
}

}  // namespace ridgescope::detail
