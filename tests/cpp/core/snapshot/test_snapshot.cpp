// Specification of the torch memory snapshot export and import (ridgescope/snapshot.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <tuple>

#include "catch.h"
#include "pickle_reader.h"
#include "pickle_writer.h"
#include "ridgescope/allocator_model.h"
#include "ridgescope/analysis.h"
#include "ridgescope/cuda_rounding.h"
#include "ridgescope/snapshot.h"
#include "allocator_workload.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::detail::PickleValue;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {
std::uint64_t cat(const CategoryBytes& bytes, Category c) { return bytes[category_index(c)]; }

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::uint64_t u(const PickleValue& d, const char* key) {
  const PickleValue* v = d.get(key);
  REQUIRE(v != nullptr);
  std::uint64_t out = 0;
  REQUIRE(v->to_uint64(&out));
  return out;
}

std::string s(const PickleValue& d, const char* key) {
  const PickleValue* v = d.get(key);
  REQUIRE(v != nullptr);
  REQUIRE(v->is_str());
  return std::string(v->str());
}

}  // namespace

SCENARIO("a CPU trace exported as a torch memory snapshot", "[core][snapshot]") {
  GIVEN("the trace of one training step") {
    TempPath trace, pickle(".pickle");
    {
      TraceBuilder t(trace.str());
      write_adam_step(t);
    }
    const SnapshotWriteStats stats = write_snapshot(trace.str(), pickle.str());
    const std::string bytes = slurp(pickle.str());
    const auto parsed = detail::parse_pickle(bytes);
    const PickleValue& root = parsed.root;
    THEN("it is a protocol 4 pickle of the snapshot keys") {
      CHECK(parsed.protocol == 4);
      CHECK(stats.bytes == bytes.size());
      REQUIRE(root.get("segments") != nullptr);
      REQUIRE(root.get("device_traces") != nullptr);
      REQUIRE(root.get("allocator_settings") != nullptr);
      REQUIRE(root.get("device_traces")->list().size() == 1);
    }
    THEN("device 0's trace has a segment and an alloc per block, each entry with a category") {
      const auto& entries = root.get("device_traces")->list()[0].list();
      // 11 allocations x (segment_alloc + alloc), 4 frees x (free_requested, free_completed,
      // segment_free), one closing snapshot entry.
      CHECK(entries.size() == 11 * 2 + 4 * 3 + 1);
      CHECK(stats.allocations == 11);
      for (const PickleValue& e : entries) CHECK(e.get("category") != nullptr);
      CHECK(s(entries[0], "action") == "segment_alloc");
      CHECK(s(entries[1], "action") == "alloc");
      CHECK(u(entries[1], "addr") == 0x1000);
      CHECK(u(entries[1], "size") == 4096);
      CHECK(s(entries[1], "category") == "parameter");
      CHECK(s(*entries[1].get("user_metadata"), "label") == "fc1.weight");
      CHECK(s(*entries[1].get("user_metadata"), "phase") == "idle");
      // The activation saved in forward: phase forward, category activation.
      CHECK(u(entries[7], "addr") == 0x20000);
      CHECK(s(entries[7], "category") == "activation");
      CHECK(s(*entries[7].get("user_metadata"), "phase") == "forward");
      // The temporary: alloc then its free, requested before completed.
      CHECK(s(entries[9], "category") == "temporary");
      CHECK(s(entries[10], "action") == "free_requested");
      CHECK(s(entries[11], "action") == "free_completed");
      CHECK(s(entries[12], "action") == "segment_free");
      CHECK(s(entries.back(), "action") == "snapshot");
      CHECK(s(entries.back(), "category") == "unknown");
      CHECK(u(entries.back(), "size") == 4096 + 1024 + 512 + 1024 + 4096 + 4096 + 1024);
    }
    THEN("segments are the 7 blocks live at the end, one block each, active_allocated") {
      const auto& segments = root.get("segments")->list();
      REQUIRE(segments.size() == 7);
      std::uint64_t total = 0;
      for (const PickleValue& seg : segments) {
        const auto& blocks = seg.get("blocks")->list();
        REQUIRE(blocks.size() == 1);
        CHECK(s(blocks[0], "state") == "active_allocated");
        CHECK(u(blocks[0], "size") == u(seg, "total_size"));
        total += u(seg, "total_size");
      }
      CHECK(total == 4096 + 1024 + 512 + 1024 + 4096 + 4096 + 1024);
    }
    THEN("phases and the step are annotations placed by their index in the trace") {
      const auto& ann = root.get("external_annotations")->list();
      REQUIRE(ann.size() == 7);
      CHECK(s(ann[0], "name") == "forward");
      CHECK(s(ann[0], "stage") == "START");
      CHECK(u(ann[0], "trace_index") == 6);  // after the three idle allocations
      CHECK(s(ann[6], "name") == "ridgescope.step");
      CHECK(u(ann[6], "step") == 0);
    }
    WHEN("the export is read back") {
      const Report original = analyze_trace(trace.str());
      const Report back = analyze_snapshot(pickle.str());
      THEN("peak, composition, steps and per-phase figures are the same") {
        CHECK(back.peak.bytes == original.peak.bytes);
        CHECK(back.peak.by_category == original.peak.by_category);
        CHECK(back.peak.inferred_by_category == original.peak.inferred_by_category);
        CHECK(back.peak.phase == original.peak.phase);
        CHECK(back.final_by_category == original.final_by_category);
        REQUIRE(back.steps.size() == original.steps.size());
        for (std::size_t i = 0; i < back.steps.size(); ++i) {
          REQUIRE(back.steps[i].phases.size() == original.steps[i].phases.size());
          for (std::size_t j = 0; j < back.steps[i].phases.size(); ++j) {
            const PhaseStats& a = original.steps[i].phases[j];
            const PhaseStats& b = back.steps[i].phases[j];
            CHECK(b.phase == a.phase);
            CHECK(b.start_bytes == a.start_bytes);
            CHECK(b.peak_bytes == a.peak_bytes);
            CHECK(b.end_bytes == a.end_bytes);
            CHECK(b.allocated_bytes == a.allocated_bytes);
            CHECK(b.freed_bytes == a.freed_bytes);
            CHECK(b.peak_by_category == a.peak_by_category);
          }
        }
        REQUIRE(back.snapshot.has_value());
        CHECK(back.snapshot->producer == "ridgescope");
        CHECK(back.snapshot->device == "cpu");
        CHECK(back.device == Device{});
        CHECK_FALSE(back.snapshot->phases_inferred);
        CHECK(back.trace.path == pickle.str());
      }
    }
  }
}

