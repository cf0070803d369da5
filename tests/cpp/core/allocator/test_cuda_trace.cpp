// Specification of the CUDA caching-allocator rules (ridgescope/cuda_rounding.h) and of the
// translation of allocator trace entries into events (ridgescope/cuda_trace.h). Runs without a
// GPU and without torch: the entries are what torch's TraceEntry carries, as plain values.
#include <string>
#include <vector>

#include "catch.h"
#include "allocator_workload.h"
#include "ridgescope/cuda_rounding.h"
#include "ridgescope/cuda_trace.h"
#include "ridgescope/allocator_model.h"
#include "ridgescope/analysis.h"
#include "ridgescope/ledger.h"
#include "ridgescope/recorder.h"
#include "ridgescope/report.h"
#include "trace_builder.h"

using namespace ridgescope;

namespace {

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;

CudaRoundingRules divisions_everywhere(std::uint64_t d) {
  CudaRoundingRules r;
  r.roundup_power2_divisions.fill(d);
  return r;
}

CudaTraceEntry entry(CudaTraceAction action, std::uint64_t addr, std::uint64_t size,
                     std::int16_t device = 0, std::uint64_t stream = 7) {
  CudaTraceEntry e;
  e.action = action;
  e.device = device;
  e.addr = addr;
  e.size = size;
  e.stream = stream;
  return e;
}

// Feeds events into a ledger as the analysis does (one device).
void replay(Ledger& ledger, const std::vector<Event>& events) {
  for (const Event& e : events) {
    switch (e.kind) {
      case EventKind::Alloc: {
        LiveBlock b;
        b.bytes = e.bytes;
        b.requested_bytes = e.requested_bytes;
        ledger.on_alloc(e.addr, b);
        break;
      }
      case EventKind::Free: ledger.on_free(e.addr); break;
      case EventKind::SegmentAlloc: ledger.on_segment_alloc(e.addr, e.bytes); break;
      case EventKind::SegmentFree: ledger.on_segment_free(e.addr); break;
      default: break;
    }
  }
}

}  // namespace

