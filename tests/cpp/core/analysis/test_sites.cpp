// Specification of allocation sites in the analysis (docs/sites.md): every block at the peak
// carries its site, the peak is grouped by (site, category) and by stack, the stacks cover the
// peak to the byte, and the report's frames give each site's file, line and function.
#include <numeric>

#include "catch.h"
#include "json_value.h"
#include "ridgescope/analysis.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {
const SiteBytes* find_site(const Report& r, const std::string& site, Category c) {
  for (const SiteBytes& s : r.peak.by_site) {
    if (s.site == site && s.category == c) return &s;
  }
  return nullptr;
}
}  // namespace

SCENARIO("the peak by allocation site and by stack", "[core][analysis][sites]") {
  GIVEN("a step whose blocks were made at known sites: a training loop line, a model line, an "
        "autograd node, a storage from before tracking, and one block with no site") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      const auto train = t.python_frame("/home/me/train.py", 10, "train");
      const auto model = t.python_frame("/home/me/model.py", 20, "MLP.forward");
      const auto linear = t.python_frame("/venv/torch/nn/modules/linear.py", 125, "Linear.forward");
      const auto node = t.frame(FrameKind::Autograd, "", 0, "MmBackward0", "fc1");
      const auto before = t.frame(FrameKind::Untracked, "", 0, "allocated before tracking started");
      // stacks: the model line under the training loop (python mode: innermost first, site 1)
      const auto model_stack = t.stack({linear, model, train}, 1);
      const auto train_stack = t.stack({train});
      const auto node_stack = t.stack({node});
      const auto before_stack = t.stack({before});
      t.alloc(0x1000, 2048, before_stack).tag(0x1000, Category::Parameter, "fc1.weight");
      t.begin("forward");
      t.alloc(0x2000, 1000, model_stack).tag(0x2000, Category::Activation, "activation saved in fc1", true);
      t.alloc(0x3000, 500, model_stack).tag(0x3000, Category::Activation, "activation saved in fc1", true);
      t.alloc(0x4000, 300, train_stack);
      t.alloc(0x5000, 100);  // no stack: a source that records none
      t.end("forward").begin("backward");
      t.alloc(0x6000, 2048, node_stack).tag(0x6000, Category::Gradient, "grad of fc1.weight");
      t.end("backward").step(0);
      t.close();
    }
    const Report r = analyze_trace(path.str());
    THEN("the peak holds everything, and the stacks cover it to the byte") {
      REQUIRE(r.peak.bytes == 2048 + 1000 + 500 + 300 + 100 + 2048);
      std::uint64_t stacks = 0, blocks = 0;
      for (const StackBytes& s : r.peak.stacks) {
        stacks += s.bytes;
        blocks += s.blocks;
        CHECK(std::accumulate(s.by_category.begin(), s.by_category.end(), std::uint64_t{0}) == s.bytes);
      }
      CHECK(stacks == r.peak.bytes);
      CHECK(blocks == 6);
      CHECK(r.peak.stacks_merged == 0);
    }
    THEN("bytes are grouped by site and category, named as a person reads them") {
      const SiteBytes* model = find_site(r, "model.py:20 in MLP.forward", Category::Activation);
      REQUIRE(model != nullptr);
      CHECK(model->bytes == 1500);
      CHECK(model->blocks == 2);
      REQUIRE(find_site(r, "train.py:10 in train", Category::Unknown) != nullptr);
      CHECK(find_site(r, "train.py:10 in train", Category::Unknown)->bytes == 300);
      REQUIRE(find_site(r, "MmBackward0 of fc1", Category::Gradient) != nullptr);
      CHECK(find_site(r, "MmBackward0 of fc1", Category::Gradient)->bytes == 2048);
      CHECK(find_site(r, "(allocated before tracking started)", Category::Parameter)->bytes == 2048);
      const SiteBytes* none = find_site(r, "(no site recorded)", Category::Unknown);
      REQUIRE(none != nullptr);
      CHECK(none->bytes == 100);
      CHECK(none->frame == -1);
      CHECK(r.peak.by_site.size() == 5);
      for (std::size_t i = 1; i < r.peak.by_site.size(); ++i) {
        CHECK(r.peak.by_site[i - 1].bytes >= r.peak.by_site[i].bytes);
      }
    }
    THEN("each site's frame gives the exact file, line and function") {
      const SiteBytes* model = find_site(r, "model.py:20 in MLP.forward", Category::Activation);
      REQUIRE(model->frame >= 0);
      const ReportFrame& f = r.frames[static_cast<std::size_t>(model->frame)];
      CHECK(f.kind == FrameKind::Python);
      CHECK(f.file == "/home/me/model.py");
      CHECK(f.line == 20);
      CHECK(f.function == "MLP.forward");
      const ReportFrame& n = r.frames[static_cast<std::size_t>(find_site(r, "MmBackward0 of fc1", Category::Gradient)->frame)];
      CHECK(n.kind == FrameKind::Autograd);
      CHECK(n.module == "fc1");
    }
    THEN("a stack lists its frames innermost first, with the site marked") {
      const StackBytes* deep = nullptr;
      for (const StackBytes& s : r.peak.stacks) {
        if (s.frames.size() == 3) deep = &s;
      }
      REQUIRE(deep != nullptr);
      CHECK(deep->bytes == 1500);
      CHECK(deep->by_category[category_index(Category::Activation)] == 1500);
      CHECK(r.frames[deep->frames[0]].function == "Linear.forward");
      CHECK(r.frames[deep->frames[2]].function == "train");
      CHECK(deep->site == 1);
    }
    THEN("every block at the peak names its site") {
      REQUIRE(r.peak.top_blocks.size() == 6);
      for (const TopBlock& b : r.peak.top_blocks) {
        if (b.bytes == 100) {
          CHECK(b.site.empty());
          CHECK(b.site_frame == -1);
        } else {
          CHECK_FALSE(b.site.empty());
          CHECK(b.site_frame >= 0);
        }
        if (b.bytes == 1000) CHECK(b.site == "model.py:20 in MLP.forward");
        if (b.category == Category::Gradient) CHECK(b.site == "MmBackward0 of fc1");
      }
    }
    THEN("the JSON carries them under the documented keys") {
      std::string error;
      const auto json = detail::parse_json(r.to_json(), &error);
      REQUIRE(json);
      const auto* peak = json->get("peak");
      REQUIRE(peak != nullptr);
      REQUIRE(peak->get("by_site") != nullptr);
      REQUIRE(peak->get("stacks") != nullptr);
      CHECK(peak->get_uint("stacks_merged") == 0u);
      const auto& first = peak->get("by_site")->array.at(0);
      CHECK(first.get_string("site").has_value());
      CHECK(first.get_uint("bytes").has_value());
      const auto* frames = json->get("frames");
      REQUIRE(frames != nullptr);
      CHECK(frames->array.size() == r.frames.size());
      bool found = false;
      for (const auto& f : frames->array) {
        if (f.get_string("file") == std::string("/home/me/model.py")) {
          found = true;
          CHECK(f.get_uint("line") == 20u);
          CHECK(f.get_string("kind") == std::string("python"));
          CHECK(f.get_string("function") == std::string("MLP.forward"));
        }
      }
      CHECK(found);
      CHECK(json->get("retained") != nullptr);
      CHECK(json->get("retained")->type == detail::JsonValue::Type::Null);
    }
  }
}

