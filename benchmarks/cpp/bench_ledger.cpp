// bench_ledger.cpp — microbenchmarks of the ridgescope core's hot paths (benchmarks/README.md).
//
// Build and run (from the repository root; no torch, no Python, no benchmark library needed):
//
//   cmake -S . -B build/bench -DRIDGESCOPE_BUILD_TORCH=OFF -DRIDGESCOPE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release -G Ninja && cmake --build build/bench && build/bench/benchmarks/cpp/ridgescope_bench_ledger
//
// (the same as three commands: configure, build, run).
//
// Flags (all optional):
//   --scenario ledger|recorder|reader|all   what to measure (default: all)
//   --iterations N      operations per repetition for ledger and recorder (default 1000000)
//   --repetitions R     timed repetitions per measurement; the median is reported (default 7)
//   --live-blocks N     live blocks the ledger holds while it churns (default 10000)
//   --trace-events N    events in the trace that reader and analysis decode (default 1000000)
//   --trace-path PATH   write the reader scenario's trace there and keep it (default: a file
//                       in /tmp, removed at the end)
//
// Scenarios:
//   ledger    Ledger::on_alloc(new address) then Ledger::on_free(an old live address), with
//             --live-blocks blocks live throughout; the freed block is picked at random and
//             every address is new, so the hash map is probed all over, not warm for one key.
//   recorder  Recorder::record() of one Alloc event (clock, lock, encode, hand-off) into a
//             trace in /tmp; the background writer runs as in a real session. This is the
//             per-allocator-callback cost of recording.
//   reader    TraceReader::next() over a synthetic training trace of --trace-events events
//             (decode rate, events/s), then analyze_trace() over the same file (events/s).
//
// Output: ONE JSON object on stdout (schema in benchmarks/README.md); progress on stderr.
// Every measured loop feeds a checksum that is printed, so the work cannot be optimised away.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <unistd.h>

#include "bench_support.h"
#include "ridgescope/analysis.h"
#include "ridgescope/ledger.h"
#include "ridgescope/recorder.h"
#include "ridgescope/trace_reader.h"