SCENARIO("a CUDA trace with segments exports blocks that tile each segment", "[core][snapshot]") {
  GIVEN("a 2 MiB segment holding two blocks with a gap between them") {
    TempPath trace, pickle(".pickle");
    {
      TraceBuilder t(trace.str(), Device{DeviceType::CUDA, 0});
      t.segment(0x7f0000000000, 2 << 20);
      t.alloc(0x7f0000000000, 512).alloc(0x7f0000100000, 1024);
      t.close();
    }
    write_snapshot(trace.str(), pickle.str());
    const std::string file = slurp(pickle.str());
    const auto parsed = detail::parse_pickle(file);
    THEN("the segment lists active, inactive, active, inactive blocks summing to its size") {
      const auto& segments = parsed.root.get("segments")->list();
      REQUIRE(segments.size() == 1);
      const auto& blocks = segments[0].get("blocks")->list();
      REQUIRE(blocks.size() == 4);
      CHECK(s(blocks[0], "state") == "active_allocated");
      CHECK(u(blocks[0], "size") == 512);
      CHECK(s(blocks[1], "state") == "inactive");
      CHECK(u(blocks[1], "size") == 0x100000 - 512);
      CHECK(u(blocks[2], "size") == 1024);
      CHECK(u(blocks[3], "size") == (2 << 20) - 0x100000 - 1024);
      CHECK(u(segments[0], "allocated_size") == 1536);
      const auto& entries = parsed.root.get("device_traces")->list()[0].list();
      CHECK(s(entries[0], "action") == "segment_alloc");
      CHECK(s(entries[0], "category") == "unknown");
    }
  }
}

