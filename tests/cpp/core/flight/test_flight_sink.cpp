// Specification of the flight recorder (ridgescope/flight.h, docs/long-runs.md): a bounded
// trace keeps a summary of every step and the events of the steps that matter, and its
// analysis of those steps is the full trace's.
#include <string>
#include <vector>

#include "catch.h"
#include "ridgescope/analysis.h"
#include "ridgescope/external_alloc.h"
#include "ridgescope/memory_layers.h"
#include "ridgescope/flight.h"
#include "ridgescope/trace_reader.h"
#include "report_queries.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::testing::peak_label_bytes;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {

constexpr std::uint64_t kSteps = 60;
constexpr std::uint64_t kPeakStep = 7;   // a 1 MiB activation in forward, freed in backward
constexpr std::uint64_t kOomStep = 31;   // a failed request in the optimizer step
constexpr std::uint64_t kMarkStep = 44;  // rs.mark("eval")
constexpr std::uint64_t kBig = 1u << 20;

// A training loop on the CPU: two parameters, an input per step, a saved activation and an
// untagged one (inferred from its lifetime), temporaries, gradients tagged at the end of
// backward, optimizer state made lazily in the first step and tagged after it.
void write_run(TraceBuilder& t, std::uint64_t hook_steps = kSteps) {
  std::uint64_t now = 1000;
  auto at = [&](std::uint64_t dt = 100) { t.at(now += dt); };
  at();
  t.alloc(0x1000, 4096).tag(0x1000, Category::Parameter, "fc1.weight");
  t.alloc(0x3000, 1024).tag(0x3000, Category::Parameter, "fc2.weight");
  for (std::uint64_t s = 0; s < kSteps; ++s) {
    at();
    t.begin("zero_grad");
    if (s > 0) t.free(0x60000).free(0x80000);
    t.end("zero_grad");
    t.alloc(0x10000, 512);  // the batch
    at();
    t.begin("forward").tag(0x10000, Category::Input, "input", true);
    t.alloc(0x20000, 2048 + 64 * (s % 5));
    // The saved-tensor hook's tag, in the steps it runs in.
    if (s < hook_steps) t.tag(0x20000, Category::Activation, "activation saved in fc1", true);
    t.alloc(0x24000, 1536);  // untagged: made in forward, freed in backward (an activation)
    t.alloc(0x30000, 700).free(0x30000);  // a temporary
    if (s == kPeakStep) t.alloc(0x400000, kBig).tag(0x400000, Category::Activation, "big activation", true);
    if (s == kMarkStep) t.mark("eval");
    t.end("forward");
    at();
    t.begin("backward");
    t.alloc(0x60000, 1024).alloc(0x70000, 2048).alloc(0x80000, 4096);
    t.free(0x70000).free(0x20000).free(0x24000);
    if (s == kPeakStep) t.free(0x400000);
    t.tag(0x60000, Category::Gradient, "grad of fc2.weight").tag(0x80000, Category::Gradient, "grad of fc1.weight");
    t.end("backward");
    at();
    t.begin("optimizer_step");
    if (s == 0) {
      t.alloc(0x90000, 4096).alloc(0xB0000, 1024);
      t.tag(0x90000, Category::OptimizerState, "exp_avg of fc1.weight");
      t.tag(0xB0000, Category::OptimizerState, "exp_avg of fc2.weight");
    }
    t.alloc(0xE0000, 512).free(0xE0000);
    if (s == kOomStep) t.oom(1u << 30, 0);
    t.end("optimizer_step");
    t.free(0x10000);
    t.step(s);
  }
  t.close();
}

const StepStats* step_of(const Report& r, std::uint64_t step) {
  for (const StepStats& s : r.steps) if (s.step == step) return &s;
  return nullptr;
}

std::vector<std::uint64_t> kept_steps(const Report& r) {
  std::vector<std::uint64_t> out;
  for (const StepStats& s : r.steps) out.push_back(s.step);
  return out;
}

}  // namespace

