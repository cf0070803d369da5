// bench_flight_sink.cpp — the trace writer's cost per event (docs/performance.md "The writer's
// cost per event"). In a session the Recorder's writer thread hands every chunk to the flight
// recorder's sink (ridgescope/flight.h), which decodes it record by record, summarises every step,
// learns the blocks' lifetimes, checkpoints the ledger at each step and writes the chunk. On a
// 2-core machine that thread shares the cores with torch's, so its CPU time is the step's.
//
// Build and run (from the repository root; no torch, no Python):
//   cmake -S . -B build/bench -DRIDGESCOPE_BUILD_TORCH=OFF -DRIDGESCOPE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release -G Ninja && cmake --build build/bench --target ridgescope_bench_flight_sink && build/bench/benchmarks/cpp/ridgescope_bench_flight_sink
//
// Flags (all optional):
//   --steps N          training steps in the stream (default 400)
//   --repetitions R    timed repetitions; the median is reported (default 7)
//   --dir PATH         where the sinks write their traces (default: /tmp)
//
// The stream: a CPU training step shaped like the TinyGPT step of bench_training_step.py (3
// layers, AdamW; per step about 710 allocations, 690 frees, 60 tags, 35 samples and 8 phase
// records, the counts `ridgescope run` records there): 41 parameters tagged once; per step
// zero_grad (the gradients freed), a forward that keeps 30 activations a layer for backward and
// frees 40 temporaries, a backward that frees them in reverse and makes the gradients and 60
// temporaries a layer, and an optimizer step with 6 temporaries a parameter (AdamW's single-
// tensor path) and, in the first step, two state blocks a parameter. The saved-tensor hook's weak
// tags come in the first two steps only, as in a default session. Addresses are reused last
// freed first, as malloc reuses them. The stream is recorded once through a Recorder into a sink
// that keeps its payloads; each repetition then hands those payloads to a new sink on this
// thread and is timed:
//
//   flight_bounded   make_flight_sink with keep_steps 20, keep_first_steps 2 (the default)
//   flight_full      make_flight_sink with keep_steps 0 (`--keep-steps all`)
//   file             make_file_sink: the chunk written, nothing decoded (the floor)
//
// and, on the recording side, `record`: Recorder::record() of the stream's events on this thread
// (clock, lock, encode) into a sink that drops the payloads. Output: ONE JSON object on stdout
// with ns per event and µs per step for each.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unistd.h>
#include <unordered_map>
#include <vector>

#include "bench_support.h"
#include "ridgescope/chunk_sink.h"
#include "ridgescope/flight.h"
#include "ridgescope/recorder.h"

namespace {

using ridgescope::Category;
using ridgescope::Device;
using ridgescope::DeviceType;
using ridgescope::Event;
using ridgescope::EventKind;
using ridgescope::bench::Clock;

constexpr int kLayers = 3;
constexpr int kParams = 41;

// Keeps every payload it is handed (or none), as a sink would receive them.
class CaptureSink final : public ridgescope::ChunkSink {
 public:
  CaptureSink(std::vector<std::pair<std::string, std::uint32_t>>* out) : out_(out) {}
  const std::string& path() const noexcept override { return path_; }
  bool write_chunk(std::string_view payload, std::uint32_t records) noexcept override {
    if (out_ != nullptr) out_->emplace_back(std::string(payload), records);
    return true;
  }
  bool close() noexcept override { return true; }
  std::string error() const override { return {}; }
  ridgescope::ChunkSinkStats stats() const noexcept override { return {}; }

 private:
  std::vector<std::pair<std::string, std::uint32_t>>* out_;
  std::string path_ = "(memory)";
};

// The stream's events, in order, with what they need interned first.
struct Stream {
  std::vector<Event> events;
  std::uint64_t steps = 0;
};

class Generator {
 public:
  Generator(ridgescope::Recorder* r, Stream* out) : r_(r), out_(out) {
    for (const char* p : {"forward", "backward", "optimizer_step", "zero_grad"}) phases_.push_back(r_->intern(p));
    sample_ = r_->intern("cpu.allocated");
    for (int m = 0; m < 4 * kLayers; ++m) modules_.push_back(r_->intern("layers." + std::to_string(m / 4) + ".m" + std::to_string(m % 4)));
    for (int m = 0; m < 4 * kLayers; ++m) savers_.push_back(r_->intern("activation saved in layers." + std::to_string(m / 4) + ".m" + std::to_string(m % 4)));
    const std::uint32_t file = r_->intern("train.py");
    for (int s = 0; s < 48; ++s) {
      ridgescope::FrameRecord f;
      f.kind = ridgescope::FrameKind::Python;
      f.file_id = file;
      f.line = 10 + static_cast<std::uint64_t>(s);
      f.function_id = file;
      const std::uint32_t frame = r_->intern_frame(f);
      stacks_.push_back(r_->intern_stack(&frame, 1, 0));
    }
    for (int p = 0; p < kParams; ++p) {
      const std::uint64_t bytes = p % 4 == 0 ? 262144 : p % 4 == 1 ? 65536 : 512;
      params_.push_back(alloc(bytes, 0, 0));
      tag(params_.back(), Category::Parameter, r_->intern("layers.p" + std::to_string(p)), 0);
    }
  }