SCENARIO("round_size: requests are rounded exactly as torch's caching allocator rounds them",
         "[core][cuda][rounding]") {
  GIVEN("the default settings (no roundup_power2_divisions)") {
    const CudaRoundingRules rules;
    THEN("anything below 512 bytes takes a 512-byte block") {
      CHECK(cuda_round_size(0, rules) == 512);
      CHECK(cuda_round_size(1, rules) == 512);
      CHECK(cuda_round_size(511, rules) == 512);
    }
    THEN("larger requests round up to a multiple of 512 bytes") {
      CHECK(cuda_round_size(512, rules) == 512);
      CHECK(cuda_round_size(513, rules) == 1024);
      CHECK(cuda_round_size(4097, rules) == 4608);
      CHECK(cuda_round_size(1 * MiB + 1, rules) == 1 * MiB + 512);
      CHECK(cuda_round_size(3 * MiB + 1, rules) == 3 * MiB + 512);
    }
    THEN("1 MiB is the largest small-pool block; one more rounded step is large") {
      CHECK(cuda_is_small_pool(cuda_round_size(1 * MiB, rules)));
      CHECK_FALSE(cuda_is_small_pool(cuda_round_size(1 * MiB + 1, rules)));
    }
  }
  GIVEN("roundup_power2_divisions:4 (every interval)") {
    const CudaRoundingRules rules = divisions_everywhere(4);
    THEN("a request above 512 x 4 bytes goes to the next quarter of its power-of-two interval") {
      CHECK(cuda_round_size(4097, rules) == 5120);          // [4096, 8192) in steps of 1024
      CHECK(cuda_round_size(5000, rules) == 5120);
      CHECK(cuda_round_size(3 * MiB + 1, rules) == 3 * MiB + 512 * KiB);  // steps of 512 KiB
      CHECK(cuda_round_size(1 * MiB + 1, rules) == 1 * MiB + 256 * KiB);
    }
    THEN("powers of two and exact division points stay as they are") {
      CHECK(cuda_round_size(8192, rules) == 8192);
      CHECK(cuda_round_size(6144, rules) == 6144);
    }
    THEN("requests up to 512 x 4 bytes keep plain 512-byte rounding") {
      CHECK(cuda_round_size(2048, rules) == 2048);
      CHECK(cuda_round_size(1500, rules) == 1536);  // torch's own example gives 1280 only
                                                   // from roundup_power2_next_division
      CHECK(cuda_roundup_power2_next_division(1200, 4) == 1280);
    }
  }
  GIVEN("roundup_power2_divisions:[2048:8,>:1]-style settings (divisions per interval)") {
    CudaRoundingRules rules;
    rules.roundup_power2_divisions[0] = 8;  // sizes below 2 MiB
    rules.roundup_power2_divisions[1] = 1;  // [2 MiB, 4 MiB): plain rounding
    THEN("each request uses the divisions of its own interval") {
      CHECK(cuda_roundup_divisions(1 * MiB + 1, rules) == 8);
      CHECK(cuda_roundup_divisions(2 * MiB, rules) == 1);
      CHECK(cuda_round_size(1 * MiB + 512 * KiB + 1, rules) == 1 * MiB + 640 * KiB);  // 128 KiB steps
      CHECK(cuda_round_size(2 * MiB + 1, rules) == 2 * MiB + 512);
    }
  }
  GIVEN("a request of 40 GiB with divisions only in the last interval (>= 32 GiB)") {
    CudaRoundingRules rules;
    rules.roundup_power2_divisions[15] = 2;
    THEN("it rounds to the half-interval step above it") {
      CHECK(cuda_round_size(40ull * 1024 * MiB, rules) == 48ull * 1024 * MiB);
    }
  }
}

SCENARIO("should_split: which free blocks are handed out whole", "[core][cuda][rounding]") {
  GIVEN("the default settings") {
    const CudaRoundingRules rules;
    THEN("a large block is split only when more than 1 MiB would remain") {
      CHECK(cuda_block_size(8 * MiB, 10 * MiB, rules) == 8 * MiB);     // 2 MiB remain: split
      CHECK(cuda_block_size(8 * MiB, 9 * MiB, rules) == 9 * MiB);      // 1 MiB remains: whole
      CHECK(cuda_block_size(19 * MiB + 512 * KiB, 20 * MiB, rules) == 20 * MiB);
    }
    THEN("a small block is split whenever 512 bytes or more remain") {
      CHECK(cuda_block_size(1, 2 * MiB, rules) == 512);
      CHECK(cuda_block_size(1 * MiB, 2 * MiB, rules) == 1 * MiB);
    }
    THEN("a free block smaller than the rounded size (inconsistent input) gives the rounded size") {
      CHECK(cuda_block_size(8 * MiB, 4 * MiB, rules) == 8 * MiB);
    }
  }
  GIVEN("max_split_size_mb:8") {
    CudaRoundingRules rules;
    rules.max_split_size = 8 * MiB;
    THEN("a request at or above it takes its free block whole") {
      CHECK(cuda_block_size(8 * MiB, 20 * MiB, rules) == 20 * MiB);
      CHECK(cuda_block_size(6 * MiB, 20 * MiB, rules) == 6 * MiB);
    }
  }
  GIVEN("expandable_segments:True") {
    CudaRoundingRules rules;
    rules.expandable_segments = true;
    THEN("large blocks split like small ones") {
      CHECK(cuda_block_size(8 * MiB, 9 * MiB, rules) == 8 * MiB);
    }
  }
}

