// bench_cuda_trace.cpp — the per-entry cost of the CUDA caching-allocator source on the CPU
// (docs/performance.md "CUDA source: cost per trace entry"). Torch calls the source's static
// trampoline (csrc/torch/cuda_allocator_source.cpp) for every trace entry, on the allocating
// thread, under its device lock; in a live session the trampoline copies the entry's fields,
// takes its own leaf mutex, runs CudaTraceTranslator::translate() (csrc/core/allocator/cuda_trace.cpp) into
// a reused event buffer and hands each event to Recorder::record(). This benchmark runs that same
// sequence, minus torch, over a pre-generated stream of entries from a GPT-like training step.
//
// Build and run (from the repository root; no torch, no GPU, no Python):
//   cmake -S . -B build/bench -DRIDGESCOPE_BUILD_TORCH=OFF -DRIDGESCOPE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release -G Ninja && cmake --build build/bench --target ridgescope_bench_cuda_trace && build/bench/benchmarks/cpp/ridgescope_bench_cuda_trace
//
// Flags (all optional):
//   --steps N          replays of the recorded step per repetition (default 200)
//   --repetitions R    timed repetitions; the median is reported (default 7)
//   --layers L         transformer layers of the synthetic step (default 8)
//
// The stream: torch's allocator, as AllocatorModel (ridgescope/allocator_model.h) models it with
// its default settings, serving a GPT-like step: persistent blocks (parameters, gradients, AdamW
// state) allocated once; then per layer in forward 12 activations kept for backward and 12
// temporaries freed at once; per layer in backward 12 gradient temporaries and the layer's
// activations freed in reverse. Sizes: a fixed per-layer list from 4 KiB to 48 MiB (half
// small-pool, half large-pool blocks, so the large-block search in the translator is exercised).
// A free is torch's free_requested followed by free_completed (no record_stream). The second
// step (steady state: every segment already reserved) is recorded and replayed; it leaves the
// allocator as it found it, so replaying it keeps the translator's model consistent.
//
// Measurements (ns per trace entry, and per allocation = alloc + free_requested +
// free_completed):
//   translate   CudaTraceTranslator::translate() alone, into a reused buffer
//   record      Recorder::record() of the translated events alone (clock, lock, encode); this
//               one is ns per recorded event (a free_completed records none)
//   trampoline  what the trampoline does per entry in a live session: copy the fields, take a
//               std::mutex, clear the buffer, translate, record every event
// Output: ONE JSON object on stdout; a checksum keeps the work live.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench_support.h"
#include "ridgescope/allocator_model.h"
#include "ridgescope/cuda_trace.h"
#include "ridgescope/recorder.h"

namespace {

using ridgescope::CudaTraceAction;
using ridgescope::CudaTraceEntry;
using ridgescope::Event;
using ridgescope::bench::Clock;
using ridgescope::bench::median;

constexpr int kOutputSchemaVersion = 1;
constexpr std::uint64_t kStream = 7;

// The fields torch's TraceEntry carries besides the ones the adapter reads, laid out as a
// stand-in so the "copy the fields" step reads a struct of a realistic size.
struct FakeTorchEntry {
  int action;
  std::int8_t device;
  std::uint64_t addr;
  void* context;
  void* stream;
  std::uint64_t size;
  std::uint64_t mempool[2];
  std::uint64_t time;
};

struct Stream {
  std::vector<CudaTraceEntry> prologue;  // segments and persistent blocks, translated once
  std::vector<CudaTraceEntry> step;      // one steady-state step, replayed
  std::uint64_t step_allocations = 0;
  std::uint64_t segments = 0;
  std::uint64_t live_blocks_max = 0;
};

class Generator {
 public:
  explicit Generator(Stream* out) : out_(out) { model_.record_segment_events(true); }

  std::uint64_t alloc(std::uint64_t bytes, std::vector<CudaTraceEntry>* to) {
    const std::uint64_t id = next_id_++;
    const std::size_t seen = model_.segment_events().size();
    const ridgescope::MallocResult r = model_.malloc(id, bytes, kStream);
    if (!r.ok()) {
      std::fprintf(stderr, "allocator model refused a request\n");
      std::exit(1);
    }
    const auto& segs = model_.segment_events();
    for (std::size_t i = seen; i < segs.size(); ++i) {
      CudaTraceEntry e;
      e.action = CudaTraceAction::SegmentAlloc;
      e.addr = segs[i].address;
      e.size = segs[i].bytes;
      e.stream = kStream;
      to->push_back(e);
      ++out_->segments;
    }
    CudaTraceEntry e;
    e.action = CudaTraceAction::Alloc;
    e.addr = r.address;
    e.size = bytes;
    e.stream = kStream;
    to->push_back(e);
    live_.push_back({id, r.address, bytes});
    out_->live_blocks_max = std::max<std::uint64_t>(out_->live_blocks_max, live_.size());
    return id;
  }