namespace {
// A snapshot in the layout torch's _snapshot() produces, written the way a test would build it.
void torch_frame(detail::PickleWriter& w, const char* file, const char* name) {
  w.begin_dict().key("filename").str(file).key("line").integer(10).key("name").str(name).end_dict();
}
void torch_entry(detail::PickleWriter& w, const char* action, std::uint64_t addr, std::uint64_t size,
                 std::uint64_t time_us, std::initializer_list<std::pair<const char*, const char*>> frames) {
  w.begin_dict();
  w.key("action").str(action).key("addr").unsigned_integer(addr).key("size").unsigned_integer(size);
  w.key("stream").integer(0).key("time_us").unsigned_integer(time_us);
  w.key("frames").begin_list();
  for (const auto& [f, n] : frames) torch_frame(w, f, n);
  w.end_list();
  w.end_dict();
}
}  // namespace

SCENARIO("a snapshot written by PyTorch is read with inferred categories and phases", "[core][snapshot]") {
  GIVEN("a weight made at init (live at the end), a forward activation freed in backward, and Adam state") {
    TempPath pickle(".pickle");
    {
      detail::PickleWriter w;
      w.begin_dict();
      w.key("segments").begin_list();
      w.begin_dict().key("device").integer(0).key("address").integer(0x100000).key("total_size").integer(2 << 20);
      w.key("stream").integer(0).key("blocks").begin_list();
      // the state the trace leaves: the weight, the gradient and the Adam state live
      for (auto [size, requested, state] : {std::tuple{1024, 1000, "active_allocated"}, {3072, 0, "inactive"},
                                            {512, 100, "active_allocated"}, {1024, 1000, "active_allocated"},
                                            {(2 << 20) - 0x1600, 0, "inactive"}}) {
        w.begin_dict().key("size").integer(size).key("requested_size").integer(requested).key("state").str(state);
        w.key("frames").begin_list().end_list().end_dict();
      }
      w.end_list().end_dict();
      w.end_list();
      w.key("device_traces").begin_list().begin_list();
      torch_entry(w, "alloc", 0x100000, 1000, 5000, {{"torch/nn/modules/linear.py", "reset_parameters"}});
      torch_entry(w, "alloc", 0x100400, 3000, 6000, {{"torch/nn/modules/module.py", "_call_impl"}});
      torch_entry(w, "alloc", 0x101000, 100, 7000, {{"torch/_tensor.py", "backward"}});
      torch_entry(w, "free_requested", 0x100400, 3000, 7100, {});
      torch_entry(w, "free_completed", 0x100400, 3000, 7100, {});
      torch_entry(w, "alloc", 0x101200, 1000, 8000,
                  {{"torch/optim/adam.py", "_init_group"}, {"torch/optim/optimizer.py", "wrapper"}});
      w.end_list().end_list();
      w.key("allocator_settings").begin_dict().end_dict();
      w.end_dict();
      w.finish();
      std::ofstream(pickle.str(), std::ios::binary) << w.take();
    }
    const Report r = analyze_snapshot(pickle.str());
    THEN("the weight is a parameter with its exact block size, and the Adam state is optimizer state") {
      REQUIRE(r.snapshot.has_value());
      CHECK(r.snapshot->producer == "pytorch");
      CHECK(r.snapshot->categories_inferred);
      CHECK(r.snapshot->phases_inferred);
      CHECK(r.snapshot->block_sizes_inferred);
      CHECK(r.snapshot->categorised_from_frames == 2);
      CHECK(r.device == Device{DeviceType::CUDA, 0});
      // the blocks the segment holds at the end: 1024 (1000 rounded) + 512 (100) + 1024 (1000)
      CHECK(r.final_live_bytes == 1024 + 512 + 1024);
      CHECK(cat(r.final_by_category, Category::Parameter) == 1024);
      CHECK(cat(r.final_by_category, Category::OptimizerState) == 1024);
      CHECK(cat(r.final_by_category, Category::Gradient) == 512);  // made in backward, kept
    }
    THEN("the activation made in forward and freed in backward is inferred as an activation at the peak") {
      // Peak: weight 1024 + activation 3072 (3000 rounded) + 512 = 4608, in backward.
      CHECK(r.peak.bytes == 1024 + 3072 + 512);
      CHECK(r.peak.phase == "backward");
      CHECK(cat(r.peak.by_category, Category::Activation) == 3072);
      CHECK(cat(r.peak.inferred_by_category, Category::Activation) == 3072);
    }
  }
}