SCENARIO("beyond max_stacks the smallest stacks become one entry without frames", "[core][analysis][sites]") {
  GIVEN("twelve blocks, each at its own line") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      for (std::uint64_t i = 0; i < 12; ++i) {
        const auto f = t.python_frame("/x/y.py", 100 + i, "f");
        t.alloc(0x1000 * (i + 1), 1000 + i, t.stack({f}));
      }
      t.close();
    }
    AnalysisOptions options;
    options.max_stacks = 10;
    options.top_sites = 4;
    const Report r = analyze_trace(path.str(), options);
    THEN("ten stacks are listed and the two smallest are merged, the total still exact") {
      REQUIRE(r.peak.stacks.size() == 11);
      CHECK(r.peak.stacks_merged == 2);
      CHECK(r.peak.stacks.back().frames.empty());
      CHECK(r.peak.stacks.back().bytes == 1000 + 1001);
      std::uint64_t total = 0;
      for (const StackBytes& s : r.peak.stacks) total += s.bytes;
      CHECK(total == r.peak.bytes);
      CHECK(r.peak.by_site.size() == 4);
      CHECK(r.peak.by_site[0].site == "y.py:111 in f");
    }
  }
}

SCENARIO("a trace without sites (format 1, or stacks=None) has no site anywhere", "[core][analysis][sites]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.alloc(0x10, 64).alloc(0x20, 32);
    t.close();
  }
  const Report r = analyze_trace(path.str());
  CHECK(r.frames.empty());
  REQUIRE(r.peak.by_site.size() == 1);
  CHECK(r.peak.by_site[0].site == "(no site recorded)");
  CHECK(r.peak.by_site[0].bytes == 96);
  REQUIRE(r.peak.stacks.size() == 1);
  CHECK(r.peak.stacks[0].frames.empty());
  CHECK(r.peak.stacks[0].bytes == 96);
}