  void free(std::uint64_t id, std::vector<CudaTraceEntry>* to) {
    auto it = std::find_if(live_.begin(), live_.end(), [id](const Live& l) { return l.id == id; });
    CudaTraceEntry e;
    e.addr = it->addr;
    e.size = it->bytes;
    e.stream = kStream;
    e.action = CudaTraceAction::FreeRequested;
    to->push_back(e);
    e.action = CudaTraceAction::FreeCompleted;
    to->push_back(e);
    model_.free(id);
    live_.erase(it);
  }

 private:
  struct Live {
    std::uint64_t id, addr, bytes;
  };
  ridgescope::AllocatorModel model_;
  Stream* out_;
  std::uint64_t next_id_ = 1;
  std::vector<Live> live_;
};

Stream make_stream(int layers) {
  Stream s;
  Generator g(&s);
  // Per-layer block sizes: 4 KiB .. 48 MiB, alternating small and large pools.
  const std::uint64_t KiB = 1024, MiB = 1024 * KiB;
  const std::uint64_t sizes[12] = {4 * KiB,  48 * MiB, 96 * KiB, 12 * MiB, 600 * KiB, 3 * MiB,
                                   1 * KiB,  24 * MiB, 256 * KiB, 6 * MiB, 768 * KiB, 2 * MiB};
  // Persistent: per layer 4 weights, each with a gradient and two AdamW moments.
  for (int l = 0; l < layers; ++l) {
    for (int k = 0; k < 4 * 4; ++k) g.alloc(sizes[(k * 5) % 12] / 2 + 512, &s.prologue);
  }
  for (int step = 0; step < 2; ++step) {
    std::vector<CudaTraceEntry>* to = step == 0 ? &s.prologue : &s.step;
    std::uint64_t allocs = 0;
    std::vector<std::vector<std::uint64_t>> kept(static_cast<std::size_t>(layers));
    for (int l = 0; l < layers; ++l) {
      for (int k = 0; k < 12; ++k) {
        kept[l].push_back(g.alloc(sizes[k], to));
        const std::uint64_t t = g.alloc(sizes[(k + 3) % 12], to);
        g.free(t, to);
        allocs += 2;
      }
    }
    for (int l = layers - 1; l >= 0; --l) {
      for (int k = 0; k < 12; ++k) {
        const std::uint64_t t = g.alloc(sizes[(k + 7) % 12], to);
        g.free(t, to);
        ++allocs;
      }
      for (auto it = kept[l].rbegin(); it != kept[l].rend(); ++it) g.free(*it, to);
    }
    if (step == 1) s.step_allocations = allocs;
  }
  return s;
}

template <typename T>
inline void keep(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

struct Figure {
  double median_ns = 0, min_ns = 0;
};

Figure summarise(const std::vector<double>& per_entry) {
  return {median(per_entry), *std::min_element(per_entry.begin(), per_entry.end())};
}

std::string temp_trace_path() {
  return "/tmp/ridgescope-bench-cuda-trace-" + std::to_string(::getpid()) + ".rstrace";
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, reps = 7, layers = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](int* out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      *out = std::atoi(argv[++i]);
      if (*out <= 0) {
        std::fprintf(stderr, "%s must be a positive integer\n", a.c_str());
        std::exit(2);
      }
    };
    if (a == "--steps") value(&steps);
    else if (a == "--repetitions") value(&reps);
    else if (a == "--layers") value(&layers);
    else {
      std::fprintf(stderr, "unknown flag %s (see the comment at the top of the file)\n", a.c_str());
      return 2;
    }
  }

  const Stream stream = make_stream(layers);
  const std::uint64_t entries_per_rep = stream.step.size() * static_cast<std::uint64_t>(steps);
  std::uint64_t checksum = 0;

  // The same entries as torch would hand them over, for the trampoline's field copy.
  std::vector<FakeTorchEntry> torch_entries;
  for (const CudaTraceEntry& e : stream.step) {
    FakeTorchEntry t{};
    t.action = static_cast<int>(e.action);
    t.addr = e.addr;
    t.size = e.size;
    t.stream = reinterpret_cast<void*>(static_cast<std::uintptr_t>(e.stream));
    torch_entries.push_back(t);
  }