SCENARIO("snapshots with wrong content are refused with a message naming the place", "[core][snapshot]") {
  auto error_of = [](const std::function<void(detail::PickleWriter&)>& body) {
    TempPath pickle(".pickle");
    detail::PickleWriter w;
    body(w);
    w.finish();
    std::ofstream(pickle.str(), std::ios::binary) << w.take();
    try {
      analyze_snapshot(pickle.str());
    } catch (const SnapshotError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of([](auto& w) { w.begin_dict().key("x").integer(1).end_dict(); })
            .find("neither 'segments' nor 'device_traces'") != std::string::npos);
  CHECK(error_of([](auto& w) { w.integer(3); }).find("holds a int, not a snapshot dict") != std::string::npos);
  CHECK(error_of([](auto& w) { w.begin_dict().key("segments").str("x").end_dict(); })
            .find("'segments' must be a list, got str") != std::string::npos);
  CHECK(error_of([](auto& w) {
          w.begin_dict().key("device_traces").begin_list().begin_list();
          w.begin_dict().key("action").str("alloc").key("addr").str("0x10").key("size").integer(4).end_dict();
          w.end_list().end_list().end_dict();
        }).find("device_traces[0][0]['addr'] must be an int, got str") != std::string::npos);
  CHECK(error_of([](auto& w) {
          w.begin_dict().key("device_traces").begin_list().begin_list();
          w.begin_dict().key("action").str("alloc").key("addr").integer(16).end_dict();
          w.end_list().end_list().end_dict();
        }).find("device_traces[0][0] has no 'size'") != std::string::npos);
  TempPath missing(".pickle");
  CHECK_THROWS_AS(analyze_snapshot(missing.str()), SnapshotError);
}

SCENARIO("a block whose category changes while live is exported with an annotate entry", "[core][snapshot]") {
  GIVEN("a block tagged as an activation, re-tagged as a gradient later, then a peak") {
    TempPath trace, pickle(".pickle");
    {
      TraceBuilder t(trace.str());
      t.at(1000).begin("backward");
      t.alloc(0x1000, 4096).tag(0x1000, Category::Activation, "h");
      t.alloc(0x2000, 1024).free(0x2000);
      t.tag(0x1000, Category::Gradient, "grad of w");
      t.alloc(0x3000, 2048);
      t.end("backward");
      t.close();
    }
    write_snapshot(trace.str(), pickle.str());
    const std::string file = slurp(pickle.str());
    const auto parsed = detail::parse_pickle(file);
    const auto& entries = parsed.root.get("device_traces")->list()[0].list();
    THEN("the annotate entry carries the new category and label, after the temporary") {
      std::size_t found = 0;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (s(entries[i], "action") != "annotate") continue;
        ++found;
        CHECK(u(entries[i], "addr") == 0x1000);
        CHECK(s(entries[i], "category") == "gradient");
        CHECK(s(*entries[i].get("user_metadata"), "label") == "grad of w");
        CHECK(s(entries[i - 1], "action") == "segment_free");  // of the temporary
      }
      CHECK(found == 1);
    }
    THEN("reading it back gives the same composition at the peak and at the end") {
      const Report a = analyze_trace(trace.str());
      const Report b = analyze_snapshot(pickle.str());
      CHECK(a.peak.bytes == 4096 + 2048);
      // the re-tagged block, and the unlabelled one made in backward and kept (a lifetime rule)
      CHECK(cat(a.peak.by_category, Category::Gradient) == 4096 + 2048);
      CHECK(cat(a.peak.inferred_by_category, Category::Gradient) == 2048);
      CHECK(b.peak.inferred_by_category == a.peak.inferred_by_category);
      CHECK(b.peak.bytes == a.peak.bytes);
      CHECK(b.peak.by_category == a.peak.by_category);
      CHECK(b.final_by_category == a.final_by_category);
    }
  }
}