SCENARIO("every trace action becomes the right events", "[core][cuda][translation]") {
  GIVEN("a translator with the default settings") {
    CudaTraceTranslator t;
    std::vector<Event> out;
    const std::uint64_t seg = 0x7f0000000000ull;

    WHEN("a 2 MiB small segment is reserved and 1 byte allocated in it") {
      t.translate(entry(CudaTraceAction::SegmentAlloc, seg, 2 * MiB), &out);
      t.translate(entry(CudaTraceAction::Alloc, seg, 1), &out);
      THEN("segment_alloc carries the segment; alloc the 512-byte block and the 1 requested byte") {
        REQUIRE(out.size() == 2);
        CHECK(out[0].kind == EventKind::SegmentAlloc);
        CHECK(out[0].addr == seg);
        CHECK(out[0].bytes == 2 * MiB);
        CHECK(out[0].stream == 7);
        CHECK(out[0].device == Device{DeviceType::CUDA, 0});
        CHECK(out[1].kind == EventKind::Alloc);
        CHECK(out[1].bytes == 512);
        CHECK(out[1].requested_bytes == 1);
        CHECK(t.allocated_bytes(0) == 512);
        CHECK(t.reserved_bytes(0) == 2 * MiB);
      }
      AND_WHEN("it is freed (requested, then completed) and the segment released") {
        out.clear();
        t.translate(entry(CudaTraceAction::FreeRequested, seg, 1), &out);
        const std::size_t after_request = out.size();
        t.translate(entry(CudaTraceAction::FreeCompleted, seg, 1), &out);
        const std::size_t after_complete = out.size();
        t.translate(entry(CudaTraceAction::SegmentFree, seg, 2 * MiB), &out);
        THEN("free_requested is the free (512 bytes), free_completed adds nothing, segment_free releases") {
          REQUIRE(after_request == 1);
          CHECK(out[0].kind == EventKind::Free);
          CHECK(out[0].bytes == 512);
          CHECK(after_complete == 1);
          REQUIRE(out.size() == 2);
          CHECK(out[1].kind == EventKind::SegmentFree);
          CHECK(out[1].bytes == 2 * MiB);
          CHECK(t.allocated_bytes(0) == 0);
          CHECK(t.reserved_bytes(0) == 0);
          CHECK(t.stats().unmatched_frees == 0);
        }
      }
    }

    WHEN("a 20 MiB large segment serves 8 MiB and then 11.5 MiB") {
      t.translate(entry(CudaTraceAction::SegmentAlloc, seg, 20 * MiB), &out);
      t.translate(entry(CudaTraceAction::Alloc, seg, 8 * MiB), &out);
      t.translate(entry(CudaTraceAction::Alloc, seg + 8 * MiB, 11 * MiB + 512 * KiB), &out);
      THEN("the first block is split off (8 MiB); the second takes the 12 MiB left whole") {
        REQUIRE(out.size() == 3);
        CHECK(out[1].bytes == 8 * MiB);
        CHECK(out[2].bytes == 12 * MiB);
        CHECK(out[2].requested_bytes == 11 * MiB + 512 * KiB);
        CHECK(t.allocated_bytes(0) == 20 * MiB);  // what memory_allocated() reports
        CHECK(t.stats().unsplit_blocks == 1);
      }
      AND_WHEN("the second is freed but its free is pending (record_stream) and a 3.5 MiB "
               "request lands in the gap left by freeing a 4 MiB block before it") {
        out.clear();
        // Free the 8 MiB block completely, take 4 MiB at its start, then ask for 3.5 MiB at
        // seg + 4 MiB: its free block runs to the pending 12 MiB block at seg + 8 MiB.
        t.translate(entry(CudaTraceAction::FreeRequested, seg + 8 * MiB, 11 * MiB + 512 * KiB), &out);
        t.translate(entry(CudaTraceAction::FreeRequested, seg, 8 * MiB), &out);
        t.translate(entry(CudaTraceAction::FreeCompleted, seg, 8 * MiB), &out);
        t.translate(entry(CudaTraceAction::Alloc, seg, 4 * MiB), &out);
        t.translate(entry(CudaTraceAction::Alloc, seg + 4 * MiB, 3 * MiB + 512 * KiB), &out);
        THEN("the pending block bounds the free block: 4 MiB handed out whole") {
          REQUIRE(out.size() == 4);
          CHECK(out[0].kind == EventKind::Free);
          CHECK(out[0].bytes == 12 * MiB);
          CHECK(out[2].bytes == 4 * MiB);   // 8 MiB free block: 4 MiB remain, split
          CHECK(out[3].bytes == 4 * MiB);   // 4 MiB free block, 0.5 MiB would remain: whole
          CHECK(t.allocated_bytes(0) == 8 * MiB);
        }
      }
    }

    WHEN("expandable segments map two 20 MiB pages and unmap the middle 20 MiB") {
      const std::uint64_t va = 0x7e0000000000ull;
      t.translate(entry(CudaTraceAction::SegmentMap, va, 20 * MiB), &out);
      t.translate(entry(CudaTraceAction::SegmentMap, va + 20 * MiB, 20 * MiB), &out);
      const std::size_t after_map = out.size();
      t.translate(entry(CudaTraceAction::SegmentUnmap, va + 10 * MiB, 20 * MiB), &out);
      THEN("map is a segment_alloc; unmap frees the ranges it covers and re-adds what stays mapped") {
        REQUIRE(after_map == 2);
        CHECK(out[0].kind == EventKind::SegmentAlloc);
        CHECK(out[1].bytes == 20 * MiB);
        REQUIRE(out.size() == 6);
        CHECK(out[2].kind == EventKind::SegmentFree);
        CHECK(out[2].addr == va);
        CHECK(out[3].kind == EventKind::SegmentAlloc);
        CHECK(out[3].addr == va);
        CHECK(out[3].bytes == 10 * MiB);
        CHECK(out[4].kind == EventKind::SegmentFree);
        CHECK(out[4].addr == va + 20 * MiB);
        CHECK(out[5].kind == EventKind::SegmentAlloc);
        CHECK(out[5].addr == va + 30 * MiB);
        CHECK(out[5].bytes == 10 * MiB);
        CHECK(t.reserved_bytes(0) == 20 * MiB);
        AND_THEN("a ledger replaying the events reserves exactly what stays mapped") {
          Ledger ledger;
          replay(ledger, out);
          CHECK(ledger.reserved_bytes() == 20 * MiB);
          CHECK(ledger.anomalies().unknown_segment_frees == 0);
        }
      }
    }

    WHEN("an allocation fails (oom), a snapshot is taken and an unknown action arrives") {
      t.translate(entry(CudaTraceAction::Oom, /*device free*/ 123 * MiB, /*request*/ 2 * 1024 * MiB), &out);
      t.translate(entry(CudaTraceAction::Snapshot, 0, 0), &out);
      t.translate(entry(CudaTraceAction::Unknown, 0x1000, 512), &out);
      THEN("oom carries the request and the device's free bytes; the others only count") {
        REQUIRE(out.size() == 1);
        CHECK(out[0].kind == EventKind::Oom);
        CHECK(out[0].bytes == 2 * 1024 * MiB);
        CHECK(out[0].value == 123 * MiB);
        CHECK(t.stats().snapshots == 1);
        CHECK(t.stats().unknown_actions == 1);
        CHECK(t.stats().entries == 3);
      }
    }

    WHEN("entries arrive for two devices") {
      t.translate(entry(CudaTraceAction::SegmentAlloc, seg, 2 * MiB, 0), &out);
      t.translate(entry(CudaTraceAction::SegmentAlloc, seg, 20 * MiB, 1), &out);
      t.translate(entry(CudaTraceAction::Alloc, seg, 1000, 1), &out);
      THEN("each device keeps its own totals and events name their device") {
        CHECK(t.reserved_bytes(0) == 2 * MiB);
        CHECK(t.reserved_bytes(1) == 20 * MiB);
        CHECK(t.allocated_bytes(1) == 1024);
        CHECK(out[2].device == Device{DeviceType::CUDA, 1});
      }
    }

    WHEN("a free arrives for an address the model never saw") {
      t.translate(entry(CudaTraceAction::FreeRequested, 0xdead000, 1000), &out);
      THEN("it is still a free (the ledger counts it as unknown) and it is counted here") {
        REQUIRE(out.size() == 1);
        CHECK(out[0].bytes == 1024);
        CHECK(t.stats().unmatched_frees == 1);
      }
    }
  }
}