SCENARIO("every report frame carries the core's library verdict and texts", "[core][analysis][sites]") {
  GIVEN("a python-mode stack through the interpreter, torch, a custom Inductor cache the trace's "
        "sites metadata names, the standard library and the user's code") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.metadata("sites", R"({"mode": "all", "python_frames": true, "reason": "",)"
                          R"( "library_roots": ["/scratch/cache/"], "stdlib_roots": []})");
      const auto eval = t.frame(FrameKind::Native, "??", 0, "_PyEval_EvalFrameDefault");
      const auto generated = t.python_frame("/scratch/cache/ab/cab.py", 7, "call");
      const auto linear = t.python_frame("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward");
      const auto model = t.python_frame("/home/me/model.py", 20, "MLP.forward");
      const auto runpy = t.python_frame("/usr/lib/python3.11/runpy.py", 88, "_run_code");
      t.begin("forward");
      t.alloc(0x1000, 4096, t.stack({eval, generated, linear, model, eval, runpy}, 3));
      t.end("forward");
      t.close();
    }
    const Report r = analyze_trace(path.str());
    THEN("the peak's stack lists them with library flags and texts, the user's frame and its site alone not library") {
      REQUIRE(r.peak.stacks.size() == 1);
      const StackBytes& s = r.peak.stacks[0];
      REQUIRE(s.frames.size() == 6);
      std::vector<bool> library;
      std::vector<std::string> text;
      for (std::uint32_t i : s.frames) {
        library.push_back(r.frames[i].library);
        text.push_back(r.frames[i].text);
      }
      CHECK(library == std::vector<bool>{true, true, true, false, true, true});
      CHECK(text == std::vector<std::string>{"_PyEval_EvalFrameDefault", "cab.py:7 in call", "linear.py:125 in forward",
                                             "model.py:20 in MLP.forward", "_PyEval_EvalFrameDefault",
                                             "runpy.py:88 in _run_code"});
      CHECK(r.frames[s.frames[3]].location == "/home/me/model.py:20 in MLP.forward");
      CHECK(s.site == 3);
      CHECK(r.peak.by_site[0].site == "model.py:20 in MLP.forward");
    }
    THEN("the JSON report writes them on each frame") {
      std::string error;
      const auto j = detail::parse_json(r.to_json(), &error);
      REQUIRE(j);
      const auto& frames = j->get("frames")->array;
      REQUIRE(!frames.empty());
      for (const auto& f : frames) {
        REQUIRE(f.get("library") != nullptr);
        CHECK(f.get("library")->type == detail::JsonValue::Type::Bool);
        CHECK(f.get_string("text").has_value());
        CHECK(f.get_string("location").has_value());
      }
    }
  }
}