SCENARIO("a full trace compacted to keep 3 steps keeps every summary and the steps that matter",
         "[core][flight]") {
  GIVEN("a 60-step run with its highest peak in step 7, an OOM in step 31 and a mark in step 44") {
    TempPath full_path, bounded_path;
    {
      TraceBuilder t(full_path.str());
      write_run(t);
    }
    FlightOptions options;
    options.keep_steps = 3;
    options.rewrite_bytes = 2048;  // rewritten many times along the way
    const CompactResult result = compact_trace(full_path.str(), bounded_path.str(), options);
    const Report full = analyze_trace(full_path.str());
    const Report bounded = analyze_trace(bounded_path.str());

    THEN("every step has its summary, and they are those the full trace's events give") {
      CHECK(result.steps == kSteps);
      CHECK(bounded.glance.recorded);
      CHECK_FALSE(full.glance.recorded);
      REQUIRE(bounded.glance.steps.size() == kSteps);
      REQUIRE(full.glance.steps.size() == kSteps);
      CHECK(report_to_json(bounded).find(R"("keep_steps":3)") != std::string::npos);
      // The summaries, row for row (the JSON of the section after its header).
      const std::string a = report_to_json(full), b = report_to_json(bounded);
      const auto rows = [](const std::string& j) { return j.substr(j.find("\"columns\""), j.find("\"growing_categories\"") - j.find("\"columns\"")); };
      CHECK(rows(a) == rows(b));
    }
    THEN("the summary of the peak step is exact") {
      const GlanceStep& s = bounded.glance.steps[kPeakStep];
      const std::uint64_t params = 4096 + 1024, state = 4096 + 1024, grads = 1024 + 4096;
      const std::uint64_t activations = (2048 + 64 * (kPeakStep % 5)) + 1536 + kBig;
      // At the peak, in backward once the gradients and the grad of h1 are made and before the
      // activations are freed: parameters, optimizer state, input, the saved, the inferred and
      // the big activation, the gradients (their last step's were freed by zero_grad) and a
      // temporary (made and freed in backward).
      CHECK(bounded.glance.max_peak_step == kPeakStep);
      CHECK(s.peak_bytes == full.peak.bytes);
      CHECK(s.peak_by_category[category_index(Category::Parameter)] == params);
      CHECK(s.peak_by_category[category_index(Category::OptimizerState)] == state);
      CHECK(s.peak_by_category[category_index(Category::Input)] == 512);
      CHECK(s.peak_by_category[category_index(Category::Activation)] == activations);
      CHECK(s.peak_by_category[category_index(Category::Gradient)] == grads);
      CHECK(s.peak_by_category[category_index(Category::Temporary)] == 2048);
      CHECK(s.peak_bytes == params + state + 512 + activations + grads + 2048);
      CHECK(s.ooms == 0);
      CHECK(bounded.glance.steps[kOomStep].ooms == 1);
      CHECK(bounded.glance.steps[kMarkStep].marks == 1);
      CHECK(bounded.glance.steps[kMarkStep].mark == "eval");
    }
    THEN("the events kept are those of the peak step and the one before, the steps around the OOM "
         "and the mark, and the last three") {
      CHECK(kept_steps(bounded) == std::vector<std::uint64_t>{6, 7, 30, 31, 32, 43, 44, 45, 57, 58, 59});
      REQUIRE(bounded.glance.windows.size() == 4);
      CHECK(bounded.glance.windows[0].reasons == std::vector<std::string>{"highest_peak"});
      CHECK(bounded.glance.windows[1].reasons == std::vector<std::string>{"oom"});
      CHECK(bounded.glance.windows[2].reasons == std::vector<std::string>{"mark"});
      CHECK(bounded.glance.windows[3].reasons == std::vector<std::string>{"last_steps"});
      CHECK(bounded.timeline.gaps.size() == 3);
      CHECK(bounded_path.str() != full_path.str());
      CHECK(result.out_bytes < result.in_bytes);
    }
    THEN("the peak, its composition, its blocks and its sites are the full trace's") {
      CHECK(bounded.peak.bytes == full.peak.bytes);
      CHECK(bounded.peak.step == full.peak.step);
      CHECK(bounded.peak.phase == full.peak.phase);
      CHECK(bounded.peak.by_category == full.peak.by_category);
      CHECK(bounded.peak.inferred_by_category == full.peak.inferred_by_category);
      REQUIRE(bounded.peak.top_blocks.size() == full.peak.top_blocks.size());
      for (std::size_t i = 0; i < full.peak.top_blocks.size(); ++i) {
        CHECK(bounded.peak.top_blocks[i].label == full.peak.top_blocks[i].label);
        CHECK(bounded.peak.top_blocks[i].bytes == full.peak.top_blocks[i].bytes);
        CHECK(bounded.peak.top_blocks[i].category == full.peak.top_blocks[i].category);
        CHECK(bounded.peak.top_blocks[i].step_allocated == full.peak.top_blocks[i].step_allocated);
        CHECK(bounded.peak.top_blocks[i].phase_allocated == full.peak.top_blocks[i].phase_allocated);
      }
      REQUIRE(bounded.peak.by_label.size() == full.peak.by_label.size());
      for (std::size_t i = 0; i < full.peak.by_label.size(); ++i) {
        CHECK(bounded.peak.by_label[i].label == full.peak.by_label[i].label);
        CHECK(bounded.peak.by_label[i].bytes == full.peak.by_label[i].bytes);
      }
    }
    THEN("each kept step's statistics, phase by phase, are the full trace's") {
      for (std::uint64_t step : kept_steps(bounded)) {
        const StepStats* a = step_of(full, step);
        const StepStats* b = step_of(bounded, step);
        REQUIRE(a != nullptr);
        REQUIRE(b != nullptr);
        CHECK(b->start_bytes == a->start_bytes);
        CHECK(b->peak_bytes == a->peak_bytes);
        CHECK(b->end_bytes == a->end_bytes);
        CHECK(b->peak_by_category == a->peak_by_category);
        CHECK(b->end_by_category == a->end_by_category);
        REQUIRE(b->phases.size() == a->phases.size());
        for (std::size_t i = 0; i < a->phases.size(); ++i) {
          CHECK(b->phases[i].phase == a->phases[i].phase);
          CHECK(b->phases[i].peak_bytes == a->phases[i].peak_bytes);
          CHECK(b->phases[i].peak_by_category == a->phases[i].peak_by_category);
        }
      }
    }
  }
}