namespace {

using ridgescope::bench::Clock;
using ridgescope::bench::median;
using ridgescope::bench::Rng;
using ridgescope::Category;
using ridgescope::Event;
using ridgescope::EventKind;

constexpr int kOutputSchemaVersion = 1;
constexpr int kTargetNs = 50;  // budget for one ledger alloc+free pair

// Keeps a value alive as far as the optimiser can tell.
template <typename T>
inline void keep(const T& value) {
#if defined(__GNUC__) || defined(__clang__)
  asm volatile("" : : "r,m"(value) : "memory");
#else
  static volatile T sink;
  sink = value;
#endif
}

std::uint64_t g_checksum = 0;

// Unique, allocator-like addresses: 512-byte aligned in a 512 GiB window. Multiplying by an odd
// constant is a bijection modulo 2^30, so no address repeats within 2^30 calls.
struct AddressSource {
  std::uint64_t counter = 0;
  std::uint64_t next() {
    const std::uint64_t scrambled = (counter++ * 0x9E3779B97F4A7C15ull) & ((1ull << 30) - 1);
    return 0x7f0000000000ull + (scrambled << 9);
  }
};

// Block sizes as an allocator rounds them: 512 B to 1 MiB in 512-byte steps, skewed small.
std::uint64_t block_bytes(Rng& rng) {
  const std::uint64_t r = rng.next();
  const unsigned shift = static_cast<unsigned>(r % 12);  // 512 B .. 1 MiB
  return ((r >> 8) % (1ull << shift) + 1) * 512;
}

struct Result {
  std::string name;
  std::vector<double> ns_per_op;  // one per repetition
  std::uint64_t iterations = 0;   // operations per repetition
  std::string extra;              // further JSON members, each starting with ','
};

double elapsed_ns(Clock::time_point a, Clock::time_point b) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

std::string json_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

std::string temp_trace_path(const char* what) {
  return "/tmp/ridgescope_bench_" + std::to_string(::getpid()) + "_" + what + ".rstrace";
}

// ---------------------------------------------------------------------------------------------
// ledger: one on_alloc + one on_free, ~live_blocks blocks live, random victim, fresh addresses.
// ---------------------------------------------------------------------------------------------
Result bench_ledger(std::uint64_t iterations, int repetitions, std::uint64_t live_blocks) {
  constexpr Category kCategories[] = {Category::Parameter, Category::Activation,
                                      Category::Gradient,  Category::Temporary,
                                      Category::OptimizerState, Category::Unknown};
  Rng rng{0x1234567887654321ull};
  AddressSource addresses;
  ridgescope::Ledger ledger;
  std::vector<std::uint64_t> live(live_blocks);
  std::uint64_t block_id = 0;
  for (auto& addr : live) {
    addr = addresses.next();
    ridgescope::LiveBlock b;
    b.bytes = b.requested_bytes = block_bytes(rng);
    b.block_id = block_id++;
    b.category = kCategories[block_id % 6];
    ledger.on_alloc(addr, b);
  }

  // The work of one repetition, generated before the clock starts.
  std::vector<std::uint32_t> victim(iterations);
  std::vector<std::uint64_t> fresh(iterations), bytes(iterations);

  Result result{"ledger_alloc_free_pair", {}, iterations, ""};
  for (int rep = -1; rep < repetitions; ++rep) {  // rep -1 warms up and is not counted
    for (std::uint64_t i = 0; i < iterations; ++i) {
      victim[i] = static_cast<std::uint32_t>(rng.next() % live_blocks);
      fresh[i] = addresses.next();
      bytes[i] = block_bytes(rng);
    }
    std::uint64_t freed = 0;
    const auto t0 = Clock::now();
    for (std::uint64_t i = 0; i < iterations; ++i) {
      ridgescope::LiveBlock b;
      b.bytes = b.requested_bytes = bytes[i];
      b.block_id = block_id++;
      b.category = kCategories[i % 6];
      ledger.on_alloc(fresh[i], b);
      const auto old = ledger.on_free(live[victim[i]]);
      if (old) freed += old->bytes;
      live[victim[i]] = fresh[i];
    }
    const auto t1 = Clock::now();
    keep(freed);
    g_checksum += freed + ledger.live_bytes();
    if (rep >= 0) result.ns_per_op.push_back(elapsed_ns(t0, t1) / static_cast<double>(iterations));
  }
  const auto& a = ledger.anomalies();
  result.extra = ",\"live_blocks\":" + std::to_string(ledger.live_blocks()) +
                 ",\"anomalies\":" + std::to_string(a.unknown_frees + a.replaced_allocs) +
                 ",\"within_target\":" + (median(result.ns_per_op) <= kTargetNs ? "true" : "false");
  return result;
}

// ---------------------------------------------------------------------------------------------
// recorder: Recorder::record() of one Alloc event, as an allocator callback makes it.
// ---------------------------------------------------------------------------------------------
Result bench_recorder(std::uint64_t iterations, int repetitions) {
  Rng rng{0x0badc0ffee0ddf00ull};
  AddressSource addresses;
  std::vector<std::uint64_t> addr(iterations), bytes(iterations);
  const std::string path = temp_trace_path("recorder");
  Result result{"recorder_record_alloc", {}, iterations, ""};
  ridgescope::RecorderStats last{};
  for (int rep = -1; rep < repetitions; ++rep) {
    for (std::uint64_t i = 0; i < iterations; ++i) {
      addr[i] = addresses.next();
      bytes[i] = block_bytes(rng);
    }
    ridgescope::Recorder recorder(path);
    const auto t0 = Clock::now();
    for (std::uint64_t i = 0; i < iterations; ++i) {
      Event e;
      e.kind = EventKind::Alloc;
      e.addr = addr[i];
      e.bytes = bytes[i];
      e.requested_bytes = bytes[i] - (i & 511);
      recorder.record(e);
    }
    const auto t1 = Clock::now();
    recorder.close();  // writing out the tail is not part of the per-record cost
    last = recorder.stats();
    if (recorder.failed()) {
      std::fprintf(stderr, "ridgescope_bench_ledger: recorder failed: %s\n",
                   recorder.error().c_str());
      std::exit(1);
    }
    g_checksum += last.events + last.bytes_written;
    if (rep >= 0) result.ns_per_op.push_back(elapsed_ns(t0, t1) / static_cast<double>(iterations));
  }
  std::remove(path.c_str());
  result.extra = ",\"bytes_per_event\":" +
                 json_number(static_cast<double>(last.bytes_written) /
                             static_cast<double>(std::max<std::uint64_t>(last.events, 1))) +
                 ",\"dropped_events\":" + std::to_string(last.dropped_events) +
                 ",\"buffer_bytes_peak\":" + std::to_string(last.buffer_bytes_peak);
  return result;
}

// ---------------------------------------------------------------------------------------------
// reader: a synthetic training run of exactly `events` records, then decode and analysis.
// ---------------------------------------------------------------------------------------------

// Writes a trace shaped like a training loop: parameters tagged up front; per step a forward
// that allocates activations (weakly tagged) and temporaries, a backward that frees them and
// creates gradients on the first step, an optimizer step that creates its state on the first
// step, an allocator sample and a step marker. Freed addresses are reused, as allocators do.
std::uint64_t write_training_trace(const std::string& path, std::uint64_t events) {
  constexpr int kParams = 64, kActivations = 400, kTemporaries = 100;
  ridgescope::Recorder rec(path);
  std::uint64_t count = 0;  // records written (String and Metadata included)
  auto intern = [&](const std::string& s) {
    ++count;
    return rec.intern(s);
  };
  const auto forward = intern("forward"), backward = intern("backward");
  const auto optimizer_step = intern("optimizer_step"), sample_key = intern("allocator_live_bytes");
  std::vector<std::uint32_t> param_label(kParams), act_label(kActivations);
  for (int i = 0; i < kParams; ++i) param_label[i] = intern("layers." + std::to_string(i) + ".weight");
  for (int i = 0; i < kActivations; ++i) act_label[i] = intern("activation." + std::to_string(i));
  intern("run");
  rec.metadata("run", "{\"benchmark\": \"ridgescope_bench_ledger\"}");
  ++count;

  Rng rng{0x5eed5eed5eed5eedull};
  AddressSource fresh;
  std::vector<std::uint64_t> free_addresses;
  std::uint64_t live = 0;
  auto emit = [&](Event e) {
    if (count >= events) return false;
    rec.record(e);
    ++count;
    return true;
  };
  auto alloc = [&](std::uint64_t bytes) {
    std::uint64_t addr;
    if (!free_addresses.empty()) {
      addr = free_addresses.back();
      free_addresses.pop_back();
    } else {
      addr = fresh.next();
    }
    Event e;
    e.kind = EventKind::Alloc;
    e.addr = addr;
    e.bytes = e.requested_bytes = bytes;
    if (emit(e)) live += bytes;
    return addr;
  };
  auto free_block = [&](std::uint64_t addr, std::uint64_t bytes) {
    Event e;
    e.kind = EventKind::Free;
    e.addr = addr;
    e.bytes = bytes;
    if (emit(e)) live -= bytes;
    free_addresses.push_back(addr);
  };
  auto tag = [&](std::uint64_t addr, Category c, std::uint32_t label, bool weak) {
    Event e;
    e.kind = EventKind::Tag;
    e.addr = addr;
    e.category = c;
    e.flags = weak ? ridgescope::kTagWeak : 0;
    e.string_id = label;
    emit(e);
  };
  auto phase = [&](EventKind kind, std::uint32_t name) {
    Event e;
    e.kind = kind;
    e.string_id = name;
    emit(e);
  };
  auto temporaries = [&] {
    for (int i = 0; i < kTemporaries; ++i) {
      const std::uint64_t b = block_bytes(rng);
      free_block(alloc(b), b);
    }
  };

  for (int i = 0; i < kParams; ++i) {
    const std::uint64_t b = block_bytes(rng) * 4;
    tag(alloc(b), Category::Parameter, param_label[i], false);
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> acts;
  for (std::uint64_t step = 0; count < events; ++step) {
    phase(EventKind::PhaseBegin, forward);
    acts.clear();
    for (int i = 0; i < kActivations; ++i) {
      const std::uint64_t b = block_bytes(rng);
      const std::uint64_t a = alloc(b);
      acts.emplace_back(a, b);
      if (i % 2 == 0) tag(a, Category::Activation, act_label[i], true);
      if (i % 4 == 0) temporaries();
    }
    phase(EventKind::PhaseEnd, forward);
    phase(EventKind::PhaseBegin, backward);
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) free_block(it->first, it->second);
    if (step == 0) {
      for (int i = 0; i < kParams; ++i) alloc(block_bytes(rng) * 4);  // gradients
    }
    temporaries();
    phase(EventKind::PhaseEnd, backward);
    phase(EventKind::PhaseBegin, optimizer_step);
    if (step == 0) {
      for (int i = 0; i < 2 * kParams; ++i) alloc(block_bytes(rng) * 4);  // two moments each
    }
    temporaries();
    phase(EventKind::PhaseEnd, optimizer_step);
    Event s;
    s.kind = EventKind::Sample;
    s.string_id = sample_key;
    s.value = live;
    emit(s);
    Event st;
    st.kind = EventKind::Step;
    st.value = step;
    emit(st);
  }
  rec.close();
  if (rec.failed()) {
    std::fprintf(stderr, "ridgescope_bench_ledger: recorder failed: %s\n", rec.error().c_str());
    std::exit(1);
  }
  return rec.stats().events;
}

std::string events_extra(double ns_per_event, std::uint64_t events, std::uint64_t file_bytes) {
  return ",\"events\":" + std::to_string(events) + ",\"file_bytes\":" + std::to_string(file_bytes) +
         ",\"events_per_s_median\":" + json_number(1e9 / ns_per_event);
}

std::vector<Result> bench_reader(std::uint64_t trace_events, int repetitions,
                                 const std::string& keep_path) {
  const std::string path = keep_path.empty() ? temp_trace_path("reader") : keep_path;
  std::fprintf(stderr, "writing a %llu-event trace to %s\n",
               static_cast<unsigned long long>(trace_events), path.c_str());
  const std::uint64_t written = write_training_trace(path, trace_events);

  Result read{"reader_next_event", {}, 0, ""};
  std::uint64_t file_bytes = 0;
  for (int rep = -1; rep < repetitions; ++rep) {
    const auto t0 = Clock::now();
    ridgescope::TraceReader reader(path);
    Event e;
    std::uint64_t n = 0, sum = 0;
    while (reader.next(e)) {
      sum += e.addr ^ e.time_ns ^ e.bytes;
      ++n;
    }
    const auto t1 = Clock::now();
    keep(sum);
    if (reader.truncated() || n != written) {
      std::fprintf(stderr, "ridgescope_bench_ledger: read %llu of %llu events (%s)\n",
                   static_cast<unsigned long long>(n), static_cast<unsigned long long>(written),
                   reader.problem().c_str());
      std::exit(1);
    }
    g_checksum += sum;
    read.iterations = n;
    file_bytes = reader.file_bytes();
    if (rep >= 0) read.ns_per_op.push_back(elapsed_ns(t0, t1) / static_cast<double>(n));
  }
  read.extra = events_extra(median(read.ns_per_op), read.iterations, file_bytes);

  Result analysis{"analyze_trace_event", {}, 0, ""};
  for (int rep = -1; rep < repetitions; ++rep) {
    const auto t0 = Clock::now();
    const ridgescope::Report report = ridgescope::analyze_trace(path);
    const auto t1 = Clock::now();
    g_checksum += report.peak.bytes + report.allocations + report.consistency.mismatches;
    analysis.iterations = report.trace.events;
    if (rep >= 0) {
      analysis.ns_per_op.push_back(elapsed_ns(t0, t1) /
                                   static_cast<double>(report.trace.events));
    }
  }
  analysis.extra = events_extra(median(analysis.ns_per_op), analysis.iterations, file_bytes);
  if (keep_path.empty()) std::remove(path.c_str());
  return {read, analysis};
}

// ---------------------------------------------------------------------------------------------

[[noreturn]] void usage(const char* problem) {
  if (problem != nullptr) std::fprintf(stderr, "ridgescope_bench_ledger: %s\n", problem);
  std::fprintf(stderr,
               "usage: ridgescope_bench_ledger [--scenario ledger|recorder|reader|all]\n"
               "         [--iterations N] [--repetitions R] [--live-blocks N] [--trace-events N]\n"
               "         [--trace-path PATH]\n");
  std::exit(problem != nullptr ? 2 : 0);
}

std::uint64_t parse_count(const char* flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (text[0] == '-' || end == text || *end != '\0' || errno != 0 || v == 0) {
    usage((std::string(flag) + " needs a positive integer, got '" + text + "'").c_str());
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string scenario = "all", trace_path;
  std::uint64_t iterations = 1'000'000, live_blocks = 10'000, trace_events = 1'000'000;
  std::uint64_t repetitions = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(nullptr);
    if (i + 1 >= argc) usage((std::string(arg) + " needs a value").c_str());
    const char* value = argv[++i];
    if (arg == "--scenario") {
      scenario = value;
      if (scenario != "ledger" && scenario != "recorder" && scenario != "reader" && scenario != "all") {
        usage(("unknown scenario '" + scenario + "'").c_str());
      }
    } else if (arg == "--iterations") {
      iterations = parse_count("--iterations", value);
    } else if (arg == "--repetitions") {
      repetitions = parse_count("--repetitions", value);
    } else if (arg == "--live-blocks") {
      live_blocks = parse_count("--live-blocks", value);
    } else if (arg == "--trace-path") {
      trace_path = value;
      if (trace_path.empty()) usage("--trace-path needs a path");
    } else if (arg == "--trace-events") {
      trace_events = parse_count("--trace-events", value);
    } else {
      usage(("unknown flag '" + std::string(arg) + "'").c_str());
    }
  }
  if (repetitions > 1000 || live_blocks > (1ull << 28) || iterations > (1ull << 28)) {
    usage("--repetitions is at most 1000; --iterations and --live-blocks at most 2^28");
  }
  const int reps = static_cast<int>(repetitions);

  std::vector<Result> results;
  try {
    if (scenario == "ledger" || scenario == "all") {
      std::fprintf(stderr, "ledger: %d x %llu alloc+free pairs, %llu live blocks\n", reps,
                   static_cast<unsigned long long>(iterations),
                   static_cast<unsigned long long>(live_blocks));
      results.push_back(bench_ledger(iterations, reps, live_blocks));
    }
    if (scenario == "recorder" || scenario == "all") {
      std::fprintf(stderr, "recorder: %d x %llu record() calls\n", reps,
                   static_cast<unsigned long long>(iterations));
      results.push_back(bench_recorder(iterations, reps));
    }
    if (scenario == "reader" || scenario == "all") {
      for (auto& r : bench_reader(trace_events, reps, trace_path)) results.push_back(std::move(r));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ridgescope_bench_ledger: %s\n", e.what());
    return 1;
  }

  std::string out = "{\"schema_version\":" + std::to_string(kOutputSchemaVersion) +
                    ",\"benchmark\":\"ledger\",\"results\":[";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const auto [lo, hi] = std::minmax_element(r.ns_per_op.begin(), r.ns_per_op.end());
    if (i > 0) out += ",";
    out += "{\"name\":" + json_string(r.name) +
           ",\"ns_per_op_median\":" + json_number(median(r.ns_per_op)) +
           ",\"ns_per_op_min\":" + json_number(*lo) + ",\"ns_per_op_max\":" + json_number(*hi) +
           ",\"repetitions\":" + std::to_string(r.ns_per_op.size()) +
           ",\"iterations\":" + std::to_string(r.iterations) + r.extra + "}";
  }
  out += "],\"target_ns\":" + std::to_string(kTargetNs) +
         ",\"compiler\":" + json_string(RIDGESCOPE_BENCH_COMPILER) +
         ",\"build_type\":" + json_string(RIDGESCOPE_BENCH_BUILD_TYPE) +
#ifdef NDEBUG
         ",\"assertions\":false" +
#else
         ",\"assertions\":true" +
#endif
         ",\"hardware_concurrency\":" + std::to_string(std::thread::hardware_concurrency()) +
         ",\"checksum\":" + std::to_string(g_checksum) + "}";
  std::puts(out.c_str());
  return 0;
}
