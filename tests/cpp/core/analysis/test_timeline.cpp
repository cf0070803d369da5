// Specification of Report::timeline: live bytes over time in a bounded number of columns, each
// keeping its exact minimum and maximum, so downsampling never hides a peak.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "catch.h"
#include "json_value.h"
#include "ridgescope/analysis.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {
std::uint64_t cat(const CategoryBytes& bytes, Category c) { return bytes[category_index(c)]; }
std::uint64_t sum(const CategoryBytes& bytes) {
  std::uint64_t s = 0;
  for (auto b : bytes) s += b;
  return s;
}
}  // namespace

SCENARIO("a one-event spike inside a column survives downsampling", "[core][timeline]") {
  GIVEN("a trace of 10 us cut into 10 columns of 1 us, with a 5000-byte block alive for 1 ns") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.at(0).alloc(0x1000, 1000).tag(0x1000, Category::Parameter, "w");
      t.at(2400).alloc(0x2000, 200);
      t.at(2500).alloc(0x3000, 5000);  // the spike: the run's peak, 1000 + 200 + 5000
      t.at(2501).free(0x3000);
      t.at(2600).free(0x2000);
      t.at(7000).alloc(0x4000, 300);
      t.at(9999).free(0x4000);
    }
    AnalysisOptions options;
    options.timeline_columns = 10;
    const Report r = analyze_trace(path.str(), options);
    const Timeline& tl = r.timeline;
    REQUIRE(tl.columns.size() == 10);
    CHECK(tl.column_ns == 1000);
    CHECK(tl.end_time_ns == 9999);

    THEN("the spike's column keeps it as its maximum, exactly the report's peak") {
      REQUIRE(r.peak.bytes == 6200);
      const TimelineColumn& c = tl.columns[2];
      CHECK(c.max_bytes == r.peak.bytes);
      CHECK(c.max_time_ns == r.peak.time_ns);
      CHECK(c.max_time_ns == 2500);
      CHECK(c.min_bytes == 1000);  // carried in, and again after the frees at 2600
      CHECK(c.reserved_bytes == 6200);  // CPU: reserved is what is live
      CHECK(cat(c.max_by_category, Category::Parameter) == 1000);
      CHECK(sum(c.max_by_category) == 6200);
      CHECK(c.max_by_category == r.peak.by_category);
    }
    THEN("a column no event touches carries the state before it") {
      for (std::size_t i : {1u, 3u, 4u, 5u, 6u}) {
        INFO("column " << i);
        CHECK(tl.columns[i].min_bytes == 1000);
        CHECK(tl.columns[i].max_bytes == 1000);
        CHECK(tl.columns[i].max_time_ns == i * 1000);
        CHECK(cat(tl.columns[i].max_by_category, Category::Parameter) == 1000);
      }
      CHECK(tl.columns[8].min_bytes == 1300);
      CHECK(tl.columns[8].max_bytes == 1300);
    }
    THEN("the first column starts from nothing live, the last ends after the final free") {
      CHECK(tl.columns[0].min_bytes == 0);
      CHECK(tl.columns[0].max_bytes == 1000);
      CHECK(tl.columns[7].max_bytes == 1300);
      CHECK(tl.columns[7].max_time_ns == 7000);
      CHECK(tl.columns[9].max_bytes == 1300);  // carried in; the free at 9999 lowers only the min
      CHECK(tl.columns[9].min_bytes == 1000);
    }
    THEN("exactly one column reaches the peak") {
      CHECK(std::count_if(tl.columns.begin(), tl.columns.end(),
                          [&](const TimelineColumn& c) { return c.max_bytes == r.peak.bytes; }) == 1);
    }
  }
}

