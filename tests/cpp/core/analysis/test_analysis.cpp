// Specification of analyze_trace(): categories with hindsight, the peak, per-phase statistics.
#include <string>

#include "catch.h"
#include "ridgescope/analysis.h"
#include "report_queries.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::testing::peak_label_bytes;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {
std::uint64_t cat(const CategoryBytes& bytes, Category c) { return bytes[category_index(c)]; }

const PhaseStats& find_phase(const Report& r, std::uint64_t step, const std::string& name,
                             std::uint32_t index = 0) {
  for (const auto& s : r.steps)
    if (s.step == step)
      for (const auto& p : s.phases)
        if (p.phase == name && p.index == index) return p;
  FAIL("no phase " << name << " #" << index << " in step " << step);
  throw 0;
}

// Two FP32 parameters: fc1.weight (4096 B) and fc2.weight (1024 B).
constexpr std::uint64_t kW1 = 4096, kW2 = 1024, kParams = kW1 + kW2;

void write_model(TraceBuilder& t) {
  t.alloc(0x1000, kW1).tag(0x1000, Category::Parameter, "fc1.weight");
  t.alloc(0x3000, kW2).tag(0x3000, Category::Parameter, "fc2.weight");
}
}  // namespace

SCENARIO("a forward, a backward and a first optimizer step that adds two FP32 moments",
         "[core][analysis]") {
  GIVEN("the trace of one training step of a two-layer model with Adam") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      write_model(t);
      t.alloc(0x10000, 512);  // the batch, made by the data pipeline
      t.begin("forward").tag(0x10000, Category::Input, "input", true);
      t.alloc(0x20000, 2048).tag(0x20000, Category::Activation, "activation saved in fc1", true);
      t.alloc(0x30000, 700).free(0x30000);  // a temporary inside forward
      t.alloc(0x40000, 256).tag(0x40000, Category::Activation, "activation saved in fc2", true);
      t.end("forward").sample(kParams + 512 + 2048 + 256);
      t.begin("backward");
      t.alloc(0x50000, 256);  // grad of the output
      t.alloc(0x60000, kW2).tag(0x60000, Category::Gradient, "grad of fc2.weight");
      t.free(0x40000);
      t.alloc(0x70000, 2048);  // grad of h1
      t.alloc(0x80000, kW1).tag(0x80000, Category::Gradient, "grad of fc1.weight");
      t.free(0x70000).free(0x50000).free(0x20000);
      t.end("backward").sample(kParams + 512 + kParams);
      t.begin("optimizer_step");
      t.alloc(0x90000, kW1).alloc(0xA0000, kW1).alloc(0xB0000, kW2).alloc(0xC0000, kW2);
      t.alloc(0xD0000, 4).alloc(0xD0100, 4);
      t.alloc(0xE0000, 512).free(0xE0000);
      t.tag(0x90000, Category::OptimizerState, "exp_avg of fc1.weight");
      t.tag(0xA0000, Category::OptimizerState, "exp_avg_sq of fc1.weight");
      t.tag(0xB0000, Category::OptimizerState, "exp_avg of fc2.weight");
      t.tag(0xC0000, Category::OptimizerState, "exp_avg_sq of fc2.weight");
      t.tag(0xD0000, Category::OptimizerState, "step of fc1.weight");
      t.tag(0xD0100, Category::OptimizerState, "step of fc2.weight");
      t.end("optimizer_step").step(0);
    }
    WHEN("it is analysed") {
      const Report r = analyze_trace(path.str());
      THEN("the forward ends holding parameters, the input and the saved activations") {
        const auto& fwd = find_phase(r, 0, "forward");
        CHECK(fwd.start_bytes == kParams + 512);
        CHECK(fwd.end_bytes == kParams + 512 + 2048 + 256);
        CHECK(fwd.peak_bytes == kParams + 512 + 2048 + 700);
        CHECK(cat(fwd.end_by_category, Category::Activation) == 2048 + 256);
        CHECK(cat(fwd.end_by_category, Category::Input) == 512);
        CHECK(cat(fwd.end_by_category, Category::Parameter) == kParams);
      }
      THEN("the backward peaks while gradients and activations coexist, and ends with gradients") {
        const auto& bwd = find_phase(r, 0, "backward");
        CHECK(bwd.peak_bytes == kParams + 512 + 2048 + 256 + 256 + kW2 - 256 + 2048 + kW1);
        CHECK(cat(bwd.peak_by_category, Category::Gradient) == kParams);
        CHECK(cat(bwd.peak_by_category, Category::Activation) == 2048);
        CHECK(cat(bwd.peak_by_category, Category::Temporary) == 256 + 2048);
        CHECK(bwd.end_bytes == kParams + 512 + kParams);
        CHECK(cat(bwd.end_by_category, Category::Gradient) == kParams);
        CHECK(cat(bwd.end_by_category, Category::Activation) == 0);
      }
      THEN("the global peak is in the first optimizer step with the new moments") {
        CHECK(r.peak.step == 0);
        CHECK(r.peak.phase == "optimizer_step");
        CHECK(r.peak.bytes == kParams + 512 + kParams + 2 * kParams + 8 + 512);
        CHECK(cat(r.peak.by_category, Category::Parameter) == kParams);
        CHECK(cat(r.peak.by_category, Category::Gradient) == kParams);
        CHECK(cat(r.peak.by_category, Category::OptimizerState) == 2 * kParams + 8);
        CHECK(cat(r.peak.by_category, Category::Temporary) == 512);
        CHECK(cat(r.peak.by_category, Category::Unknown) == 0);
      }
      THEN("the largest blocks at the peak carry their labels and the phase that made them") {
        REQUIRE(r.peak.top_blocks.size() >= 3);
        CHECK(r.peak.top_blocks[0].bytes == kW1);
        CHECK(r.peak.top_blocks[0].label == "fc1.weight");
        CHECK(r.peak.top_blocks[0].phase_allocated == "idle");
        bool saw_moment = false;
        for (const auto& b : r.peak.top_blocks) {
          if (b.label == "exp_avg of fc1.weight") {
            saw_moment = true;
            CHECK(b.category == Category::OptimizerState);
            CHECK(b.phase_allocated == "optimizer_step");
          }
          if (b.bytes == 512 && b.category == Category::Temporary) {
            CHECK(b.label == "temporary allocated in optimizer_step");
            CHECK(b.inferred);
          }
        }
        CHECK(saw_moment);
      }
      THEN("a warning names the lazily created optimizer state and its exact size") {
        REQUIRE(r.warnings.size() == 1);
        CHECK(r.warnings[0].kind == "lazy_optimizer_state");
        CHECK(r.warnings[0].bytes == 2 * kParams + 8);
        CHECK(r.warnings[0].step == 0);
      }
      THEN("the allocator readings at the phase boundaries agree with the ledger") {
        CHECK(r.consistency.samples == 2);
        CHECK(r.consistency.mismatches == 0);
      }
      THEN("the one step is complete") {
        REQUIRE(r.steps.size() == 1);
        CHECK(r.steps[0].complete);
        CHECK(r.steps[0].end_bytes == kParams + 512 + kParams + 2 * kParams + 8);
      }
    }
  }
}