SCENARIO("a run with keep_steps 0 is a full trace with a summary of every step", "[core][flight]") {
  GIVEN("the same run compacted with keep_steps 0") {
    TempPath full_path, all_path;
    {
      TraceBuilder t(full_path.str());
      write_run(t);
    }
    compact_trace(full_path.str(), all_path.str(), FlightOptions{});
    const Report full = analyze_trace(full_path.str());
    const Report all = analyze_trace(all_path.str());
    THEN("it keeps every step's events and its report is the full trace's, with recorded summaries") {
      CHECK(all.steps.size() == full.steps.size());
      CHECK(all.glance.recorded);
      CHECK(all.glance.windows.size() == 1);
      CHECK(all.glance.windows[0].reasons == std::vector<std::string>{"all"});
      CHECK(all.peak.bytes == full.peak.bytes);
      CHECK(all.timeline.gaps.empty());
      CHECK(all.allocations == full.allocations);
    }
  }
}

SCENARIO("a block live past the end of a kept window gets the category its later life decides",
         "[core][flight]") {
  GIVEN("a run whose peak step makes an untagged block in forward that a backward two steps later frees") {
    TempPath full_path, bounded_path;
    {
      TraceBuilder t(full_path.str());
      std::uint64_t now = 1000;
      t.at(now).alloc(0x1000, 4096).tag(0x1000, Category::Parameter, "w");
      for (std::uint64_t s = 0; s < 30; ++s) {
        t.at(now += 100).begin("forward");
        t.alloc(0x20000, 1024).tag(0x20000, Category::Activation, "saved", true);
        if (s == 5) t.alloc(0x500000, 1u << 20);  // kept by the user's code for two steps
        t.end("forward");
        t.at(now += 100).begin("backward").free(0x20000);
        if (s == 7) t.free(0x500000);  // ... and freed in a later backward: an activation
        t.end("backward").step(s);
      }
      t.close();
    }
    FlightOptions options;
    options.keep_steps = 2;
    options.rewrite_bytes = 1024;
    compact_trace(full_path.str(), bounded_path.str(), options);
    const Report full = analyze_trace(full_path.str());
    const Report bounded = analyze_trace(bounded_path.str());
    THEN("the peak of step 5 is kept, and the block counts as an activation there as in the full trace") {
      CHECK(full.peak.step == 5);
      CHECK(full.peak.by_category[category_index(Category::Activation)] == 1024 + (1u << 20));
      CHECK(kept_steps(bounded) == std::vector<std::uint64_t>{4, 5, 28, 29});
      CHECK(bounded.peak.by_category == full.peak.by_category);
      CHECK(bounded.peak.inferred_by_category == full.peak.inferred_by_category);
    }
  }
}

