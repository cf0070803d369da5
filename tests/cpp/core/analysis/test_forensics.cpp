// Specification of the OOM verdicts, the free-space view and the dashboards (issue: forensics).
#include <string>

#include "catch.h"
#include "ridgescope/analysis.h"
#include "ridgescope/forensics.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {
constexpr std::uint64_t KiB = 1024ull, MiB = 1024 * KiB, GiB = 1024 * MiB;
constexpr std::uint64_t kSecond = 1'000'000'000ull;
const Device kGpu{DeviceType::CUDA, 0};

bool has_remedy_for(const Verdict& v, Category c) {
  for (const Remedy& mine : v.remedies)
    for (const Remedy& theirs : remedies_for(c))
      if (mine.action == theirs.action) return true;
  return false;
}
}  // namespace

SCENARIO("free blocks that add up but do not fit: fragmentation", "[core][forensics]") {
  GIVEN("free blocks of 600, 300 and 200 MiB between live blocks, and a request of 800 MiB") {
    TempPath path;
    {
      TraceBuilder t(path.str(), kGpu);
      const std::uint64_t base = 0x7f0000000000ull;
      t.segment(base, 1600 * MiB);
      // live 100 | free 600 | live 100 | free 300 | live 100 | free 200 | live 200
      t.alloc(base, 100 * MiB).alloc(base + 100 * MiB, 600 * MiB).alloc(base + 700 * MiB, 100 * MiB);
      t.alloc(base + 800 * MiB, 300 * MiB).alloc(base + 1100 * MiB, 100 * MiB);
      t.alloc(base + 1200 * MiB, 200 * MiB).alloc(base + 1400 * MiB, 200 * MiB);
      t.free(base + 100 * MiB).free(base + 800 * MiB).free(base + 1200 * MiB);
      t.begin("forward").oom(800 * MiB, 10 * MiB).end("forward");
    }
    const Report r = analyze_trace(path.str());
    REQUIRE(r.ooms.size() == 1);
    const OomRecord& o = r.ooms[0];
    THEN("the verdict is fragmentation with the largest free block and the free total") {
      CHECK(o.verdict.kind == "fragmentation");
      CHECK(o.free.largest_free_block == 600 * MiB);
      CHECK(o.free.free_bytes == 1100 * MiB);
      CHECK(o.free.free_blocks == 3);
      CHECK_THAT(o.verdict.summary, Catch::Matchers::Contains("600 MiB"));
      CHECK_THAT(o.verdict.summary, Catch::Matchers::Contains("1.07 GiB"));
    }
  }
}

SCENARIO("65 GiB live on an 80 GiB device and a 20 GiB request: live tensors", "[core][forensics]") {
  GIVEN("a run that holds 65 GiB of activations for a minute, then asks for 20 GiB more") {
    TempPath path;
    {
      TraceBuilder t(path.str(), kGpu);
      t.at(0).metadata("run", "{\"device_capacity_bytes\": 85899345920}");
      const std::uint64_t base = 0x7f0000000000ull;
      t.at(1 * kSecond).segment(base, 65 * GiB).begin("forward");
      for (std::uint64_t i = 0; i < 65; ++i) {  // saved for backward, as the pack hook reports
        t.at((2 + i) * kSecond).alloc(base + i * GiB, GiB).tag(base + i * GiB, Category::Activation, "", true);
      }
      t.at(70 * kSecond).oom(20 * GiB, 15 * GiB).end("forward");
    }
    const Report r = analyze_trace(path.str());
    REQUIRE(r.ooms.size() == 1);
    THEN("the verdict is live tensors, dominated by what was live, with its remedies") {
      CHECK(r.ooms[0].verdict.kind == "live_tensors");
      CHECK(r.ooms[0].verdict.dominant == Category::Activation);
      CHECK(has_remedy_for(r.ooms[0].verdict, Category::Activation));
      CHECK(r.device_capacity_bytes == 80 * GiB);
    }
    THEN("no dashboard sample shows more than 65 GiB, and the failed request never appears") {
      REQUIRE(r.dashboards.size() == 2);
      for (const SamplerView& d : r.dashboards) {
        CHECK(d.max_sample_bytes <= 65 * GiB);
        CHECK(d.samples >= 2);
      }
      CHECK(r.peak.bytes == 65 * GiB);
      CHECK(r.dashboards[0].period_ns == 15 * kSecond);
      CHECK(r.dashboards[1].max_sample_bytes < r.peak.bytes);  // a 30 s sampler misses the peak
    }
  }
}