SCENARIO("gradient accumulation over four micro-batches does not grow the activation peak",
         "[core][analysis]") {
  GIVEN("one optimizer step after four forward/backward micro-batches") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      write_model(t);
      for (int micro = 0; micro < 4; ++micro) {
        t.begin("forward");
        t.alloc(0x20000, 3000).tag(0x20000, Category::Activation, "activation saved in fc1", true);
        t.end("forward");
        t.begin("backward");
        if (micro == 0) {
          t.alloc(0x60000, kW2).tag(0x60000, Category::Gradient, "grad of fc2.weight");
          t.alloc(0x80000, kW1).tag(0x80000, Category::Gradient, "grad of fc1.weight");
        } else {
          t.alloc(0x70000, kW1).free(0x70000);  // the new gradient, added in place
        }
        t.free(0x20000);
        t.end("backward");
      }
      t.begin("optimizer_step").end("optimizer_step").step(0);
    }
    const Report r = analyze_trace(path.str());
    THEN("each micro-batch's forward peaks at the same activation bytes") {
      for (std::uint32_t micro = 0; micro < 4; ++micro) {
        const auto& fwd = find_phase(r, 0, "forward", micro);
        CHECK(cat(fwd.peak_by_category, Category::Activation) == 3000);
      }
    }
    THEN("gradients stay at one copy of the parameters") {
      for (std::uint32_t micro = 0; micro < 4; ++micro) {
        CHECK(cat(find_phase(r, 0, "backward", micro).end_by_category, Category::Gradient) == kParams);
      }
    }
    THEN("the step's peak holds one micro-batch of activations, not four") {
      REQUIRE(r.steps.size() == 1);
      CHECK(cat(r.steps[0].peak_by_category, Category::Activation) == 3000);
      // parameters, gradients, one micro-batch's activations and one new gradient being added
      CHECK(r.peak.bytes == kParams + kParams + 3000 + kW1);
    }
  }
}