SCENARIO("100000 events drawn in 100 columns keep every column's exact minimum and maximum",
         "[core][timeline]") {
  GIVEN("a sawtooth of allocations with one tall spike, one event per 10 ns") {
    TempPath path;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> live_at;  // (time, live after the event)
    {
      TraceBuilder t(path.str());
      std::uint64_t live = 0, time = 0;
      std::vector<std::uint64_t> open;
      for (std::uint64_t i = 0; i < 50000; ++i) {
        const std::uint64_t addr = 0x100000 + i * 0x100;
        const std::uint64_t bytes = (i == 31337) ? 100'000'000 : 64 + (i * 7919) % 4096;
        t.at(time).alloc(addr, bytes);
        live += bytes;
        live_at.emplace_back(time, live);
        time += 10;
        open.push_back(bytes);
        if (i % 5 == 4 || i == 31337) {  // free the newest block, keep the others a while
          t.at(time).free(addr);
          live -= bytes;
          open.pop_back();
        } else {
          t.at(time).alloc(addr + 0x80, 16).free(addr + 0x80);  // a 16-byte blip, no state left
          live_at.emplace_back(time, live + 16);
        }
        live_at.emplace_back(time, live);
        time += 10;
      }
    }
    AnalysisOptions options;
    options.timeline_columns = 100;
    const Report r = analyze_trace(path.str(), options);
    const Timeline& tl = r.timeline;
    REQUIRE(tl.columns.size() <= 100);
    REQUIRE(!tl.columns.empty());

    THEN("each column's min and max equal a brute-force scan of the states inside it") {
      std::vector<std::uint64_t> lo(tl.columns.size(), UINT64_MAX), hi(tl.columns.size(), 0);
      std::uint64_t carried = 0;
      std::size_t k = 0;
      for (std::size_t col = 0; col < tl.columns.size(); ++col) {
        lo[col] = hi[col] = carried;  // the state entering the column
        while (k < live_at.size() && live_at[k].first / tl.column_ns == col) {
          lo[col] = std::min(lo[col], live_at[k].second);
          hi[col] = std::max(hi[col], live_at[k].second);
          carried = live_at[k].second;
          ++k;
        }
      }
      REQUIRE(k == live_at.size());
      for (std::size_t col = 0; col < tl.columns.size(); ++col) {
        INFO("column " << col);
        CHECK(tl.columns[col].min_bytes == lo[col]);
        CHECK(tl.columns[col].max_bytes == hi[col]);
        CHECK(sum(tl.columns[col].max_by_category) == hi[col]);
      }
    }
    THEN("the highest column is the report's peak, at the peak's instant") {
      const auto top = std::max_element(tl.columns.begin(), tl.columns.end(),
                                        [](const auto& a, const auto& b) { return a.max_bytes < b.max_bytes; });
      CHECK(top->max_bytes == r.peak.bytes);
      CHECK(top->max_time_ns == r.peak.time_ns);
    }
  }
}

SCENARIO("the timeline carries step ends, phase intervals and OOM instants", "[core][timeline]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.at(100).begin("forward").at(150).alloc(0x10, 64).at(200).end("forward");
    t.at(210).begin("backward").at(220).begin("recompute").at(230).end("recompute");
    t.at(300).end("backward").at(310).step(0);
    t.at(400).begin("forward").at(450).oom(1 << 20, 0).at(500).end("forward");
  }
  const Report r = analyze_trace(path.str());
  const Timeline& tl = r.timeline;
  CHECK(tl.end_time_ns == 500);
  CHECK(tl.column_ns == 1);  // fewer nanoseconds than columns: one column per nanosecond
  CHECK(tl.columns.size() == 501);
  REQUIRE(tl.step_ends.size() == 1);
  CHECK(tl.step_ends[0] == std::pair<std::uint64_t, std::uint64_t>{0, 310});
  REQUIRE(tl.phases.size() == 4);
  CHECK(tl.phases[0].phase == "forward");
  CHECK(tl.phases[0].begin_time_ns == 100);
  CHECK(tl.phases[0].end_time_ns == 200);
  CHECK(tl.phases[1].phase == "backward");
  CHECK(tl.phases[1].end_time_ns == 300);
  CHECK(tl.phases[2].phase == "recompute");
  CHECK(tl.phases[2].depth == 1);
  CHECK(tl.phases[2].begin_time_ns == 220);
  CHECK(tl.phases[3].phase == "forward");
  CHECK(tl.phases[3].step == 1);
  CHECK(tl.oom_times_ns == std::vector<std::uint64_t>{450});
  AND_THEN("steps know when they began and ended") {
    REQUIRE(r.steps.size() == 2);
    CHECK(r.steps[0].begin_time_ns == 100);
    CHECK(r.steps[0].end_time_ns == 310);
    CHECK(r.steps[1].begin_time_ns == 400);
    CHECK(r.steps[1].end_time_ns == 500);  // never closed: ends with the trace
  }
}

SCENARIO("the timeline JSON is columnar and bounded by the column count", "[core][timeline][json]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    for (std::uint64_t i = 0; i < 5000; ++i) t.at(i * 3).alloc(0x1000 + i * 16, 16);
  }
  AnalysisOptions options;
  options.timeline_columns = 50;
  const Report r = analyze_trace(path.str(), options);
  std::string error;
  const auto json = detail::parse_json(report_to_json(r), &error);
  REQUIRE(json);
  const detail::JsonValue* tl = json->get("timeline");
  REQUIRE(tl != nullptr);
  CHECK(tl->get_uint("columns") == r.timeline.columns.size());
  CHECK(tl->get_uint("column_ns") == r.timeline.column_ns);
  CHECK(r.timeline.columns.size() == 50);
  REQUIRE(tl->get("index") != nullptr);
  CHECK(tl->get("index")->array.size() == 50);  // every column has a change: all are listed
  for (const char* key : {"changes", "min_bytes", "max_bytes", "max_time_ns", "reserved_bytes"}) {
    INFO(key);
    REQUIRE(tl->get(key) != nullptr);
    CHECK(tl->get(key)->array.size() == 50);
  }
  const auto& max = tl->get("max_bytes")->array;
  CHECK(static_cast<std::uint64_t>(max.back().integer) == 5000 * 16);
  CHECK(static_cast<std::uint64_t>(max.back().integer) == r.peak.bytes);
  const detail::JsonValue* by_cat = tl->get("max_by_category");
  REQUIRE(by_cat != nullptr);
  CHECK(by_cat->object.size() == kCategoryCount);
  CHECK(by_cat->get("unknown")->array.size() == 50);
}

