// Specification of the device ledger (ridgescope/memory_layers.h, docs/forensics.md "The device
// ledger"): the driver's figure for the process = PyTorch reserved + the allocations outside
// PyTorch, by library + the CUDA context + the unexplained remainder, at every phase boundary
// and at the peak; and the OOM verdict that names who holds the card. The traces are built with
// the records the CUDA, CUPTI and NVML sources write, so every figure is known exactly.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "catch.h"
#include "json_value.h"
#include "pickle_reader.h"
#include "ridgescope/analysis.h"
#include "ridgescope/snapshot.h"
#include "ridgescope/external_alloc.h"
#include "ridgescope/report.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr std::uint8_t kMemCreate = static_cast<std::uint8_t>(ExternalApi::MemCreate);
constexpr std::uint8_t kMalloc = static_cast<std::uint8_t>(ExternalApi::Malloc);

// One NVML reading, as nvml_source.cpp writes it (nvml_reading last; 1: at a phase boundary).
void reading(TraceBuilder& t, std::uint64_t process_used, std::uint64_t used, std::uint64_t processes,
             std::uint64_t kind = 1) {
  t.sample("nvml_total_bytes", 8192 * MiB);
  t.sample("nvml_used_bytes", used);
  t.sample("nvml_process_count", processes);
  t.sample("nvml_process_used_bytes", process_used);
  t.sample("nvml_reading", kind);
}

// A device of 8 GiB: a 1 GiB CUDA context, a 2 GiB segment, NCCL's 4 GiB of buffers (cuMemCreate),
// 8 MiB that cuBLAS takes with cudaMalloc, 4 MiB the driver holds that nobody allocated, and
// another process holding 512 MiB. Step 0 peaks in backward at 1.5 GiB live; step 1's forward
// asks for 1 GiB with 508 MiB free on the device.
void write_nccl_run(const std::string& path) {
  TraceBuilder t(path, Device{DeviceType::CUDA, 0});
  t.metadata("cupti_source", R"({"available": true, "reason": ""})");
  t.at(1000);
  reading(t, 1024 * MiB, 1536 * MiB, 2);
  t.at(2000).begin("forward");
  t.segment(0x10000000000, 2048 * MiB);
  t.alloc(0x10000000000, 1024 * MiB);
  t.external_alloc(0x20000000000, 4096 * MiB, "libnccl.so.2", kMemCreate);
  t.external_alloc(0x30000000000, 8 * MiB, "libcublas.so.13", kMalloc);
  t.at(3000).end("forward");
  reading(t, 7180 * MiB, 7692 * MiB, 2);
  t.begin("backward");
  t.at(3500).alloc(0x10040000000, 512 * MiB);  // the peak: 1.5 GiB live
  t.at(4000).end("backward");
  reading(t, 7180 * MiB, 7692 * MiB, 2);
  t.free(0x10040000000);
  t.at(5000).begin("optimizer_step");
  t.external_free(0x30000000000, 8 * MiB, kMalloc);
  t.end("optimizer_step");
  reading(t, 7172 * MiB, 7684 * MiB, 2);
  t.step(0);
  t.at(6000).begin("forward");
  t.oom(1024 * MiB, 508 * MiB);
  t.close();
}

}  // namespace