SCENARIO("an alloc over a live block (a missed free) is exported as a free then the alloc", "[core][snapshot]") {
  GIVEN("two allocs at the same address without a free between them") {
    TempPath trace, pickle(".pickle");
    {
      TraceBuilder t(trace.str());
      t.alloc(0x1000, 100).alloc(0x1000, 300);
      t.close();
    }
    write_snapshot(trace.str(), pickle.str());
    const std::string file = slurp(pickle.str());
    const auto parsed = detail::parse_pickle(file);
    const auto& entries = parsed.root.get("device_traces")->list()[0].list();
    THEN("memory_viz sees the first block freed before the second is allocated, and one live segment") {
      std::vector<std::string> actions;
      for (const auto& e : entries) actions.push_back(s(e, "action"));
      CHECK(actions == std::vector<std::string>{"segment_alloc", "alloc", "free_requested", "free_completed",
                                                "segment_free", "segment_alloc", "alloc", "snapshot"});
      REQUIRE(parsed.root.get("segments")->list().size() == 1);
      CHECK(u(parsed.root.get("segments")->list()[0], "total_size") == 300);
      CHECK(analyze_snapshot(pickle.str()).final_live_bytes == analyze_trace(trace.str()).final_live_bytes);
    }
  }
}

namespace {
// What the allocator model says of a run, for comparison with the snapshot replay.
struct ModelRun {
  std::uint64_t peak_allocated = 0, peak_reserved = 0, final_allocated = 0, final_reserved = 0;
  std::uint64_t unsplit_blocks = 0;  // allocations whose block is larger than the rounded request
};

// Drives ridgescope's allocator model (a simulation of torch's caching allocator, separate
// from the snapshot reader) with a fixed pseudo-random workload and writes what torch's
// _snapshot() would hold for it: device_traces with *requested* sizes (segment entries, alloc,
// free_requested, free_completed), the segments at the end, and allocator_settings as torch
// writes them (max_split_size -1 when unlimited; roundup_power2_divisions keyed "1".."32768").
// The first `skip` operations happen before the trace begins (torch's ring buffer dropped
// them). The peaks returned are over the traced window.
ModelRun write_model_run_as_torch_snapshot(const AllocatorSettings& settings, int operations, int skip,
                                           const std::string& path) {
  AllocatorModel model(settings);
  const CudaRoundingRules rules = allocator_rounding_rules(settings);
  detail::PickleWriter w;
  w.begin_dict();
  w.key("device_traces").begin_list().begin_list();
  ModelRun run;
  std::uint64_t time_us = 1000;
  bool tracing = skip == 0;
  auto entry = [&](std::string_view action, std::uint64_t addr, std::uint64_t size, std::uint64_t stream) {
    if (!tracing) return std::string();
    w.begin_dict().key("action").str(action).key("addr").unsigned_integer(addr).key("size").unsigned_integer(size);
    w.key("stream").unsigned_integer(stream).key("time_us").unsigned_integer(time_us).end_dict();
    return std::string();
  };
  auto observe = [&] {
    run.peak_allocated = std::max(run.peak_allocated, model.allocated_bytes());
    run.peak_reserved = std::max(run.peak_reserved, model.reserved_bytes());
  };
  testing::AllocatorWorkloadCallbacks cb;
  cb.segment = [&](const AllocatorSegmentEvent& e) {
    return entry(allocator_segment_event_name(e.kind), e.address, e.bytes, e.stream);
  };
  cb.alloc = [&](int, std::uint64_t bytes, const MallocResult& m) {
    if (tracing && m.block_bytes != cuda_round_size(bytes, rules)) ++run.unsplit_blocks;
    return entry("alloc", m.address, bytes, 0);
  };
  cb.free = [&](int, const AllocatorBlockInfo& b) {
    entry("free_requested", b.address, b.requested_bytes, 0);
    return entry("free_completed", b.address, b.requested_bytes, 0);
  };
  cb.after = [&](int op) {
    ++time_us;
    if (!tracing && op + 1 == skip) {
      tracing = true;
      observe();  // the state the trace starts from
    } else if (tracing) {
      observe();
    }
    return std::string();
  };
  const std::string stopped = testing::run_allocator_workload(model, operations, 0x2545f4914f6cdd1dull, cb);
  REQUIRE(stopped.empty());
  w.end_list().end_list();
  run.final_allocated = model.allocated_bytes();
  run.final_reserved = model.reserved_bytes();
  w.key("segments").begin_list();
  for (const AllocatorSegmentInfo& seg : model.segments()) {
    w.begin_dict().key("device").integer(0).key("address").unsigned_integer(seg.address);
    w.key("total_size").unsigned_integer(seg.total_bytes).key("stream").unsigned_integer(seg.stream);
    w.key("segment_type").str(seg.is_large ? "large" : "small").key("is_expandable").boolean(seg.is_expandable);
    w.key("blocks").begin_list();
    for (const AllocatorBlockInfo& b : seg.blocks) {
      w.begin_dict().key("address").unsigned_integer(b.address).key("size").unsigned_integer(b.bytes);
      w.key("requested_size").unsigned_integer(b.requested_bytes);
      w.key("state").str(b.allocated ? "active_allocated" : "inactive").end_dict();
    }
    w.end_list().end_dict();
  }
  w.end_list();
  w.key("allocator_settings").begin_dict();
  w.key("PYTORCH_CUDA_ALLOC_CONF").str(format_allocator_settings(settings));
  w.key("max_split_size").integer(settings.max_split_size_bytes == 0 ? -1
                                                                    : static_cast<std::int64_t>(settings.max_split_size_bytes));
  w.key("expandable_segments").boolean(settings.expandable_segments);
  w.key("roundup_power2_divisions").begin_dict();
  for (std::size_t i = 0; i < settings.roundup_power2_divisions.size(); ++i) {
    w.key(std::to_string(1ull << i)).unsigned_integer(settings.roundup_power2_divisions[i]);
  }
  w.end_dict().end_dict();
  w.end_dict();
  w.finish();
  std::ofstream(path, std::ios::binary) << w.take();
  return run;
}

std::uint64_t max_reserved(const Report& r) {
  std::uint64_t m = 0;
  for (const auto& c : r.timeline.columns) m = std::max(m, c.reserved_bytes);
  return m;
}
}  // namespace