SCENARIO("untagged blocks get categories from their lifetimes", "[core][analysis]") {
  GIVEN("a step where nothing but parameters is tagged, as in a C++ trainer") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      write_model(t);
      t.alloc(0x5000, 64);  // made before any phase, never freed: unknown
      t.begin("forward").alloc(0x20000, 2000).alloc(0x21000, 100).free(0x21000).end("forward");
      t.begin("backward").alloc(0x60000, kW2).free(0x20000).end("backward");
      t.begin("optimizer_step").alloc(0x90000, 2 * kW2).end("optimizer_step").step(0);
      t.begin("zero_grad").free(0x60000).end("zero_grad");
    }
    const Report r = analyze_trace(path.str());
    const auto& bwd = find_phase(r, 0, "backward");
    THEN("forward blocks freed in backward are activations, forward-only blocks temporaries") {
      CHECK(cat(find_phase(r, 0, "forward").peak_by_category, Category::Activation) == 2000);
      CHECK(cat(find_phase(r, 0, "forward").peak_by_category, Category::Temporary) == 100);
    }
    THEN("a backward block that outlives backward is a gradient") {
      CHECK(cat(bwd.end_by_category, Category::Gradient) == kW2);
    }
    THEN("an optimizer block that outlives the step is optimizer state") {
      CHECK(cat(find_phase(r, 0, "optimizer_step").end_by_category, Category::OptimizerState) == 2 * kW2);
    }
    THEN("what no rule explains stays unknown and is not called inferred") {
      CHECK(cat(r.peak.by_category, Category::Unknown) == 64);
      CHECK(cat(r.peak.inferred_by_category, Category::Unknown) == 0);
      CHECK(cat(r.peak.inferred_by_category, Category::OptimizerState) == 2 * kW2);
    }
  }
}

SCENARIO("a block made in a nested backward and freed before the outer one ends is a temporary",
         "[core][analysis]") {
  GIVEN("a reentrant checkpoint's backward: a backward inside the backward makes a weight's gradient "
        "(kept) and its input's gradient, which the outer backward consumes and frees") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      write_model(t);
      t.begin("forward").alloc(0x20000, 2000).end("forward");
      t.begin("backward").begin("recompute").alloc(0x30000, 2000).end("recompute");
      t.begin("backward").alloc(0x60000, kW2).alloc(0x70000, 512).free(0x30000).end("backward");
      t.free(0x70000).free(0x20000).end("backward");
      t.begin("optimizer_step").end("optimizer_step").step(0);
    }
    const Report r = analyze_trace(path.str());
    THEN("the input's gradient is a temporary of the backward, the kept one a gradient") {
      CHECK(cat(find_phase(r, 0, "backward").end_by_category, Category::Gradient) == kW2);
      CHECK(cat(find_phase(r, 0, "backward").peak_by_category, Category::Temporary) == 512);
      CHECK(cat(find_phase(r, 0, "backward").peak_by_category, Category::Gradient) == kW2);
    }
  }
}

SCENARIO("a tensor saved for backward that predates the forward is an input", "[core][analysis]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.alloc(0x100, 800);  // targets, made by the data pipeline
    t.begin("forward").alloc(0x200, 400).end("forward");
    // the loss, outside the model, saves both the targets and a fresh tensor
    t.alloc(0x300, 100).tag(0x100, Category::Activation, "", true).tag(0x300, Category::Activation, "", true);
    t.begin("backward").free(0x300).free(0x200).end("backward");
  }
  const Report r = analyze_trace(path.str());
  CHECK(cat(r.peak.by_category, Category::Input) == 800);
  CHECK(cat(r.peak.by_category, Category::Activation) == 400 + 100);
}