SCENARIO("the device ledger reconciles the driver's figure with reserved bytes and CUPTI's groups",
         "[core][analysis][device_ledger]") {
  GIVEN("the 8 GiB device of write_nccl_run") {
    TempPath path;
    write_nccl_run(path.str());
    const Report r = analyze_trace(path.str());
    REQUIRE(r.device_ledger);
    const DeviceLedgerReport& d = *r.device_ledger;
    THEN("it uses this process's own figure, itemised, with the context from the first reading") {
      CHECK(d.available);
      CHECK(d.driver_source == "process");
      CHECK(d.itemised);
      CHECK(d.readings == 4);
      CHECK(d.other_processes == 1);
      CHECK(d.total_bytes == 8192 * MiB);
      CHECK(d.context_bytes == 1024 * MiB);
      CHECK(d.rows.size() == 4);
    }
    THEN("at the peak: driver = reserved + outside PyTorch + context + 4 MiB unexplained, read exactly") {
      CHECK(r.peak.bytes == 1536 * MiB);
      REQUIRE(d.at_peak);
      // forward's end reading: between it and the peak nothing was reserved or allocated outside
      // PyTorch, so the driver held then what it held at the peak
      CHECK(d.at_peak->time_ns == 3000);
      CHECK(d.at_peak->exact);
      CHECK(d.at_peak->driver_bytes == 7180 * MiB);
      CHECK(d.at_peak->reserved_bytes == 2048 * MiB);
      CHECK(d.at_peak->outside_bytes == 4104 * MiB);
      CHECK(d.at_peak->context_bytes == 1024 * MiB);
      CHECK(d.at_peak->unexplained_bytes == static_cast<std::int64_t>(4 * MiB));
      CHECK(d.at_peak->driver_bytes == d.at_peak->reserved_bytes + d.at_peak->outside_bytes +
                                           d.at_peak->context_bytes +
                                           static_cast<std::uint64_t>(d.at_peak->unexplained_bytes));
    }
    THEN("each library is a group with its count, bytes and lifetime in phases") {
      REQUIRE(d.groups.size() == 2);
      const ExternalGroup& nccl = d.groups[0];
      CHECK(nccl.library == "libnccl.so.2");
      CHECK(nccl.api == "cuMemCreate");
      CHECK(nccl.allocations == 1);
      CHECK(nccl.bytes_at_peak == 4096 * MiB);
      CHECK(nccl.live_at_peak == 1);
      CHECK(nccl.end_bytes == 4096 * MiB);
      CHECK(nccl.first_step == 0);
      CHECK(nccl.first_phase == "forward");
      CHECK_FALSE(nccl.last_free_step);
      const ExternalGroup& cublas = d.groups[1];
      CHECK(cublas.library == "libcublas.so.13");
      CHECK(cublas.api == "cudaMalloc");
      CHECK(cublas.bytes_at_peak == 8 * MiB);
      CHECK(cublas.end_bytes == 0);
      REQUIRE(cublas.last_free_step);
      CHECK(*cublas.last_free_step == 0);
      CHECK(cublas.last_free_phase == "optimizer_step");
    }
    THEN("the highest driver reading and the last one are kept") {
      REQUIRE(d.max_driver);
      CHECK(d.max_driver->driver_bytes == 7180 * MiB);
      REQUIRE(d.last);
      CHECK(d.last->driver_bytes == 7172 * MiB);
      CHECK(d.last->outside_bytes == 4096 * MiB);
    }
    THEN("the OOM verdict says how little was free and who holds the card") {
      REQUIRE(r.ooms.size() == 1);
      const Verdict& v = r.ooms[0].verdict;
      CHECK(v.kind == "non_pytorch");
      CHECK(v.summary ==
            "The request of 1.00 GiB failed with 508 MiB free on the device; 5.50 GiB of the card is held "
            "outside PyTorch, 4.00 GiB of it by NCCL: without it the request would fit.");
      bool named = false;
      for (const std::string& line : v.evidence) {
        if (line.find("this process 5.00 GiB (CUDA context 1.00 GiB)") != std::string::npos &&
            line.find("other processes 512 MiB") != std::string::npos &&
            line.find("allocated by libraries: NCCL 4.00 GiB") != std::string::npos) {
          named = true;
        }
      }
      CHECK(named);
    }
    THEN("the JSON carries the ledger under device_ledger") {
      std::string error;
      const auto json = detail::parse_json(r.to_json(), &error);
      REQUIRE(json);
      const detail::JsonValue* ledger = json->get("device_ledger");
      REQUIRE(ledger);
      CHECK(ledger->get_string("driver_source") == "process");
      const detail::JsonValue* at_peak = ledger->get("at_peak");
      REQUIRE(at_peak);
      CHECK(at_peak->get_uint("outside_bytes") == 4104 * MiB);
      const detail::JsonValue* groups = ledger->get("groups");
      REQUIRE(groups);
      REQUIRE(groups->array.size() == 2);
      CHECK(groups->array[0].get_string("library_name") == "NCCL");
      CHECK(json->get("host_memory")->type == detail::JsonValue::Type::Null);
    }
  }
}