SCENARIO("a snapshot PyTorch wrote is replayed with the allocator's exact block sizes", "[core][snapshot][cuda]") {
  GIVEN("2000 mallocs and frees of 1 B to 200 MiB recorded from the start, under four allocator settings") {
    AllocatorSettings plain, max_split, roundup, expandable;
    max_split.max_split_size_bytes = 64ull << 20;
    roundup.roundup_power2_divisions.fill(4);
    expandable.expandable_segments = true;
    // One THEN with a loop: Catch's sections inside a loop would run only the first setting.
    THEN("each replay's peak, final bytes and reserved peak equal the allocator's, to the byte, and the blocks "
         "handed out whole (what rounding alone gets wrong) are counted") {
      for (const auto& [name, settings] : {std::pair{"default", plain}, std::pair{"max_split_size_mb:64", max_split},
                                          std::pair{"roundup_power2_divisions:4", roundup},
                                          std::pair{"expandable_segments:True", expandable}}) {
        TempPath pickle(".pickle");
        const ModelRun truth = write_model_run_as_torch_snapshot(settings, 2000, 0, pickle.str());
        const Report r = analyze_snapshot(pickle.str());
        INFO(name);
        REQUIRE(r.snapshot.has_value());
        CHECK(r.snapshot->unmatched_entries == 0);
        CHECK(r.peak.bytes == truth.peak_allocated);
        CHECK(r.final_live_bytes == truth.final_allocated);
        CHECK(max_reserved(r) == truth.peak_reserved);
        CHECK(r.snapshot->blocks_larger_than_rounded == truth.unsplit_blocks);
        if (!settings.expandable_segments) CHECK(truth.unsplit_blocks > 0);
      }
    }
  }
  GIVEN("the same runs whose first 600 operations fell out of torch's trace ring buffer") {
    THEN("the start state is rebuilt from the segments and the frees, the blocks live at the end are exact, and "
         "the peak is within what the lost requests cannot tell") {
      AllocatorSettings plain, expandable;
      expandable.expandable_segments = true;
      for (const auto& [name, settings] : {std::pair{"default", plain}, std::pair{"expandable_segments:True", expandable}}) {
        TempPath pickle(".pickle");
        const ModelRun truth = write_model_run_as_torch_snapshot(settings, 2000, 600, pickle.str());
        const Report r = analyze_snapshot(pickle.str());
        INFO(name);
        REQUIRE(r.snapshot.has_value());
        CHECK(r.snapshot->unmatched_entries == 0);
        CHECK(r.final_live_bytes == truth.final_allocated);
        CHECK(r.snapshot->live_at_start_blocks > 0);
        // A block made before the trace and freed in it is known only by its requested size: its
        // block may be up to 1 MiB bigger (an unsplit remainder), so the peak may be under by
        // that much per such block, never over.
        CHECK(r.peak.bytes <= truth.peak_allocated);
        CHECK(truth.peak_allocated - r.peak.bytes <= r.snapshot->live_at_start_blocks * (1ull << 20));
        CHECK(max_reserved(r) == truth.peak_reserved);
      }
    }
  }
}