namespace {

const ExternalGroup* group_of(const Report& r, const std::string& library) {
  if (!r.device_ledger) return nullptr;
  for (const ExternalGroup& g : r.device_ledger->groups) if (g.library == library) return &g;
  return nullptr;
}

}  // namespace

SCENARIO("a kept window's device ledger holds the allocations outside PyTorch that dropped steps made",
         "[core][flight][device_ledger]") {
  GIVEN("a CUDA run where NCCL takes 4 GiB at step 0, and a library 64 MiB at step 5 that it frees at step 10") {
    constexpr std::uint64_t MiB = 1024 * 1024;
    constexpr auto kMemCreate = static_cast<std::uint8_t>(ExternalApi::MemCreate);
    constexpr auto kMalloc = static_cast<std::uint8_t>(ExternalApi::Malloc);
    TempPath full_path, bounded_path;
    {
      TraceBuilder t(full_path.str(), Device{DeviceType::CUDA, 0});
      t.metadata("cupti_source", R"({"available": true, "reason": ""})");
      std::uint64_t now = 1000;
      t.at(now).segment(0x10000000000, 64 * MiB).alloc(0x10000000000, 4 * MiB).tag(0x10000000000, Category::Parameter, "w");
      for (std::uint64_t s = 0; s < 30; ++s) {
        t.at(now += 100).begin("forward");
        if (s == 0) t.external_alloc(0x20000000000, 4096 * MiB, "libnccl.so.2", kMemCreate);
        if (s == 5) t.external_alloc(0x30000000000, 64 * MiB, "libcublasLt.so.13", kMalloc);
        if (s == 10) t.external_free(0x30000000000, 64 * MiB, kMalloc);
        t.alloc(0x10000400000, s == 5 ? 32 * MiB : 1 * MiB).tag(0x10000400000, Category::Activation, "saved", true);
        t.end("forward");
        t.at(now += 100).begin("backward").free(0x10000400000).end("backward").step(s);
      }
      t.close();
    }
    FlightOptions options;
    options.keep_steps = 2;
    options.rewrite_bytes = 1024;
    compact_trace(full_path.str(), bounded_path.str(), options);
    const Report full = analyze_trace(full_path.str());
    const Report bounded = analyze_trace(bounded_path.str());
    REQUIRE(full.peak.step == 5);
    REQUIRE(kept_steps(bounded) == std::vector<std::uint64_t>{4, 5, 28, 29});
    REQUIRE(full.device_ledger);
    REQUIRE(bounded.device_ledger);

    THEN("NCCL's 4 GiB, allocated in a dropped step, is live at the peak and at the end, as in the full trace") {
      const ExternalGroup* f = group_of(full, "libnccl.so.2");
      const ExternalGroup* b = group_of(bounded, "libnccl.so.2");
      REQUIRE(f != nullptr);
      REQUIRE(b != nullptr);
      CHECK(f->bytes_at_peak == 4096 * MiB);
      CHECK(b->bytes_at_peak == 4096 * MiB);
      CHECK(b->end_bytes == 4096 * MiB);
      CHECK(b->allocations == 1);
    }
    THEN("the 64 MiB freed in a dropped step is live at the peak and no longer live at the end") {
      const ExternalGroup* f = group_of(full, "libcublasLt.so.13");
      const ExternalGroup* b = group_of(bounded, "libcublasLt.so.13");
      REQUIRE(f != nullptr);
      REQUIRE(b != nullptr);
      CHECK(f->bytes_at_peak == 64 * MiB);
      CHECK(b->bytes_at_peak == 64 * MiB);
      CHECK(f->end_bytes == 0);
      CHECK(b->end_bytes == 0);
      CHECK(b->allocations == 1);
    }
  }
}