SCENARIO("explicit phases nest inside a step and keep their own statistics", "[core][analysis]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    write_model(t);
    t.begin("train_step");
    t.begin("forward").alloc(0x20000, 100).end("forward");
    t.begin("checkpoint").alloc(0x30000, kParams).free(0x30000).end("checkpoint");
    t.end("train_step").step(0);
  }
  const Report r = analyze_trace(path.str());
  const auto& outer = find_phase(r, 0, "train_step");
  const auto& ckpt = find_phase(r, 0, "checkpoint");
  CHECK(outer.depth == 0);
  CHECK(ckpt.depth == 1);
  CHECK(ckpt.parent == "train_step");
  CHECK(ckpt.peak_bytes == kParams + 100 + kParams);
  CHECK(ckpt.allocated_bytes == kParams);
  CHECK(ckpt.freed_bytes == kParams);
  CHECK(outer.peak_bytes == ckpt.peak_bytes);
  CHECK(r.peak.phase == "checkpoint");
  CHECK(r.peak.phase_stack == std::vector<std::string>{"train_step", "checkpoint"});
}

SCENARIO("a disagreement between allocator and ledger is reported", "[core][analysis]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.alloc(0x100, 64).sample(64).sample(100);
  }
  const Report r = analyze_trace(path.str());
  CHECK(r.consistency.samples == 2);
  CHECK(r.consistency.mismatches == 1);
  CHECK(r.consistency.first_difference_bytes == -36);
  bool warned = false;
  for (const auto& w : r.warnings) warned |= w.kind == "ledger_mismatch";
  CHECK(warned);
}

SCENARIO("an OOM event records what was live at that instant", "[core][analysis]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    write_model(t);
    t.begin("forward").alloc(0x20000, 1000).oom(1 << 20, 12345).end("forward");
  }
  const Report r = analyze_trace(path.str());
  REQUIRE(r.ooms.size() == 1);
  CHECK(r.ooms[0].request_bytes == (1 << 20));
  CHECK(r.ooms[0].device_free_bytes == 12345);
  CHECK(r.ooms[0].phase == "forward");
  CHECK(r.ooms[0].live_bytes == kParams + 1000);
  CHECK(cat(r.ooms[0].by_category, Category::Parameter) == kParams);
}

SCENARIO("the device with the highest peak is reported unless one is asked for", "[core][analysis]") {
  TempPath path;
  {
    ridgescope::Recorder rec(path.str());
    auto alloc = [&](Device d, std::uint64_t addr, std::uint64_t bytes) {
      Event e;
      e.kind = EventKind::Alloc;
      e.device = d;
      e.addr = addr;
      e.bytes = bytes;
      rec.record(e);
    };
    alloc(Device{DeviceType::CPU, -1}, 0x100, 100);
    alloc(Device{DeviceType::CUDA, 0}, 0x100, 5000);
  }
  CHECK(analyze_trace(path.str()).device == Device{DeviceType::CUDA, 0});
  CHECK(analyze_trace(path.str()).peak.bytes == 5000);
  AnalysisOptions cpu;
  cpu.device = Device{DeviceType::CPU, -1};
  CHECK(analyze_trace(path.str(), cpu).peak.bytes == 100);
  CHECK(analyze_trace(path.str()).devices_seen.size() == 2);
}

SCENARIO("records without a time of their own never move the clock back", "[core][analysis]") {
  GIVEN("a trace whose last record is metadata, with a phase left open") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.begin("forward").alloc(0x100, 10);
      t.metadata("run", "{}");
    }
    const Report r = analyze_trace(path.str());
    THEN("the duration and the open phase's end are the last timed instant") {
      CHECK(r.trace.duration_ns > 0);
      const auto& fwd = r.steps.at(0).phases.at(0);
      CHECK_FALSE(fwd.complete);
      CHECK(fwd.end_time_ns >= fwd.begin_time_ns);
    }
  }
}

SCENARIO("a step's start excludes the allocation that opens it", "[core][analysis]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.alloc(0x100, 100).step(0).alloc(0x200, 50).step(1);
  }
  const Report r = analyze_trace(path.str());
  REQUIRE(r.steps.size() == 2);
  CHECK(r.steps[0].start_bytes == 0);
  CHECK(r.steps[0].end_bytes == 100);
  CHECK(r.steps[1].start_bytes == 100);
  CHECK(r.steps[1].peak_bytes == 150);
}