  void step(std::uint64_t s) {
    phase(3, true);  // zero_grad: the last step's gradients go
    for (std::uint64_t g : grads_) free(g);
    grads_.clear();
    phase(3, false);
    phase(0, true);
    std::vector<std::uint64_t> kept;
    for (int l = 0; l < kLayers; ++l) {
      for (int i = 0; i < 70; ++i) {
        const int m = 4 * l + i % 4;
        const std::uint64_t a = alloc(i % 3 == 0 ? 131072 : 16384 + 64 * static_cast<std::uint64_t>(i), modules_[m], stacks_[i % 24]);
        if (i % 7 < 3) {
          kept.push_back(a);
          if (s < 2) tag(a, Category::Activation, savers_[m], ridgescope::kTagWeak);
        } else {
          free(a);
        }
        if (i % 6 == 0) sample();
      }
    }
    phase(0, false);
    phase(1, true);
    for (int l = kLayers - 1; l >= 0; --l) {
      for (int i = 0; i < 60; ++i) {
        const std::uint64_t t = alloc(8192 + 128 * static_cast<std::uint64_t>(i), modules_[4 * l + i % 4], stacks_[24 + i % 16]);
        free(t);
        if (i % 2 == 0 && !kept.empty()) {
          free(kept.back());
          kept.pop_back();
        }
        if (i % 10 == 0) sample();
      }
    }
    while (!kept.empty()) {
      free(kept.back());
      kept.pop_back();
    }
    for (int p = 0; p < kParams; ++p) {
      grads_.push_back(alloc(bytes_[params_[static_cast<std::size_t>(p)]], 0, stacks_[40]));
      tag(grads_.back(), Category::Gradient, 0, 0);
    }
    phase(1, false);
    phase(2, true);
    for (int p = 0; p < kParams; ++p) {
      if (state_.size() < 2 * kParams) {
        for (int k = 0; k < 2; ++k) {
          state_.push_back(alloc(bytes_[params_[static_cast<std::size_t>(p)]], 0, stacks_[41]));
          tag(state_.back(), Category::OptimizerState, 0, 0);
        }
      }
      for (int k = 0; k < 6; ++k) free(alloc(bytes_[params_[static_cast<std::size_t>(p)]], 0, stacks_[42 + k]));
    }
    phase(2, false);
    Event e;
    e.kind = EventKind::Step;
    e.value = s;
    out_->events.push_back(e);
    ++out_->steps;
  }

 private:
  std::uint64_t alloc(std::uint64_t bytes, std::uint32_t context, std::uint32_t stack) {
    std::uint64_t addr;
    auto& reuse = free_[bytes];
    if (!reuse.empty()) {
      addr = reuse.back();
      reuse.pop_back();
    } else {
      addr = next_addr_;
      next_addr_ += (bytes + 63) / 64 * 64 + 64;
    }
    Event e;
    e.kind = EventKind::Alloc;
    e.device = kCpu;
    e.addr = addr;
    e.bytes = e.requested_bytes = bytes;
    e.string_id = context;
    e.stack_id = stack;
    out_->events.push_back(e);
    bytes_[addr] = bytes;
    return addr;
  }
  void free(std::uint64_t addr) {
    Event e;
    e.kind = EventKind::Free;
    e.device = kCpu;
    e.addr = addr;
    e.bytes = bytes_[addr];
    out_->events.push_back(e);
    free_[e.bytes].push_back(addr);
  }
  void tag(std::uint64_t addr, Category c, std::uint32_t label, std::uint8_t flags) {
    Event e;
    e.kind = EventKind::Tag;
    e.device = kCpu;
    e.addr = addr;
    e.category = c;
    e.string_id = label;
    e.flags = flags;
    out_->events.push_back(e);
  }
  void phase(int which, bool begin) {
    Event e;
    e.kind = begin ? EventKind::PhaseBegin : EventKind::PhaseEnd;
    e.string_id = phases_[static_cast<std::size_t>(which)];
    out_->events.push_back(e);
  }
  void sample() {
    Event e;
    e.kind = EventKind::Sample;
    e.device = kCpu;
    e.string_id = sample_;
    e.value = ++samples_ * 4096;
    out_->events.push_back(e);
  }