  std::vector<double> translate_ns, record_ns, trampoline_ns;
  std::uint64_t events_per_step = 0;
  const std::string path = temp_trace_path();
  for (int r = 0; r < reps; ++r) {
    // translate alone
    {
      ridgescope::CudaTraceTranslator tr;
      std::vector<Event> events;
      events.reserve(64);
      for (const auto& e : stream.prologue) tr.translate(e, &events);
      events.clear();
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) {
        for (const CudaTraceEntry& e : stream.step) {
          events.clear();
          tr.translate(e, &events);
          checksum += events.size();
        }
      }
      const auto t1 = Clock::now();
      translate_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                             static_cast<double>(entries_per_rep));
      if (tr.stats().unmatched_frees != 0 || tr.stats().internal_errors != 0) {
        std::fprintf(stderr, "the stream is inconsistent: %llu unmatched frees\n",
                     static_cast<unsigned long long>(tr.stats().unmatched_frees));
        return 1;
      }
    }
    // The step's translated events, for the record-only measurement.
    std::vector<Event> step_events;
    {
      ridgescope::CudaTraceTranslator tr;
      std::vector<Event> scratch;
      for (const auto& e : stream.prologue) tr.translate(e, &scratch);
      for (const auto& e : stream.step) tr.translate(e, &step_events);
      events_per_step = step_events.size();
    }
    // record alone
    {
      ridgescope::Recorder rec(path);
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) {
        for (const Event& e : step_events) rec.record(e);
      }
      const auto t1 = Clock::now();
      record_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                          static_cast<double>(step_events.size() * static_cast<std::uint64_t>(steps)));
      checksum += rec.stats().events;
      rec.close();
    }
    // the trampoline's sequence
    {
      ridgescope::Recorder rec(path);
      ridgescope::CudaTraceTranslator tr;
      std::mutex mutex;
      std::vector<Event> events;
      events.reserve(64);
      for (const auto& e : stream.prologue) tr.translate(e, &events);
      events.clear();
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) {
        for (const FakeTorchEntry& te : torch_entries) {
          CudaTraceEntry e;  // adapt(): the field copy
          e.action = static_cast<CudaTraceAction>(te.action);
          e.device = te.device;
          e.addr = te.addr;
          e.size = te.size;
          e.stream = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(te.stream));
          std::lock_guard<std::mutex> lock(mutex);
          events.clear();
          tr.translate(e, &events);
          for (const Event& ev : events) rec.record(ev);
        }
      }
      const auto t1 = Clock::now();
      trampoline_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                              static_cast<double>(entries_per_rep));
      checksum += rec.stats().events;
      rec.close();
      keep(checksum);
    }
  }
  std::remove(path.c_str());

  const Figure tr = summarise(translate_ns), rc = summarise(record_ns), tp = summarise(trampoline_ns);
  const double entries_per_alloc =
      static_cast<double>(stream.step.size()) / static_cast<double>(stream.step_allocations);
  std::printf(
      "{\n"
      "  \"schema_version\": %d,\n"
      "  \"benchmark\": \"cuda_trace\",\n"
      "  \"compiler\": \"%s\",\n"
      "  \"build_type\": \"%s\",\n"
      "  \"config\": {\"layers\": %d, \"steps_per_repetition\": %d, \"repetitions\": %d},\n"
      "  \"stream\": {\"entries_per_step\": %zu, \"allocations_per_step\": %llu, "
      "\"events_per_step\": %llu, \"segments\": %llu, \"live_blocks_max\": %llu, "
      "\"entries_per_allocation\": %.3f},\n"
      "  \"ns_per_entry\": {\n"
      "    \"translate\": {\"median\": %.1f, \"min\": %.1f},\n"
      "    \"trampoline\": {\"median\": %.1f, \"min\": %.1f}\n"
      "  },\n"
      "  \"ns_per_event\": {\"record\": {\"median\": %.1f, \"min\": %.1f}},\n"
      "  \"ns_per_allocation\": {\"trampoline\": %.1f},\n"
      "  \"checksum\": %llu\n"
      "}\n",
      kOutputSchemaVersion, RIDGESCOPE_BENCH_COMPILER, RIDGESCOPE_BENCH_BUILD_TYPE, layers, steps,
      reps, stream.step.size(), static_cast<unsigned long long>(stream.step_allocations),
      static_cast<unsigned long long>(events_per_step),
      static_cast<unsigned long long>(stream.segments),
      static_cast<unsigned long long>(stream.live_blocks_max), entries_per_alloc, tr.median_ns,
      tr.min_ns, tp.median_ns, tp.min_ns, rc.median_ns, rc.min_ns, tp.median_ns * entries_per_alloc,
      static_cast<unsigned long long>(checksum));
  return 0;
}