SCENARIO("state adopted from a snapshot starts the ledger right", "[core][cuda][translation]") {
  GIVEN("a snapshot with a 20 MiB segment holding an allocated 12 MiB block and a pending 2 MiB block") {
    CudaTraceTranslator t;
    std::vector<Event> out;
    const std::uint64_t seg = 0x7f0000000000ull;
    t.adopt_segment(0, seg, 20 * MiB, 7, false, &out);
    t.adopt_block(0, seg, 12 * MiB, 11 * MiB, true, 7, &out);
    t.adopt_block(0, seg + 12 * MiB, 2 * MiB, 2 * MiB, false, 7, &out);
    THEN("a segment_alloc and one alloc (the allocated block) are emitted") {
      REQUIRE(out.size() == 2);
      CHECK(out[0].kind == EventKind::SegmentAlloc);
      CHECK(out[1].kind == EventKind::Alloc);
      CHECK(out[1].bytes == 12 * MiB);
      CHECK(out[1].requested_bytes == 11 * MiB);
      CHECK(t.allocated_bytes(0) == 12 * MiB);
    }
    WHEN("a 5.5 MiB request lands after the pending block") {
      out.clear();
      t.translate(entry(CudaTraceAction::Alloc, seg + 14 * MiB, 5 * MiB + 512 * KiB), &out);
      THEN("it takes the 6 MiB up to the segment's end whole") {
        REQUIRE(out.size() == 1);
        CHECK(out[0].bytes == 6 * MiB);
      }
      AND_WHEN("the pending block's free completes and its space is taken by 1.5 MiB") {
        out.clear();
        t.translate(entry(CudaTraceAction::FreeCompleted, seg + 12 * MiB, 2 * MiB), &out);
        t.translate(entry(CudaTraceAction::Alloc, seg + 12 * MiB, 1 * MiB + 512 * KiB), &out);
        THEN("no free event for the completion (the free was before the snapshot); 2 MiB whole") {
          REQUIRE(out.size() == 1);
          CHECK(out[0].kind == EventKind::Alloc);
          CHECK(out[0].bytes == 2 * MiB);
          CHECK(t.allocated_bytes(0) == 20 * MiB);
        }
      }
    }
  }
}