SCENARIO("the device ledger without the process's own figure, without CUPTI, and with a pool's segment",
         "[core][analysis][device_ledger]") {
  GIVEN("a container where NVML lists no process: only the device's used bytes") {
    TempPath path;
    {
      TraceBuilder t(path.str(), Device{DeviceType::CUDA, 0});
      t.at(100).sample("nvml_used_bytes", 600 * MiB).sample("nvml_process_count", 0).sample("nvml_reading", 1);
      t.at(200).segment(0x1000000, 20 * MiB).alloc(0x1000000, 20 * MiB);
      t.at(300).sample("nvml_used_bytes", 620 * MiB).sample("nvml_process_count", 0).sample("nvml_reading", 1);
      t.close();
    }
    const Report r = analyze_trace(path.str());
    REQUIRE(r.device_ledger);
    THEN("the device-wide figure is used, and the ledger says the layer is not itemised") {
      CHECK(r.device_ledger->driver_source == "device");
      CHECK(r.device_ledger->context_bytes == 600 * MiB);
      CHECK_FALSE(r.device_ledger->itemised);
      CHECK_THAT(r.device_ledger->itemise_reason, Catch::Matchers::Contains("without the CUPTI source"));
      REQUIRE(r.device_ledger->last);
      CHECK(r.device_ledger->last->unexplained_bytes == 0);
    }
  }
  GIVEN("CUPTI refused (another profiler attached)") {
    TempPath path;
    {
      TraceBuilder t(path.str(), Device{DeviceType::CUDA, 0});
      t.metadata("cupti_source", R"({"available": false, "reason": "CUPTI is in use by another tool"})");
      t.at(100).segment(0x1000000, 2 * MiB).alloc(0x1000000, 512);
      t.close();
    }
    const Report r = analyze_trace(path.str());
    REQUIRE(r.device_ledger);
    THEN("the report says why the layer is not itemised") {
      CHECK_FALSE(r.device_ledger->available);
      CHECK_FALSE(r.device_ledger->itemised);
      CHECK(r.device_ledger->itemise_reason == "CUPTI is in use by another tool");
    }
  }
  GIVEN("an allocation CUPTI saw that then became a PyTorch segment (a MemPool's user allocator)") {
    TempPath path;
    {
      TraceBuilder t(path.str(), Device{DeviceType::CUDA, 0});
      t.metadata("cupti_source", R"({"available": true})");
      t.at(100).external_alloc(0x5000000, 64 * MiB, "libnccl.so.2", kMemCreate);
      t.segment(0x5000000, 64 * MiB).alloc(0x5000000, 64 * MiB);
      t.close();
    }
    const Report r = analyze_trace(path.str());
    REQUIRE(r.device_ledger);
    THEN("it is counted once, in reserved, not as memory outside PyTorch") {
      CHECK(r.device_ledger->outside_inside_reserved == 1);
      CHECK(r.device_ledger->groups.empty());
    }
  }
  GIVEN("a CPU trace") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.alloc(0x1000, 64);
      t.close();
    }
    THEN("there is no device ledger") { CHECK_FALSE(analyze_trace(path.str()).device_ledger); }
  }
}

SCENARIO("memory outside PyTorch is exported to memory_viz as segments of its own", "[core][snapshot][device_ledger]") {
  GIVEN("the run of write_nccl_run, exported as a torch memory snapshot") {
    TempPath trace, pickle(".pickle");
    write_nccl_run(trace.str());
    const SnapshotWriteStats stats = write_snapshot(trace.str(), pickle.str());
    std::ifstream f(pickle.str(), std::ios::binary);
    std::ostringstream bytes;
    bytes << f.rdbuf();
    const std::string data = bytes.str();  // the parsed values point into it
    const auto parsed = detail::parse_pickle(data);
    THEN("each allocation outside PyTorch is a segment_alloc and an alloc in the non_pytorch category") {
      CHECK(stats.outside_allocations == 2);
      const auto& entries = parsed.root.get("device_traces")->list()[0].list();
      std::size_t outside_segments = 0, outside_allocs = 0, outside_frees = 0;
      for (const auto& e : entries) {
        const auto* category = e.get("category");
        if (category == nullptr || !category->is_str() || category->str() != "non_pytorch") continue;
        const auto* mark = e.get("ridgescope_outside_pytorch");
        REQUIRE(mark != nullptr);
        CHECK(mark->boolean);
        const std::string_view action = e.get("action")->str();
        outside_segments += action == "segment_alloc";
        outside_allocs += action == "alloc";
        outside_frees += action == "free_completed";
      }
      CHECK(outside_segments == 2);
      CHECK(outside_allocs == 2);
      CHECK(outside_frees == 1);  // cuBLAS's, in the optimizer step
    }
    AND_THEN("the end state holds NCCL's 4 GiB as its own segment, besides PyTorch's") {
      const auto& segments = parsed.root.get("segments")->list();
      REQUIRE(segments.size() == 2);
      std::size_t outside = 0;
      for (const auto& seg : segments) {
        const auto* mark = seg.get("ridgescope_outside_pytorch");
        if (mark == nullptr) continue;
        ++outside;
        std::uint64_t total = 0;
        REQUIRE(seg.get("total_size")->to_uint64(&total));
        CHECK(total == 4096 * MiB);
        const auto& blocks = seg.get("blocks")->list();
        REQUIRE(blocks.size() == 1);
        CHECK(blocks[0].get("category")->str() == "non_pytorch");
      }
      CHECK(outside == 1);
    }
    AND_THEN("reading the export back keeps PyTorch's memory as it was: the outside segments are not reserved bytes") {
      const Report back = analyze_snapshot(pickle.str());
      const Report r = analyze_trace(trace.str());
      CHECK(back.peak.bytes == r.peak.bytes);
      CHECK(back.final_reserved_bytes == r.final_reserved_bytes);
      CHECK(back.final_reserved_bytes == 2048 * MiB);
      REQUIRE(back.snapshot);
      REQUIRE(back.snapshot->devices.size() == 1);
      CHECK(back.snapshot->devices[0].segments == 1);
      for (const std::string& note : back.snapshot->notes) {
        // only the closing snapshot marker is skipped as another kind; the outside entries are not counted
        if (note.find("trace entries of other kinds") != std::string::npos) CHECK(note.rfind("1 trace entries", 0) == 0);
      }
    }
  }
}