SCENARIO("metadata recorded twice under one key keeps the last value", "[core][analysis]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.metadata("run", "{\"v\":1}").metadata("other", "{}").metadata("run", "{\"v\":2}");
  }
  const Report r = analyze_trace(path.str());
  REQUIRE(r.metadata.size() == 2);
  CHECK(r.metadata[0].first == "run");
  CHECK(r.metadata[0].second == "{\"v\":2}");
}

SCENARIO("tags for addresses that are not live are counted", "[core][analysis]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.tag(0xdead, Category::Gradient, "grad of nothing").tag(0xbeef, Category::Activation, "", true);
  }
  CHECK(analyze_trace(path.str()).anomalies.unknown_tags == 2);
}

SCENARIO("unlabelled blocks at the peak are grouped by the phase that made them", "[core][analysis]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.alloc(0x100, 10);  // idle, never freed: unknown
    t.begin("forward").alloc(0x200, 20).end("forward");
    t.begin("eval").alloc(0x300, 30).end("eval");
  }
  const Report r = analyze_trace(path.str());
  std::vector<std::pair<std::string, std::uint64_t>> got;
  for (const auto& l : r.peak.by_label) got.emplace_back(l.label, l.bytes);
  CHECK(got == std::vector<std::pair<std::string, std::uint64_t>>{
                   {"unknown allocated in eval", 30}, {"unknown allocated in forward", 20},
                   {"unknown allocated in idle", 10}});
}

SCENARIO("the loss computed between forward and backward is an inferred activation", "[core][analysis]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.begin("forward").alloc(0x100, 400).end("forward");
    t.alloc(0x200, 100);  // log-softmax output of the loss, outside every phase
    t.alloc(0x300, 4);    // the loss itself, kept by the user past backward
    t.begin("backward").free(0x200).free(0x100).end("backward");
  }
  const Report r = analyze_trace(path.str());
  CHECK(cat(r.peak.by_category, Category::Activation) == 500);
  CHECK(cat(r.peak.by_category, Category::Unknown) == 4);
}

SCENARIO("a block made before forward and freed by backward is an inferred input", "[core][analysis]") {
  GIVEN("a step whose targets are made with the batch, outside every phase, before forward") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      for (int step = 0; step < 2; ++step) {
        const std::uint64_t base = 0x1000 * static_cast<std::uint64_t>(step + 1);
        t.alloc(base + 0x100, 24);  // the targets: saved by the loss, not an argument of the model
        t.begin("forward").alloc(base + 0x200, 400).end("forward");
        t.alloc(base + 0x300, 100);  // the loss's log-softmax, after forward, outside every phase
        t.begin("backward").free(base + 0x300).free(base + 0x200).free(base + 0x100).end("backward");
        t.step(static_cast<std::uint64_t>(step));
      }
    }
    const Report r = analyze_trace(path.str());
    THEN("in every step the targets are an inferred input, what forward and the loss made activations") {
      for (std::size_t step = 0; step < 2; ++step) {
        const auto& fwd = find_phase(r, step, "forward");
        CHECK(cat(fwd.end_by_category, Category::Input) == 24);
        CHECK(cat(fwd.end_by_category, Category::Activation) == 400);
      }
      CHECK(cat(r.peak.by_category, Category::Input) == 24);
      CHECK(cat(r.peak.by_category, Category::Activation) == 500);
      CHECK(cat(r.peak.inferred_by_category, Category::Input) == 24);
      CHECK(cat(r.peak.by_category, Category::Unknown) == 0);
    }
  }
}

SCENARIO("a block made while torch.compile compiles and kept after it is a buffer",
         "[core][analysis]") {
  GIVEN("a first forward that compiles: a lifted constant kept, a scratch block freed") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.begin("forward").begin("compile");
      t.alloc(0x100, 8);                    // Inductor's constant: lives with the compiled code
      t.alloc(0x200, 4096).free(0x200);     // autotuning scratch, freed inside the compilation
      t.alloc(0x300, 64);                   // made in compile, saved for backward
      t.end("compile").alloc(0x400, 512);   // an activation of the compiled graph
      t.end("forward");
      t.begin("backward").free(0x400).free(0x300).end("backward");
    }
    const Report r = analyze_trace(path.str());
    const auto& fwd = find_phase(r, 0, "forward");
    THEN("the kept block is an inferred buffer; the freed ones keep their lifetime categories") {
      CHECK(cat(fwd.end_by_category, Category::Buffer) == 8);
      CHECK(cat(fwd.end_by_category, Category::Activation) == 512 + 64);
      CHECK(cat(fwd.end_by_category, Category::Unknown) == 0);
      CHECK(cat(find_phase(r, 0, "compile").peak_by_category, Category::Temporary) == 4096);
      CHECK(cat(r.peak.inferred_by_category, Category::Buffer) == 8);
    }
  }
}