SCENARIO("a block's serial tells a reused address from the same allocation",
         "[core][cuda][translation]") {
  GIVEN("a 2 MiB segment with an adopted 512-byte block, then a translated one on device 1") {
    CudaTraceTranslator t;
    std::vector<Event> out;
    const std::uint64_t seg = 0x7f0000000000ull;
    t.adopt_segment(0, seg, 2 * MiB, 7, false, &out);
    t.adopt_block(0, seg, 512, 512, true, 7, &out);
    t.adopt_block(0, seg + 512, 512, 512, false, 7, &out);  // freed, its free not completed
    t.translate(entry(CudaTraceAction::SegmentAlloc, seg, 2 * MiB, 1), &out);
    t.translate(entry(CudaTraceAction::Alloc, seg, 1024, 1), &out);
    const std::uint64_t adopted = t.block_serial(0, seg);
    const std::uint64_t translated = t.block_serial(1, seg);
    THEN("each allocated block has its own non-zero serial; a pending or absent one has none") {
      CHECK(adopted != 0);
      CHECK(translated != 0);
      CHECK(adopted != translated);
      CHECK(t.block_serial(0, seg + 512) == 0);
      CHECK(t.block_serial(0, seg + 1024) == 0);
      CHECK(t.block_serial(5, seg) == 0);  // a device never seen
    }
    WHEN("the adopted block is freed and a new one allocated at the same address") {
      t.translate(entry(CudaTraceAction::FreeRequested, seg, 512), &out);
      THEN("between the request and the completion it has no serial") {
        CHECK(t.block_serial(0, seg) == 0);
      }
      t.translate(entry(CudaTraceAction::FreeCompleted, seg, 512), &out);
      t.translate(entry(CudaTraceAction::Alloc, seg, 512), &out);
      THEN("the new allocation has a serial of its own, and the other device's is unchanged") {
        CHECK(t.block_serial(0, seg) != 0);
        CHECK(t.block_serial(0, seg) != adopted);
        CHECK(t.block_serial(0, seg) != translated);
        CHECK(t.block_serial(1, seg) == translated);
      }
    }
    WHEN("an alloc arrives for an address the model still holds (a missed free)") {
      t.translate(entry(CudaTraceAction::Alloc, seg, 512), &out);
      THEN("the replacing block is a new allocation") {
        CHECK(t.block_serial(0, seg) != 0);
        CHECK(t.block_serial(0, seg) != adopted);
      }
    }
  }
}