SCENARIO("quiet columns are left out of the JSON and read as the last listed column",
         "[core][timeline][json]") {
  GIVEN("changes in columns 0 and 6 of 10 only") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.at(0).alloc(0x10, 100).at(500).alloc(0x20, 50);  // column 0
      t.at(6200).free(0x20).at(9999).begin("forward");   // column 6; the phase sets the end time
    }
    AnalysisOptions options;
    options.timeline_columns = 10;
    const Report r = analyze_trace(path.str(), options);
    REQUIRE(r.timeline.columns.size() == 10);
    std::string error;
    const auto json = detail::parse_json(report_to_json(r), &error);
    REQUIRE(json);
    const detail::JsonValue* tl = json->get("timeline");
    REQUIRE(tl != nullptr);
    THEN("the changed columns and the one after each are listed") {
      std::vector<std::int64_t> index;
      for (const auto& v : tl->get("index")->array) index.push_back(v.integer);
      CHECK(index == std::vector<std::int64_t>{0, 1, 6, 7});
      std::vector<std::int64_t> max, min, changes;
      for (const auto& v : tl->get("max_bytes")->array) max.push_back(v.integer);
      for (const auto& v : tl->get("min_bytes")->array) min.push_back(v.integer);
      for (const auto& v : tl->get("changes")->array) changes.push_back(v.integer);
      CHECK(max == std::vector<std::int64_t>{150, 150, 150, 100});
      CHECK(min == std::vector<std::int64_t>{0, 150, 100, 100});
      CHECK(changes == std::vector<std::int64_t>{2, 0, 1, 0});
    }
    THEN("every column left out equals the last listed one before it") {
      for (std::size_t i : {2u, 3u, 4u, 5u}) {
        CHECK(r.timeline.columns[i].max_bytes == 150);
        CHECK(r.timeline.columns[i].min_bytes == 150);
      }
      for (std::size_t i : {8u, 9u}) {
        CHECK(r.timeline.columns[i].max_bytes == 100);
        CHECK(r.timeline.columns[i].min_bytes == 100);
      }
    }
  }
}

SCENARIO("phases and step ends are written as columns, phase names once", "[core][timeline][json]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    for (std::uint64_t step = 0; step < 3; ++step) {
      const std::uint64_t base = step * 1000;
      t.at(base + 10).begin("forward").at(base + 20).alloc(0x10, 64).at(base + 30).end("forward");
      t.at(base + 40).begin("backward").at(base + 50).free(0x10).at(base + 60).end("backward");
      t.at(base + 70).step(step);
    }
  }
  const Report r = analyze_trace(path.str());
  std::string error;
  const auto json = detail::parse_json(report_to_json(r), &error);
  REQUIRE(json);
  const detail::JsonValue* tl = json->get("timeline");
  REQUIRE(tl != nullptr);
  auto ints = [](const detail::JsonValue* v) {
    std::vector<std::int64_t> out;
    for (const auto& x : v->array) out.push_back(x.integer);
    return out;
  };
  const detail::JsonValue* ends = tl->get("step_ends");
  REQUIRE(ends != nullptr);
  CHECK(ints(ends->get("step")) == std::vector<std::int64_t>{0, 1, 2});
  CHECK(ints(ends->get("time_ns")) == std::vector<std::int64_t>{70, 1070, 2070});
  const detail::JsonValue* ph = tl->get("phases");
  REQUIRE(ph != nullptr);
  REQUIRE(ph->get("names") != nullptr);
  REQUIRE(ph->get("names")->array.size() == 2);
  CHECK(ph->get("names")->array[0].string == "forward");
  CHECK(ph->get("names")->array[1].string == "backward");
  CHECK(ints(ph->get("name")) == std::vector<std::int64_t>{0, 1, 0, 1, 0, 1});
  CHECK(ints(ph->get("step")) == std::vector<std::int64_t>{0, 0, 1, 1, 2, 2});
  CHECK(ints(ph->get("depth")) == std::vector<std::int64_t>{0, 0, 0, 0, 0, 0});
  CHECK(ints(ph->get("begin_time_ns")) == std::vector<std::int64_t>{10, 40, 1010, 1040, 2010, 2040});
  CHECK(ints(ph->get("end_time_ns")) == std::vector<std::int64_t>{30, 60, 1030, 1060, 2030, 2060});
}