SCENARIO("an untagged block is labelled by the module that made it", "[core][analysis]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    Event e;
    e.kind = EventKind::Alloc;
    e.addr = 0x100;
    e.bytes = 64;
    e.string_id = t.recorder().intern("layers.0.attn");
    t.begin("forward");
    t.recorder().record(e);
    t.end("forward");
  }
  const Report r = analyze_trace(path.str());
  REQUIRE(r.peak.top_blocks.size() == 1);
  CHECK(r.peak.top_blocks[0].label == "unknown in layers.0.attn");
  CHECK(r.peak.top_blocks[0].module == "layers.0.attn");
  CHECK(r.peak.by_label.at(0).label == "unknown in layers.0.attn");
}

SCENARIO("an activation lifetimes find takes the saver the hook named for the same allocation of an earlier step",
         "[core][analysis]") {
  GIVEN("two steps in which the hook tags two same-sized blocks made in layers.0 with different "
        "savers, then a step without the hook: the first block again, the second one 4 bytes "
        "larger, and a third one no earlier step made") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      for (std::uint64_t step = 0; step < 2; ++step) {
        const std::uint64_t base = 0x10000 * (step + 1);
        t.begin("forward");
        t.alloc_in(base + 0x100, 400, "layers.0").tag(base + 0x100, Category::Activation, "activation saved in layers.1", true);
        t.alloc_in(base + 0x200, 400, "layers.0").tag(base + 0x200, Category::Activation, "activation saved in layers.0", true);
        t.end("forward");
        t.begin("backward").free(base + 0x200).free(base + 0x100).end("backward");
        t.step(step);
      }
      t.begin("forward");
      t.alloc_in(0x30100, 400, "layers.0");  // the first block's key: learned
      t.alloc_in(0x30200, 404, "layers.0");  // the second one's place, another size: not learned
      t.alloc_in(0x30300, 100, "layers.0");  // a third: no step made it before
      t.end("forward");
      t.begin("backward").free(0x30300).free(0x30200).free(0x30100).end("backward");
      t.step(2);
    }
    const Report r = analyze_trace(path.str());
    THEN("at the last step's peak every block is an activation; the one whose key an earlier step "
         "saw carries that step's saver (the hook's word, not inferred), the others are inferred "
         "and named after the module that made them") {
      REQUIRE(r.peak.step == 2);
      CHECK(r.peak.bytes == 904);
      CHECK(cat(r.peak.by_category, Category::Activation) == 904);
      CHECK(cat(r.peak.inferred_by_category, Category::Activation) == 504);
      CHECK(peak_label_bytes(r, "activation saved in layers.1") == 400);
      CHECK(peak_label_bytes(r, "activation saved in layers.0") == 0);
      CHECK(peak_label_bytes(r, "activation in layers.0") == 504);
    }
  }
  GIVEN("the same allocations made at two different sites") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      const std::uint32_t here = t.stack({t.python_frame("train.py", 10, "Block.forward")});
      const std::uint32_t there = t.stack({t.python_frame("train.py", 20, "Block.forward")});
      t.begin("forward").alloc(0x100, 400, here).tag(0x100, Category::Activation, "activation saved in a", true).end("forward");
      t.begin("backward").free(0x100).end("backward").step(0);
      t.begin("forward").alloc(0x200, 400, there).alloc(0x300, 4, there).end("forward");
      t.begin("backward").free(0x300).free(0x200).end("backward").step(1);
    }
    const Report r = analyze_trace(path.str());
    THEN("the later one learns nothing from the other site") {
      REQUIRE(r.peak.step == 1);
      CHECK(cat(r.peak.inferred_by_category, Category::Activation) == 404);
      CHECK(peak_label_bytes(r, "activation saved in a") == 0);
    }
  }
}
