// glance_json.cpp — the "at_a_glance" section (glance_json.h). Each step is one row of integers
// under named columns, so a long run costs well under 200 bytes of JSON per step: only the
// categories and phases that appear in some step have a column.
#include "glance_json.h"

#include <string>
#include <vector>

namespace ridgescope::detail {

void write_glance(JsonWriter& w, const RunGlance& g) {
  w.key("at_a_glance").begin_object();
  w.field("recorded", g.recorded);
  w.key("keep_steps");
  if (g.keep_steps) w.value(*g.keep_steps); else w.null();
  w.field("steps", static_cast<std::uint64_t>(g.steps.size()));
  w.field("median_peak_bytes", g.median_peak_bytes).field("max_peak_bytes", g.max_peak_bytes);
  w.field("max_peak_step", g.max_peak_step).field("standout_fraction", g.standout_fraction);
  std::vector<std::size_t> categories;
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    for (const GlanceStep& s : g.steps) {
      if (s.peak_by_category[c] != 0) {
        categories.push_back(c);
        break;
      }
    }
  }
  w.key("columns").begin_array();
  for (const char* c : {"step", "duration_ns", "peak_bytes", "peak_reserved_bytes", "start_bytes", "end_bytes",
                        "allocations", "ooms", "marks", "flags"}) {
    w.value(c);
  }
  for (std::size_t c : categories) w.value("peak." + std::string(category_name(static_cast<Category>(c))));
  for (const std::string& p : g.phases) w.value("phase." + p);
  w.end_array();
  w.key("rows").begin_array();
  for (const GlanceStep& s : g.steps) {
    w.begin_array();
    for (std::uint64_t v : {s.step, s.duration_ns, s.peak_bytes, s.peak_reserved_bytes, s.start_bytes, s.end_bytes,
                            s.allocations, s.ooms, s.marks, static_cast<std::uint64_t>(s.flags)}) {
      w.value(v);
    }
    for (std::size_t c : categories) w.value(s.peak_by_category[c]);
    for (std::uint64_t p : s.phase_peaks) w.value(p);
    w.end_array();
  }
  w.end_array();
  w.key("marks").begin_array();  // the named steps: [step, name]
  for (const GlanceStep& s : g.steps) {
    if (!s.mark.empty()) w.begin_array().value(s.step).value(s.mark).end_array();
  }
  w.end_array();
  w.key("growing_categories").begin_array();
  for (const GrowingCategory& c : g.growing) {
    w.begin_object().field("category", category_name(c.category));
    w.field("first_bytes", c.first_bytes).field("last_bytes", c.last_bytes).field("growth_bytes", c.growth_bytes);
    w.field("growth_per_step_bytes", c.growth_per_step_bytes).end_object();
  }
  w.end_array();
  w.field("standouts_total", g.standouts_total);
  w.key("standouts").begin_array();
  for (const StandoutStep& s : g.standouts) {
    w.begin_object().field("step", s.step).field("peak_bytes", s.peak_bytes).field("over_median", s.over_median);
    w.key("reasons").begin_array();
    for (const std::string& r : s.reasons) w.value(r);
    w.end_array();
    w.end_object();
  }
  w.end_array();
  w.key("windows").begin_array();
  for (const KeptWindow& k : g.windows) {
    w.begin_object().field("first_step", k.first_step).field("last_step", k.last_step);
    w.key("reasons").begin_array();
    for (const std::string& r : k.reasons) w.value(r);
    w.end_array();
    w.end_object();
  }
  w.end_array();
  w.end_object();
}

}  // namespace ridgescope::detail