SCENARIO("forward and backward fit, the first optimizer step fails creating Adam moments", "[core][forensics]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.metadata("run", "{\"device_capacity_bytes\": 10000}");
    t.alloc(0x100, 2000).tag(0x100, Category::Parameter, "w");
    t.begin("forward").alloc(0x200, 3000).end("forward");
    t.begin("backward").alloc(0x300, 2000).tag(0x300, Category::Gradient, "grad of w").free(0x200).end("backward");
    t.begin("optimizer_step").alloc(0x400, 2000).tag(0x400, Category::OptimizerState, "exp_avg of w");
    t.oom(2000, 4000 - 2000).end("optimizer_step");
  }
  const Report r = analyze_trace(path.str());
  REQUIRE(r.ooms.size() == 1);
  const Verdict& v = r.ooms[0].verdict;
  CHECK(v.kind == "lazy_optimizer_state");
  CHECK_THAT(v.summary, Catch::Matchers::Contains("3.91 KiB"));  // the exp_avg made + the exp_avg_sq asked for
  CHECK(has_remedy_for(v, Category::OptimizerState));
  CHECK_FALSE(has_remedy_for(v, Category::Activation));
}

SCENARIO("each dominant category gets its own remedies and none of the others'", "[core][forensics]") {
  for (Category c : {Category::Activation, Category::Parameter, Category::OptimizerState}) {
    OomContext ctx;
    ctx.request_bytes = 100;
    ctx.capacity_bytes = 1000;
    ctx.device_free_bytes = 50;
    ctx.live_bytes = ctx.reserved_bytes = 950;
    ctx.phase = "forward";
    ctx.by_category[category_index(c)] = 800;
    ctx.by_category[category_index(Category::Input)] = 150;
    const Verdict v = explain_oom(ctx);
    CHECK(v.kind == "live_tensors");
    CHECK(v.dominant == c);
    for (Category other : {Category::Activation, Category::Parameter, Category::OptimizerState}) {
      CHECK(has_remedy_for(v, other) == (other == c));
    }
    CHECK_THAT(v.summary, Catch::Matchers::Contains("emptying the cache would not help"));
  }
}

SCENARIO("a temporary on top of a step that otherwise fits: a transient peak", "[core][forensics]") {
  OomContext ctx;
  ctx.request_bytes = 300;
  ctx.capacity_bytes = 1000;
  ctx.device_free_bytes = 100;
  ctx.live_bytes = ctx.reserved_bytes = 900;
  ctx.phase = "backward";
  ctx.by_category[category_index(Category::Parameter)] = 400;
  ctx.by_category[category_index(Category::Temporary)] = 500;
  const Verdict v = explain_oom(ctx);
  CHECK(v.kind == "transient_peak");
  CHECK(v.dominant == Category::Temporary);
}

SCENARIO("memory outside PyTorch that the request would otherwise fit in", "[core][forensics]") {
  OomContext ctx;
  ctx.request_bytes = 200;
  ctx.capacity_bytes = 1000;
  ctx.device_free_bytes = 100;
  ctx.live_bytes = ctx.reserved_bytes = 500;  // 400 used by something else
  ctx.phase = "forward";
  ctx.by_category[category_index(Category::Activation)] = 500;
  CHECK(explain_oom(ctx).kind == "non_pytorch");
}

SCENARIO("free space can be asked at any instant", "[core][forensics]") {
  const FreeSpace f = free_space({{0, 100}, {1000, 50}}, {{10, 20}, {60, 40}, {1000, 10}});
  CHECK(f.free_bytes == 10 + 30 + 40);
  CHECK(f.largest_free_block == 40);
  CHECK(f.free_blocks == 3);
  CHECK(f.can_serve(40));
  CHECK_FALSE(f.can_serve(41));
}

SCENARIO("free blocks are counted per pool; a free block never serves the other pool", "[core][forensics]") {
  GIVEN("a 2 MiB small-pool segment with 1.5 MiB free, a 20 MiB large-pool segment with 1 MiB free") {
    const std::uint64_t small = 0x10000000, large = 0x20000000;
    const std::vector<AddressRange> segments = {{small, 2 * MiB}, {large, 20 * MiB}};
    const std::vector<AddressRange> live = {{small, 512 * KiB}, {large, 19 * MiB}};
    WHEN("the free space is computed") {
      const FreeSpace f = free_space(segments, live);
      THEN("each pool has its own largest free block, and both gaps are inactive splits") {
        CHECK(f.free_bytes == 2560 * KiB);
        CHECK(f.largest_free_block == 1536 * KiB);
        CHECK(f.largest_free_block_small_pool == 1536 * KiB);
        CHECK(f.largest_free_block_large_pool == 1 * MiB);
        CHECK(f.inactive_split_bytes == 2560 * KiB);
      }
      THEN("a 1 MiB request fits the small pool; a 1.25 MiB one (large pool) does not fit anywhere") {
        CHECK(f.can_serve(1 * MiB));
        CHECK_FALSE(f.can_serve(1280 * KiB));
      }
    }
    WHEN("a wholly free 20 MiB segment is added") {
      std::vector<AddressRange> more = segments;
      more.push_back({0x30000000, 20 * MiB});
      const FreeSpace f = free_space(more, live);
      THEN("it serves large requests but is not an inactive split") {
        CHECK(f.largest_free_block_large_pool == 20 * MiB);
        CHECK(f.inactive_split_bytes == 2560 * KiB);
        CHECK(f.can_serve(1280 * KiB));
      }
    }
  }
}

