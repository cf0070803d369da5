// Specification of the analysis' host-memory ledger (csrc/core/analysis/host_ledger.cpp): the
// CPU host_* samples of a trace become readings, and a reading the source took without glibc's
// counters (mallinfo2 is read under a time budget: csrc/torch/host_memory_source.h) carries the
// last ones forward and says when they were read. The readings are plain numbers: every figure
// is exact.
#include <cstdint>
#include <string>

#include "catch.h"
#include "json_value.h"
#include "ridgescope/analysis.h"
#include "ridgescope/report.h"
#include "trace_builder.h"

using namespace ridgescope;
using namespace ridgescope::testing;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// One reading as host_memory_source writes it (CPU samples, the resident set last); without
// glibc's counters when `malloc_in_use` is 0; `skipped`: the phase ends its time budget left
// unread since the reading before.
void reading(TraceBuilder& t, std::uint64_t torch_bytes, std::uint64_t malloc_in_use, std::uint64_t malloc_free,
             std::uint64_t anon, std::uint64_t skipped = 0) {
  t.sample("host_torch_allocated_bytes", torch_bytes).sample("host_torch_resident_bytes", torch_bytes);
  if (malloc_in_use != 0) t.sample("host_malloc_in_use_bytes", malloc_in_use).sample("host_malloc_free_bytes", malloc_free);
  t.sample("host_rss_anon_bytes", anon).sample("host_rss_file_bytes", 100 * MiB).sample("host_rss_shmem_bytes", 0);
  if (skipped != 0) t.sample("host_readings_skipped", skipped);
  t.sample("host_resident_bytes", anon + 100 * MiB);
}

// A start reading with glibc's counters (8 MiB of torch's, 40 MiB in use, 6 MiB free), a forward
// that allocates 16 MiB and the reading at its end (with `end_malloc_in_use`, 0: none; after
// `end_skipped` phase ends left unread); when `last_skipped` is not 0, one more reading after
// the step, after that many.
void forward_trace(const std::string& path, std::uint64_t end_malloc_in_use, std::uint64_t end_skipped = 0,
                   std::uint64_t last_skipped = 0) {
  TraceBuilder t(path);
  t.at(1000);
  reading(t, 8 * MiB, 40 * MiB, 6 * MiB, 300 * MiB);
  t.at(2000).begin("forward").alloc(0x1000, 16 * MiB);
  t.at(3000);
  reading(t, 24 * MiB, end_malloc_in_use, end_malloc_in_use != 0 ? 6 * MiB : 0, 316 * MiB, end_skipped);
  t.end("forward").step(0);
  if (last_skipped != 0) {
    t.at(4000);
    reading(t, 24 * MiB, end_malloc_in_use, 6 * MiB, 316 * MiB, last_skipped);
  }
  t.close();
}
}  // namespace

SCENARIO("a reading without glibc's counters carries the last ones forward, and says when they were read",
         "[core][analysis][host]") {
  GIVEN("a trace whose start reading has glibc's counters, and whose forward's end reading has none") {
    TempPath path;
    forward_trace(path.str(), 0);
    WHEN("it is analysed") {
      const Report r = analyze_trace(path.str());
      REQUIRE(r.host_memory);
      const HostMemoryReport& h = *r.host_memory;
      REQUIRE(h.rows.size() == 2);
      THEN("the first row's counters are its own") {
        CHECK(h.rows[0].malloc_time_ns == 1000);
        CHECK(h.rows[0].layers.malloc_known);
        CHECK(h.rows[0].layers.slack == 6 * MiB);
        CHECK(h.rows[0].layers.other_heap == 32 * MiB);  // 40 MiB in use - torch's 8
      }
      THEN("the second row carries them, from the first row's time") {
        const HostSample& s = h.rows[1];
        CHECK(s.time_ns == 3000);
        CHECK(s.phase == "forward");
        CHECK(s.malloc_time_ns == 1000);
        CHECK(s.layers.malloc_known);
        CHECK(s.layers.slack == 6 * MiB);
        CHECK(s.layers.other_heap == 16 * MiB);  // the carried 40 MiB in use - torch's 24 now
        CHECK(s.layers.pytorch == 24 * MiB);
        CHECK(s.layers.resident == 416 * MiB);
      }
      THEN("the JSON row says when glibc's counters were read") {
        std::string error;
        const auto json = detail::parse_json(r.to_json(), &error);
        REQUIRE(json);
        const detail::JsonValue* rows = json->get("host_memory")->get("rows");
        REQUIRE(rows);
        REQUIRE(rows->array.size() == 2);
        CHECK(rows->array[0].get_uint("malloc_time_ns") == 1000);
        CHECK(rows->array[1].get_uint("malloc_time_ns") == 1000);
        CHECK(rows->array[1].get_uint("time_ns") == 3000);
      }
    }
  }
  GIVEN("a trace whose only reading has no glibc counters (another libc)") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.at(1000);
      reading(t, 8 * MiB, 0, 0, 300 * MiB);
      t.close();
    }
    THEN("nothing is carried: the counters are unknown and were never read") {
      const Report r = analyze_trace(path.str());
      REQUIRE(r.host_memory);
      REQUIRE(r.host_memory->rows.size() == 1);
      CHECK_FALSE(r.host_memory->rows[0].layers.malloc_known);
      CHECK(r.host_memory->rows[0].malloc_time_ns == 0);
      CHECK(r.host_memory->rows[0].layers.slack == 0);
    }
  }
}

SCENARIO("the phase ends the source's time budget left unread are counted, and the readings stay exact",
         "[core][analysis][host]") {
  GIVEN("a trace of three readings, the second after 3 skipped phase ends and the third after 4") {
    TempPath path;
    forward_trace(path.str(), 56 * MiB, 3, 4);
    WHEN("it is analysed") {
      const Report r = analyze_trace(path.str());
      REQUIRE(r.host_memory);
      THEN("the readings are the three taken, and the skipped phase ends are their sum") {
        CHECK(r.host_memory->samples == 3);
        CHECK(r.host_memory->rows.size() == 3);
        CHECK(r.host_memory->readings_skipped == 7);
        CHECK(r.host_memory->phase_end_readings == 1);  // forward's; the other two are outside any phase
        CHECK(r.host_memory->rows[1].layers.pytorch == 24 * MiB);
        CHECK(r.host_memory->rows[1].layers.other_heap == 32 * MiB);
      }
      THEN("the JSON says so") {
        std::string error;
        const auto json = detail::parse_json(r.to_json(), &error);
        REQUIRE(json);
        CHECK(json->get("host_memory")->get_uint("readings_skipped") == 7);
        CHECK(json->get("host_memory")->get_uint("samples") == 3);
        CHECK(json->get("host_memory")->get_uint("phase_end_readings") == 1);
      }
    }
  }
}