SCENARIO("an old snapshot's single 'free' action ends a block like free_requested then free_completed",
         "[core][snapshot][cuda]") {
  GIVEN("a 2 MiB segment, a 1000 B allocation freed with the legacy action, then a 3000 B allocation") {
    TempPath pickle(".pickle");
    {
      detail::PickleWriter w;
      w.begin_dict().key("device_traces").begin_list().begin_list();
      torch_entry(w, "segment_alloc", 0x100000, 2 << 20, 1000, {});
      torch_entry(w, "alloc", 0x100000, 1000, 1001, {});
      torch_entry(w, "free", 0x100000, 1000, 1002, {});
      torch_entry(w, "alloc", 0x100000, 3000, 1003, {});
      w.end_list().end_list().end_dict();
      w.finish();
      std::ofstream(pickle.str(), std::ios::binary) << w.take();
    }
    const Report r = analyze_snapshot(pickle.str());
    THEN("the replay matches the segment exactly: peak 3072 B, nothing unmatched") {
      REQUIRE(r.snapshot.has_value());
      CHECK(r.snapshot->unmatched_entries == 0);
      CHECK(r.peak.bytes == 3072);
      CHECK(r.final_live_bytes == 3072);
      CHECK(max_reserved(r) == (2u << 20));
    }
  }
}