SCENARIO("the analysis checks a CUDA trace's ledger against the allocator's own figures",
         "[core][cuda][analysis]") {
  GIVEN("a translated trace: a 20 MiB segment, a 19.5 MiB request (a 20 MiB block), and the "
        "allocated and reserved bytes torch reports at that moment (20 MiB each)") {
    testing::TempPath path;
    {
      Recorder recorder(path.str());
      CudaTraceTranslator t;
      std::vector<Event> out;
      const std::uint64_t seg = 0x7f0000000000ull;
      t.translate(entry(CudaTraceAction::SegmentAlloc, seg, 20 * MiB), &out);
      t.translate(entry(CudaTraceAction::Alloc, seg, 19 * MiB + 512 * KiB), &out);
      for (const Event& e : out) recorder.record(e);
      Event sample;
      sample.kind = EventKind::Sample;
      sample.device = Device{DeviceType::CUDA, 0};
      sample.string_id = recorder.intern("allocator_live_bytes");
      sample.value = 20 * MiB;  // torch.cuda.memory_allocated()
      recorder.record(sample);
      sample.string_id = recorder.intern("allocator_reserved_bytes");
      sample.value = 20 * MiB;  // torch.cuda.memory_reserved()
      recorder.record(sample);
      sample.value = 22 * MiB;  // a reserved reading the ledger does not explain
      recorder.record(sample);
      recorder.close();
    }
    WHEN("it is analysed") {
      const Report r = analyze_trace(path.str());
      THEN("the peak is the block's size, and of three readings only the wrong one mismatches") {
        CHECK(r.device == Device{DeviceType::CUDA, 0});
        CHECK(r.peak.bytes == 20 * MiB);
        CHECK(r.peak.reserved_bytes == 20 * MiB);
        CHECK(r.consistency.samples == 3);
        CHECK(r.consistency.mismatches == 1);
        CHECK(r.consistency.first_difference_bytes == -static_cast<std::int64_t>(2 * MiB));
      }
    }
  }
}

