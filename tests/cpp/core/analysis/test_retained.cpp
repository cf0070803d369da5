// Specification of the retained-tensor verdict (docs/sites.md, "Retained tensors"): bytes live at
// every step end that grow at every one of at least three steady-state steps, up to the last,
// are a tensor kept across steps, named by the line that made it and measured to the byte;
// state that grows once, a cache that plateaus and memory reused in place are not.
#include <functional>

#include "catch.h"
#include "ridgescope/analysis.h"
#include "trace_builder.h"

using namespace ridgescope;
using Catch::Matchers::Contains;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {

constexpr std::uint64_t KiB = 1024;

// `steps` training steps of a small model; `extra(t, step)` adds what the scenario keeps.
Report run(int steps, const std::function<void(TraceBuilder&, int)>& extra) {
  TempPath path;
  {
    TraceBuilder t(path.str());
    const auto model = t.python_frame("/home/me/model.py", 20, "MLP.forward");
    const auto opt = t.python_frame("/home/me/train.py", 14, "train");
    const auto node = t.frame(FrameKind::Autograd, "", 0, "MmBackward0", "fc1");
    t.alloc(0x1000, 4096, t.stack({opt})).tag(0x1000, Category::Parameter, "fc1.weight");
    for (int s = 0; s < steps; ++s) {
      t.begin("forward");
      t.alloc(0x2000, 8 * KiB, t.stack({model})).tag(0x2000, Category::Activation, "activation saved in fc1", true);
      t.end("forward").begin("backward");
      if (s == 0) t.alloc(0x3000, 4096, t.stack({node})).tag(0x3000, Category::Gradient, "grad of fc1.weight");
      t.free(0x2000);
      t.end("backward");
      extra(t, s);
      t.step(static_cast<std::uint64_t>(s));
    }
    t.close();
  }
  return analyze_trace(path.str());
}

const ReportWarning* warning(const Report& r, const std::string& kind) {
  for (const ReportWarning& w : r.warnings) {
    if (w.kind == kind) return &w;
  }
  return nullptr;
}

}  // namespace

SCENARIO("a tensor appended to a list every step is a retained tensor", "[core][analysis][retained]") {
  GIVEN("six steps, each keeping one more 256 KiB block made at train.py:10 in train") {
    const Report r = run(6, [](TraceBuilder& t, int s) {
      const auto line = t.python_frame("/home/me/train.py", 10, "train");
      t.alloc(0x100000 * (s + 1), 256 * KiB, t.stack({line}));
    });
    THEN("the verdict names the line, the growth per step to the byte, since step 1") {
      REQUIRE(r.retained.has_value());
      const RetainedGrowth& g = *r.retained;
      CHECK(g.since_step == 1);
      CHECK(g.last_step == 5);
      CHECK(g.growth_steps == 5);
      CHECK(g.growth_per_step_bytes == 256 * KiB);
      CHECK(g.growth_constant);
      CHECK(g.bytes == 6 * 256 * KiB);
      CHECK(g.blocks == 6);
      REQUIRE(g.sites.size() == 1);
      CHECK(g.sites[0].site == "train.py:10 in train");
      CHECK(g.sites[0].category == Category::Unknown);
      CHECK(g.sites[0].growth_per_step_bytes == 256 * KiB);
      REQUIRE(g.sites[0].frame >= 0);
      CHECK(r.frames[static_cast<std::size_t>(g.sites[0].frame)].line == 10);
      CHECK(g.latest == 0);
      CHECK(g.verdict.kind == "retained_tensors");
      CHECK(g.verdict.summary ==
            "256 KiB more is live at the end of every step since step 1 (6 blocks, 1.50 MiB now), allocated at "
            "train.py:10 in `train`, category unknown: a tensor kept across steps (for example appended to a list).");
    }
    THEN("the warning says it with the remedy") {
      const ReportWarning* w = warning(r, "retained_tensors");
      REQUIRE(w != nullptr);
      CHECK(w->bytes == 256 * KiB);
      CHECK(w->step == 1);
      CHECK_THAT(w->message, Contains("category unknown: a tensor kept across steps (for example appended to a "
                                      "list). Remedy: keep `.item()`/`.detach().cpu()` of it, or drop the reference."));
    }
  }
}