  static constexpr Device kCpu{DeviceType::CPU, -1};
  ridgescope::Recorder* r_;
  Stream* out_;
  std::vector<std::uint32_t> phases_, modules_, savers_, stacks_;
  std::uint32_t sample_ = 0;
  std::uint64_t samples_ = 0;
  std::vector<std::uint64_t> params_, grads_, state_;
  std::uint64_t next_addr_ = 0x10000000;
  std::unordered_map<std::uint64_t, std::uint64_t> bytes_;
  std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> free_;
};

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t steps = 400;
  int repetitions = 7;
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--repetitions")) repetitions = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (steps < 30 || repetitions < 1) {
    std::fprintf(stderr, "--steps must be at least 30 and --repetitions at least 1\n");
    return 2;
  }

  // The stream, recorded once: its definitions through the recorder, its events into a list.
  std::vector<std::pair<std::string, std::uint32_t>> payloads;
  Stream stream;
  double record_ns = 0;
  {
    ridgescope::RecorderOptions options;
    auto recorder = std::make_unique<ridgescope::Recorder>(std::make_unique<CaptureSink>(&payloads), options);
    Generator gen(recorder.get(), &stream);
    for (std::uint64_t s = 0; s < steps; ++s) gen.step(s);
    for (const Event& e : stream.events) recorder->record(e);
    recorder->close();
    // Recording alone, into a sink that keeps nothing (the writer thread idles meanwhile).
    std::vector<double> per_event;
    for (int rep = 0; rep < repetitions; ++rep) {
      ridgescope::Recorder drop(std::make_unique<CaptureSink>(nullptr), options);
      const auto t0 = Clock::now();
      for (const Event& e : stream.events) drop.record(e);
      const auto t1 = Clock::now();
      drop.close();
      per_event.push_back(seconds(t0, t1) * 1e9 / static_cast<double>(stream.events.size()));
    }
    record_ns = ridgescope::bench::median(per_event);
  }
  std::uint64_t records = 0, bytes = 0;
  for (const auto& [p, n] : payloads) {
    records += n;
    bytes += p.size();
  }

  auto run = [&](const char* name, std::uint64_t keep_steps) {
    std::vector<double> per_event;
    const std::string path = dir + "/ridgescope_bench_flight_sink_" + std::to_string(::getpid()) + "_" + name + ".rstrace";
    for (int rep = 0; rep < repetitions; ++rep) {
      std::unique_ptr<ridgescope::ChunkSink> sink;
      if (keep_steps == UINT64_MAX) {
        sink = ridgescope::make_file_sink(path);
      } else {
        ridgescope::FlightOptions o;
        o.keep_steps = keep_steps;
        o.keep_first_steps = keep_steps > 0 ? 2 : 0;
        sink = ridgescope::make_flight_sink(path, o);
      }
      const auto t0 = Clock::now();
      for (const auto& [p, n] : payloads) {
        if (!sink->write_chunk(p, n)) {
          std::fprintf(stderr, "%s: %s\n", name, sink->error().c_str());
          std::exit(1);
        }
      }
      sink->close();
      const auto t1 = Clock::now();
      per_event.push_back(seconds(t0, t1) * 1e9 / static_cast<double>(records));
    }
    std::remove(path.c_str());
    return ridgescope::bench::median(per_event);
  };
  const double bounded = run("flight_bounded", 20);
  const double full = run("flight_full", 0);
  const double file = run("file", UINT64_MAX);
  const double events_per_step = static_cast<double>(records) / static_cast<double>(stream.steps);
  auto us_per_step = [&](double ns) { return ns * events_per_step / 1000.0; };
  std::printf(
      "{\"benchmark\": \"flight_sink\", \"compiler\": \"%s\", \"build_type\": \"%s\", \"steps\": %llu, "
      "\"records\": %llu, \"records_per_step\": %.1f, \"payload_bytes_per_step\": %.0f, \"repetitions\": %d, "
      "\"ns_per_event\": {\"record\": %.1f, \"flight_bounded\": %.1f, \"flight_full\": %.1f, \"file\": %.1f}, "
      "\"us_per_step\": {\"record\": %.1f, \"flight_bounded\": %.1f, \"flight_full\": %.1f, \"file\": %.1f}}\n",
      RIDGESCOPE_BENCH_COMPILER, RIDGESCOPE_BENCH_BUILD_TYPE, static_cast<unsigned long long>(stream.steps),
      static_cast<unsigned long long>(records), events_per_step,
      static_cast<double>(bytes) / static_cast<double>(stream.steps), repetitions, record_ns, bounded, full, file,
      us_per_step(record_ns), us_per_step(bounded), us_per_step(full), us_per_step(file));
  return 0;
}