SCENARIO("a large request that only the small pool's free block could hold: fragmentation", "[core][forensics]") {
  GIVEN("1.5 MiB free in a small-pool segment, 1 MiB free in a large one, and a 1.25 MiB request") {
    OomContext ctx;
    ctx.request_bytes = 1280 * KiB;
    ctx.live_bytes = 512 * KiB + 19 * MiB;
    ctx.reserved_bytes = 22 * MiB;
    ctx.capacity_bytes = 22 * MiB;
    ctx.phase = "forward";
    ctx.by_category[category_index(Category::Activation)] = ctx.live_bytes;
    ctx.free = free_space({{0x10000000, 2 * MiB}, {0x20000000, 20 * MiB}},
                          {{0x10000000, 512 * KiB}, {0x20000000, 19 * MiB}});
    const Verdict v = explain_oom(ctx);
    THEN("the verdict is fragmentation, with the large pool's largest free block as evidence") {
      CHECK(v.kind == "fragmentation");
      CHECK_THAT(v.summary, Catch::Matchers::Contains("1.00 MiB"));
      bool named = false;
      for (const std::string& e : v.evidence)
        named = named || (e.find("large pool") != std::string::npos &&
                          e.find("inactive split 2.50 MiB") != std::string::npos);
      CHECK(named);
    }
  }
}

SCENARIO("the free space at the peak answers whether a request fits in the cache", "[core][forensics]") {
  TempPath path;
  {
    TraceBuilder t(path.str(), kGpu);
    t.segment(0x10000000, 20 * MiB).alloc(0x10000000, 4 * MiB).alloc(0x10000000 + 8 * MiB, 10 * MiB);
  }
  const Report r = analyze_trace(path.str());
  CHECK(r.peak.free.free_bytes == 6 * MiB);
  CHECK(r.peak.free.largest_free_block == 4 * MiB);
  CHECK(r.peak.free.can_serve(4 * MiB));
  CHECK_FALSE(r.peak.free.can_serve(5 * MiB));
}

SCENARIO("NVML samples are reconciled against reserved bytes", "[core][forensics]") {
  GIVEN("a GPU run that reserves 2 GiB while the driver reports 2.5 GiB used of 80 GiB") {
    TempPath path;
    {
      TraceBuilder t(path.str(), kGpu);
      t.metadata("driver_view", "{\"available\": true, \"interval_ms\": 100}");
      t.segment(0x10000000, 2 * GiB).alloc(0x10000000, GiB);
      Event e;
      e.kind = EventKind::Sample;
      e.device = kGpu;
      e.string_id = t.recorder().intern("nvml_used_bytes");
      e.value = 2 * GiB + 512 * MiB;
      t.recorder().record(e);
      e.string_id = t.recorder().intern("nvml_total_bytes");
      e.value = 80 * GiB;
      t.recorder().record(e);
    }
    const Report r = analyze_trace(path.str());
    THEN("what the driver sees beyond the reserved bytes is memory outside PyTorch") {
      REQUIRE(r.driver_view.available.has_value());
      CHECK(*r.driver_view.available);
      CHECK(r.driver_view.samples == 1);
      CHECK(r.driver_view.max_non_pytorch_bytes == 512 * MiB);
      CHECK(r.driver_view.total_bytes == 80 * GiB);
      CHECK(r.device_capacity_bytes == 80 * GiB);  // the capacity, when the run declared none
    }
  }
}

SCENARIO("the free space can be probed at any instant of the run", "[core][forensics]") {
  TempPath path;
  {
    TraceBuilder t(path.str(), kGpu);
    t.at(0).segment(0x10000000, 20 * MiB);
    t.at(10).alloc(0x10000000, 4 * MiB).alloc(0x10000000 + 8 * MiB, 10 * MiB);
    t.at(20).free(0x10000000 + 8 * MiB);
  }
  AnalysisOptions at15;
  at15.probe_time_ns = 15;
  const Report r = analyze_trace(path.str(), at15);
  REQUIRE(r.probe.has_value());
  CHECK(r.probe->live_bytes == 14 * MiB);
  CHECK(r.probe->free.largest_free_block == 4 * MiB);
  AnalysisOptions at25;
  at25.probe_time_ns = 25;
  const Report later = analyze_trace(path.str(), at25);
  CHECK(later.probe->free.largest_free_block == 16 * MiB);
  CHECK_FALSE(analyze_trace(path.str()).probe.has_value());
}