SCENARIO("a whole graph kept alive every step is named by the line that made its output", "[core][analysis][retained]") {
  GIVEN("five steps, each keeping an evaluation forward's saved activations at two model lines and "
        "its loss (made last, at eval.py:30)") {
    const Report r = run(5, [](TraceBuilder& t, int s) {
      const auto a = t.python_frame("/home/me/model.py", 21, "MLP.forward");
      const auto b = t.python_frame("/home/me/model.py", 22, "MLP.forward");
      const auto loss = t.python_frame("/home/me/eval.py", 30, "evaluate");
      const std::uint64_t base = 0x10000000ull * (s + 1);
      t.alloc(base, 96 * KiB, t.stack({a})).tag(base, Category::Activation, "activation saved in fc1", true);
      t.alloc(base + 0x100000, 32 * KiB, t.stack({b})).tag(base + 0x100000, Category::Activation, "activation saved in fc2", true);
      t.alloc(base + 0x200000, 4, t.stack({loss}));
    });
    THEN("the growth is the whole graph's bytes a step, mostly activations: the graph verdict") {
      REQUIRE(r.retained.has_value());
      const RetainedGrowth& g = *r.retained;
      CHECK(g.growth_per_step_bytes == 96 * KiB + 32 * KiB + 4);
      CHECK(g.growth_constant);
      CHECK(g.since_step == 1);
      CHECK(g.sites.size() == 3);
      CHECK(g.sites[0].site == "model.py:21 in MLP.forward");
      REQUIRE(g.latest >= 0);
      CHECK(g.sites[static_cast<std::size_t>(g.latest)].site == "eval.py:30 in evaluate");
      CHECK(g.verdict.dominant == Category::Activation);
      CHECK_THAT(g.verdict.summary, Contains("(15 blocks, 640 KiB now) at 3 sites, the latest allocated at eval.py:30 in "
                                             "`evaluate`, a step by category: activation 128 KiB, unknown 4 B:"));
      CHECK_THAT(g.verdict.summary, Contains("the autograd graph of a forward is kept across steps"));
      REQUIRE_FALSE(g.verdict.remedies.empty());
      CHECK_THAT(g.verdict.remedies[0].action, Contains("torch.no_grad()"));
    }
  }
}

SCENARIO("growth that is not a tensor kept across steps gives no verdict", "[core][analysis][retained]") {
  GIVEN("optimizer state created lazily in the first step only") {
    const Report r = run(6, [](TraceBuilder& t, int s) {
      const auto opt = t.python_frame("/home/me/train.py", 16, "train");
      t.begin("optimizer_step");
      if (s == 0) t.alloc(0x900000, 8192, t.stack({opt})).tag(0x900000, Category::OptimizerState, "exp_avg of fc1.weight");
      t.end("optimizer_step");
    });
    CHECK_FALSE(r.retained.has_value());
    CHECK(warning(r, "retained_tensors") == nullptr);
    CHECK(warning(r, "lazy_optimizer_state") != nullptr);
  }
  GIVEN("a cache that grows for three steps and then stays the same for three") {
    const Report r = run(6, [](TraceBuilder& t, int s) {
      const auto cache = t.python_frame("/home/me/cache.py", 5, "get");
      if (s < 3) t.alloc(0xA00000 + 0x100000 * s, 64 * KiB, t.stack({cache}));
    });
    CHECK_FALSE(r.retained.has_value());
  }
  GIVEN("gradients accumulated in place over the steps (made once, then reused)") {
    const Report r = run(6, [](TraceBuilder& t, int) {
      const auto node = t.frame(FrameKind::Autograd, "", 0, "AddBackward0", "fc1");
      t.begin("backward");
      t.alloc(0xB00000, 4096, t.stack({node})).free(0xB00000);  // the micro-batch's gradient, added in place
      t.end("backward");
    });
    CHECK_FALSE(r.retained.has_value());
  }
  GIVEN("growth at only the last two step ends") {
    const Report r = run(6, [](TraceBuilder& t, int s) {
      const auto line = t.python_frame("/home/me/train.py", 10, "train");
      if (s >= 4) t.alloc(0x100000 * (s + 1), 256 * KiB, t.stack({line}));
    });
    CHECK_FALSE(r.retained.has_value());
  }
  GIVEN("a list that keeps growing by 512 bytes a step (under 1 KiB)") {
    const Report r = run(8, [](TraceBuilder& t, int s) {
      const auto line = t.python_frame("/home/me/train.py", 11, "train");
      t.alloc(0x100000 * (s + 1), 512, t.stack({line}));
    });
    CHECK_FALSE(r.retained.has_value());
  }
}

SCENARIO("growth that varies from step to step is given as a range and an average", "[core][analysis][retained]") {
  const Report r = run(5, [](TraceBuilder& t, int s) {
    const auto line = t.python_frame("/home/me/train.py", 12, "train");
    t.alloc(0x100000 * (s + 1), (s + 1) * 100 * KiB, t.stack({line}));
  });
  REQUIRE(r.retained.has_value());
  CHECK_FALSE(r.retained->growth_constant);
  CHECK(r.retained->min_growth_bytes == 200 * KiB);
  CHECK(r.retained->max_growth_bytes == 500 * KiB);
  CHECK(r.retained->growth_per_step_bytes == (200 + 300 + 400 + 500) * KiB / 4);
  CHECK_THAT(r.retained->verdict.summary, Contains("Between 200 KiB and 500 KiB (350 KiB on average) more is live"));
}