SCENARIO("a bounded trace keeps the steps the saved-tensor hook ran in, so that its later steps "
         "name the savers the full trace names", "[core][flight]") {
  GIVEN("the 60-step run with the hook in its first 5 steps only (one of each size of the saved "
        "activation), compacted to keep 3 steps with and without keeping those 5") {
    TempPath full_path, kept_path, lost_path;
    {
      TraceBuilder t(full_path.str());
      write_run(t, /*hook_steps=*/5);
    }
    FlightOptions options;
    options.keep_steps = 3;
    options.rewrite_bytes = 2048;
    options.keep_first_steps = 5;
    compact_trace(full_path.str(), kept_path.str(), options);
    options.keep_first_steps = 0;
    compact_trace(full_path.str(), lost_path.str(), options);
    const Report full = analyze_trace(full_path.str());
    const Report kept = analyze_trace(kept_path.str());
    const Report lost = analyze_trace(lost_path.str());
    THEN("in the full trace the peak step's untagged activation carries the saver learned in the "
         "hook's steps") {
      REQUIRE(full.peak.step == kPeakStep);
      CHECK(peak_label_bytes(full, "activation saved in fc1") == 2048 + 64 * (kPeakStep % 5));
      // The learned saver is the hook's word: only the untagged one inferred from its lifetime.
      CHECK(full.peak.inferred_by_category[category_index(Category::Activation)] == 1536);
    }
    THEN("the bounded trace that keeps them holds steps 0-4 for that reason, and its peak's labels "
         "are the full trace's") {
      const std::vector<std::uint64_t> steps = kept_steps(kept);
      REQUIRE(steps.size() >= 5);
      CHECK(std::vector<std::uint64_t>(steps.begin(), steps.begin() + 5) == std::vector<std::uint64_t>{0, 1, 2, 3, 4});
      REQUIRE_FALSE(kept.glance.windows.empty());
      CHECK(kept.glance.windows[0].first_step == 0);
      CHECK(kept.glance.windows[0].reasons == std::vector<std::string>{"first_steps"});
      REQUIRE(kept.peak.by_label.size() == full.peak.by_label.size());
      for (std::size_t i = 0; i < full.peak.by_label.size(); ++i) {
        CHECK(kept.peak.by_label[i].label == full.peak.by_label[i].label);
        CHECK(kept.peak.by_label[i].bytes == full.peak.by_label[i].bytes);
      }
    }
    THEN("one that dropped them has the same bytes but not the learned saver") {
      CHECK(lost.peak.bytes == full.peak.bytes);
      CHECK(lost.peak.by_category == full.peak.by_category);
      CHECK(peak_label_bytes(lost, "activation saved in fc1") == 0);
    }
  }
}