namespace {

// Drives ridgescope's allocator model (a simulation of torch's allocator, written separately
// from the translator) with a fixed pseudo-random workload, feeds what torch's trace would
// carry for it (segment entries, then alloc with the requested size; free_requested and
// free_completed) into the translator, and returns the first disagreement ("" if none).
std::string cross_check_with_allocator_model(const AllocatorSettings& settings, int operations) {
  AllocatorModel model(settings);
  CudaTraceTranslator t(allocator_rounding_rules(settings));
  std::vector<Event> out;
  std::uint64_t unmaps = 0;
  testing::AllocatorWorkloadCallbacks cb;
  cb.segment = [&](const AllocatorSegmentEvent& s) {
    CudaTraceAction a = CudaTraceAction::SegmentAlloc;
    switch (s.kind) {
      case AllocatorSegmentEvent::Kind::Alloc: a = CudaTraceAction::SegmentAlloc; break;
      case AllocatorSegmentEvent::Kind::Free: a = CudaTraceAction::SegmentFree; break;
      case AllocatorSegmentEvent::Kind::Map: a = CudaTraceAction::SegmentMap; break;
      case AllocatorSegmentEvent::Kind::Unmap: a = CudaTraceAction::SegmentUnmap; ++unmaps; break;
    }
    t.translate(entry(a, s.address, s.bytes, 0, s.stream), &out);
    return std::string();
  };
  cb.alloc = [&](int op, std::uint64_t bytes, const MallocResult& m) {
    t.translate(entry(CudaTraceAction::Alloc, m.address, bytes), &out);
    const std::uint64_t ours = t.block_bytes(0, m.address);
    if (ours == m.block_bytes) return std::string();
    return "op " + std::to_string(op) + ": request " + std::to_string(bytes) + " B: model block " +
           std::to_string(m.block_bytes) + " B, translator " + std::to_string(ours) + " B";
  };
  cb.free = [&](int, const AllocatorBlockInfo& b) {
    t.translate(entry(CudaTraceAction::FreeRequested, b.address, b.requested_bytes), &out);
    t.translate(entry(CudaTraceAction::FreeCompleted, b.address, b.requested_bytes), &out);
    return std::string();
  };
  cb.after = [&](int op) {
    if (t.allocated_bytes(0) == model.allocated_bytes() && t.reserved_bytes(0) == model.reserved_bytes()) {
      return std::string();
    }
    return "op " + std::to_string(op) + ": allocated " + std::to_string(t.allocated_bytes(0)) + " vs " +
           std::to_string(model.allocated_bytes()) + ", reserved " + std::to_string(t.reserved_bytes(0)) +
           " vs " + std::to_string(model.reserved_bytes());
  };
  if (std::string m = testing::run_allocator_workload(model, operations, 0x9e3779b97f4a7c15ull, cb); !m.empty()) {
    return m;
  }
  if (t.stats().unmatched_frees != 0 || t.stats().unmatched_segment_frees != 0) return "unmatched entries";
  // The workload must exercise what is hard: whole (unsplit) large blocks, or unmapping.
  if (!settings.expandable_segments && t.stats().unsplit_blocks == 0) return "no unsplit block was exercised";
  if (settings.expandable_segments && unmaps == 0) return "no unmap was exercised";
  return "";
}

}  // namespace

SCENARIO("the translator's block sizes agree with the allocator model on a long random workload",
         "[core][cuda][translation][model]") {
  GIVEN("5000 mallocs, frees and empty_cache calls of 1 B to 200 MiB") {
    THEN("with the default settings, every block size and the totals agree after every step") {
      CHECK(cross_check_with_allocator_model(AllocatorSettings{}, 5000) == "");
    }
    THEN("with max_split_size_mb:64 (oversize blocks handed out whole)") {
      AllocatorSettings s;
      s.max_split_size_bytes = 64 * MiB;
      CHECK(cross_check_with_allocator_model(s, 5000) == "");
    }
    THEN("with roundup_power2_divisions:4") {
      AllocatorSettings s;
      s.roundup_power2_divisions.fill(4);
      CHECK(cross_check_with_allocator_model(s, 5000) == "");
    }
    THEN("with expandable_segments:True (map and unmap)") {
      AllocatorSettings s;
      s.expandable_segments = true;
      CHECK(cross_check_with_allocator_model(s, 5000) == "");
    }
  }
}
