// Specification: bad input never crashes a reader. A bounded, deterministic in-process fuzz of
// every core reader of untrusted input: valid seed inputs (a trace written with the real
// Recorder, snapshot pickles from the snapshot writer and in torch's layout, run metadata JSON,
// PYTORCH_CUDA_ALLOC_CONF strings) are mutated thousands of times (bit flips, byte insertions and
// deletions, truncations, length fields inflated to huge values, splices, structure-aware edits
// of chunks, events and pickle trees), and each read must either succeed or fail with the
// reader's documented error: TraceError (trace), PickleError (pickle), SnapshotError (snapshot),
// an error message (JSON, allocator settings). Anything else (another exception type, a crash,
// and under -fsanitize=address,undefined any memory error or undefined behaviour) fails.
//
// Mutants of traces that stay readable (valid chunks holding weird events: frees of unknown
// addresses, double allocs, zero sizes, sizes near UINT64_MAX, time going backwards) must be
// analysed without any error, and their snapshot export must read back.
//
// Knobs (environment): RIDGESCOPE_FUZZ_ITERATIONS, mutations per reader (default 300, which
// runs in about a second in a Release build); RIDGESCOPE_FUZZ_SEED, a different deterministic
// sequence. When a reader crashes the process, the input it was reading is left on disk as
// /tmp/ridgescope_test_<pid>_<n>.<target> (the newest such file), to reproduce it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "byte_codec.h"
#include "catch.h"
#include "json_value.h"
#include "json_writer.h"
#include "pickle_reader.h"
#include "pickle_writer.h"
#include "ridgescope/allocator_model.h"
#include "ridgescope/analysis.h"
#include "ridgescope/flight.h"
#include "ridgescope/recorder.h"
#include "ridgescope/snapshot.h"
#include "ridgescope/trace_format.h"
#include "ridgescope/trace_reader.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::detail::PickleValue;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {

// --- Deterministic randomness and the knobs ------------------------------------------------

struct Rng {
  std::uint64_t state;
  std::uint64_t next() {  // splitmix64
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next() % n; }
  bool chance(unsigned percent) { return below(100) < percent; }
  bool permille(unsigned p) { return below(1000) < p; }
};

std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 10);
}

std::uint64_t iterations() { return env_number("RIDGESCOPE_FUZZ_ITERATIONS", 300); }
bool long_run() { return std::getenv("RIDGESCOPE_FUZZ_ITERATIONS") != nullptr; }
// RIDGESCOPE_FUZZ_VERBOSE=1 prints every in-memory input before it is read (to reproduce a crash).
bool verbose() { return std::getenv("RIDGESCOPE_FUZZ_VERBOSE") != nullptr; }
Rng rng_for(std::uint64_t target) { return Rng{env_number("RIDGESCOPE_FUZZ_SEED", 1) * 1000003u + target}; }

// Interesting integers: zero, one, sign and width boundaries, and lengths near the end.
const std::uint64_t kInteresting64[] = {0,
                                        1,
                                        0x7F,
                                        0x80,
                                        0xFF,
                                        0x7FFF,
                                        0xFFFF,
                                        0x7FFFFFFFull,
                                        0x80000000ull,
                                        0xFFFFFFFFull,
                                        0x100000000ull,
                                        0x7FFFFFFFFFFFFFFFull,
                                        0x8000000000000000ull,
                                        0xFFFFFFFFFFFFFFFEull,
                                        0xFFFFFFFFFFFFFFFFull};

std::uint64_t interesting(Rng& rng) {
  return kInteresting64[rng.below(sizeof kInteresting64 / sizeof kInteresting64[0])];
}

// --- Byte-level mutations ---------------------------------------------------------------------

void put_le(std::string& s, std::size_t at, std::uint64_t v, int width) {
  for (int i = 0; i < width && at + static_cast<std::size_t>(i) < s.size(); ++i) {
    s[at + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  }
}

// One to four mutations of `s`: bit flip, byte set, insertion, deletion, truncation, a 2/4/8-byte
// field set to a boundary value (length inflation), a varint made huge, a copied range, a splice
// with `other`, a dictionary token inserted.
std::string mutate_bytes(std::string s, Rng& rng, const std::string& other,
                         const std::vector<std::string>& tokens) {
  const int ops = 1 + static_cast<int>(rng.below(4));
  for (int k = 0; k < ops; ++k) {
    const std::size_t n = s.size();
    const std::size_t at = static_cast<std::size_t>(rng.below(n + 1));
    switch (rng.below(11)) {
      case 0:
        if (n) s[at % n] = static_cast<char>(s[at % n] ^ (1u << rng.below(8)));
        break;
      case 1:
        if (n) s[at % n] = static_cast<char>(rng.chance(50) ? interesting(rng) : rng.next());
        break;
      case 2: {
        std::string bytes(1 + rng.below(8), '\0');
        for (char& c : bytes) c = static_cast<char>(rng.next());
        s.insert(at, bytes);
        break;
      }
      case 3:
        if (n) s.erase(at % n, 1 + rng.below(16));
        break;
      case 4:
        s.resize(at);
        break;
      case 5: {
        static const int kWidths[] = {2, 4, 8};
        const int w = kWidths[rng.below(3)];
        std::uint64_t v = interesting(rng);
        if (rng.chance(30)) v = n + rng.below(3) - 1;  // a length just around the size
        put_le(s, at, v, w);
        break;
      }
      case 6: {  // a varint of 10 bytes, or one that never ends
        std::string v(rng.chance(50) ? 9 : 11, '\xFF');
        if (rng.chance(50)) v.push_back('\x01');
        s.insert(at, v);
        break;
      }
      case 7:
        if (n) {
          const std::size_t from = static_cast<std::size_t>(rng.below(n));
          const std::string piece = s.substr(from, 1 + rng.below(32));
          s.insert(at, piece);
        }
        break;
      case 8:
        if (!other.empty()) {
          const std::size_t from = static_cast<std::size_t>(rng.below(other.size()));
          s = s.substr(0, at) + other.substr(from);
        }
        break;
      case 9:
        if (!tokens.empty()) s.insert(at, tokens[rng.below(tokens.size())]);
        break;
      default:
        if (n) {
          const std::size_t from = static_cast<std::size_t>(rng.below(n));
          std::reverse(s.begin() + static_cast<std::ptrdiff_t>(from),
                       s.begin() + static_cast<std::ptrdiff_t>(std::min(n, from + 1 + rng.below(8))));
        }
        break;
    }
  }
  return s;
}

// --- Files ------------------------------------------------------------------------------------

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spill(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// --- What a read may do -----------------------------------------------------------------------

// Counts the outcomes and fails the test on anything but success or the documented error.
struct Outcomes {
  const char* target;
  std::uint64_t ok = 0, refused = 0, unexpected = 0;
  double slowest_ms = 0;

  // `body` runs the read; it returns normally or throws. `Expected` is the documented error.
  template <typename Expected>
  void run(std::uint64_t iteration, const std::function<void()>& body) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      body();
      ++ok;
    } catch (const Expected& e) {
      if (std::string(e.what()).empty()) what = "a documented error with an empty message";
      ++refused;
    } catch (const std::exception& e) {
      what = std::string("an undocumented exception: ") + e.what();
    } catch (...) {
      what = "a non-std exception";
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    slowest_ms = std::max(slowest_ms, ms);
    if (!what.empty()) {
      ++unexpected;
      FAIL_CHECK(target << " iteration " << iteration << ": " << what);
    }
  }
  void report() const {
    if (long_run()) {
      std::cerr << "fuzz " << target << ": " << ok << " read, " << refused << " refused, " << unexpected
                << " unexpected; slowest " << slowest_ms << " ms\n";
    }
  }
};

struct NoError : std::exception {};  // for reads that must not fail at all

// Reads a whole trace the way every consumer does; throws TraceError only at construction.
std::uint64_t read_all(const std::string& path) {
  TraceReader r(path);
  Event e;
  std::uint64_t n = 0;
  for (int pass = 0; pass < 2; ++pass) {
    while (r.next(e)) {
      ++n;
      (void)r.string(e.string_id);
    }
    if (r.truncated() && r.problem().empty()) throw std::logic_error("truncated without a problem");
    r.rewind();
  }
  return n;
}

// --- Seeds ------------------------------------------------------------------------------------

const char* kRunJson =
    R"({"ridgescope_version":"0.3.0","torch_version":"2.14.1","python_version":"3.11.2",)"
    R"("device_capacity_bytes":85899345920,"argv":["train.py","--lr","3e-4"],)"
    R"("model":{"class":"Net","parameters":1280,"parameter_tensors":2,"trainable_parameters":1280,)"
    R"("parameter_bytes":5120,"trainable_parameter_bytes":5120,"buffers":0,"buffer_bytes":0,)"
    R"("dtypes":{"float32":5120}},"optimizer":{"type":"Adam","states_per_parameter":2,)"
    R"("state_keys":["exp_avg","exp_avg_sq"],"hyperparameters":{"lr":0.0003,"betas":[0.9,0.999],)"
    R"("eps":1e-08,"amsgrad":false,"name":"\u00e9\ud83d\ude00\n","w":null,"big":-12345678901234567890}}})";
const char* kSessionJson = R"({"events":120,"dropped_events":0,"bytes_written":4096,"buffer_bytes_peak":65536})";
const char* kDriverJson = R"({"available":true,"reason":"","total_bytes":85899345920})";

// One CPU training step with phases, tags, samples, an OOM and run metadata.
void write_step(TraceBuilder& t) {
  t.metadata("run", kRunJson).metadata("session", kSessionJson).metadata("driver_view", kDriverJson);
  // Allocation sites (format 2): frames of every kind, a one-frame and a deep stack.
  t.at(100);
  const auto user = t.python_frame("/home/me/train.py", 10, "train");
  const auto lib = t.python_frame("/venv/torch/nn/functional.py", 2100, "linear");
  const auto node = t.frame(FrameKind::Autograd, "", 0, "MmBackward0", "fc1");
  const auto native = t.frame(FrameKind::Native, "/venv/torch/lib/libtorch_cpu.so", 0, "at::native::mm");
  t.alloc(0x500000, 64, t.stack({user})).free(0x500000);
  t.alloc(0x600000, 96, t.stack({native, lib, user, node}, 2));
  write_adam_step(t, {.forward_sample_bytes = 8192, .oom_request_bytes = 1ull << 40,
                      .oom_device_free_bytes = 1 << 20});
}

// The same step on a CUDA device, with segments, memory outside PyTorch (format 3: CUPTI's
// external allocations), the driver's readings (the device ledger) and host samples.
void write_cuda_step(TraceBuilder& t) {
  t.metadata("cupti_source", R"({"available":true,"reason":""})");
  t.at(500).segment(0x7f0000000000, 2 << 20);
  t.sample("nvml_total_bytes", 8ull << 30).sample("nvml_used_bytes", 1 << 30).sample("nvml_process_count", 1);
  t.sample("nvml_process_used_bytes", 1 << 29).sample("nvml_reading", 1);
  t.alloc(0x7f0000000000, 512).tag(0x7f0000000000, Category::Parameter, "w");
  t.external_alloc(0x7f1000000000, 4 << 20, "libnccl.so.2", 5);
  t.at(900).begin("forward").alloc(0x7f0000000200, 1024).free(0x7f0000000200);
  t.external_alloc(0x7f2000000000, 8192, "libcublas.so.13", 1).external_free(0x7f2000000000, 8192, 1);
  Event host;  // a host reading (CPU samples), as host_memory_source writes it
  host.kind = EventKind::Sample;
  host.time_ns = 950;
  for (const auto& [key, value] : {std::pair<const char*, std::uint64_t>{"host_torch_allocated_bytes", 4096},
                                   {"host_torch_resident_bytes", 4096}, {"host_malloc_in_use_bytes", 1 << 20},
                                   {"host_malloc_free_bytes", 4096}, {"host_rss_anon_bytes", 2 << 20},
                                   {"host_rss_file_bytes", 1 << 20}, {"host_rss_shmem_bytes", 0},
                                   {"host_resident_bytes", 3 << 20}}) {
    host.string_id = t.recorder().intern(key);
    host.value = value;
    t.recorder().record_timed(host);
  }
  t.end("forward").step(0);
  t.sample("nvml_used_bytes", 1 << 30).sample("nvml_process_used_bytes", 1 << 29).sample("nvml_reading", 1);
  t.close();
}

// A bounded trace (format 4, the flight recorder): twelve steps compacted to keep two, with a
// mark and an OOM, so it has time bases, checkpoints, summaries and resolutions.
std::string bounded_trace_bytes() {
  TempPath full, bounded;
  {
    TraceBuilder t(full.str());
    t.at(100).alloc(0x1000, 4096).tag(0x1000, Category::Parameter, "w");
    for (std::uint64_t step = 0; step < 12; ++step) {
      t.at(200 + 100 * step).begin("forward").alloc(0x2000, 1024 + 64 * step).tag(0x2000, Category::Activation, "a", true);
      if (step == 3) t.alloc(0x9000, 1 << 20).mark("eval");  // live until step 8's backward
      t.end("forward").begin("backward").free(0x2000);
      if (step == 8) t.free(0x9000);
      if (step == 6) t.oom(1 << 30, 0);
      t.end("backward").step(step);
    }
    t.close();
  }
  FlightOptions options;
  options.keep_steps = 2;
  options.rewrite_bytes = 256;
  compact_trace(full.str(), bounded.str(), options);
  return slurp(bounded.str());
}

std::string step_trace_bytes(bool cuda) {
  TempPath p;
  {
    TraceBuilder t(p.str(), cuda ? Device{DeviceType::CUDA, 0} : Device{});
    if (cuda) write_cuda_step(t); else write_step(t);
  }
  return slurp(p.str());
}

// A snapshot in the layout torch's _snapshot() produces: segments with blocks, a device trace
// with frames, record_function annotations.
std::string torch_snapshot_bytes() {
  detail::PickleWriter w(/*memoize_strings=*/true);
  auto frame = [&](const char* file, const char* name) {
    w.begin_dict().key("filename").str(file).key("line").integer(10).key("name").str(name).end_dict();
  };
  auto entry = [&](const char* action, std::uint64_t addr, std::uint64_t size, std::uint64_t t,
                   const char* file, const char* name) {
    w.begin_dict().key("action").str(action).key("addr").unsigned_integer(addr).key("size").unsigned_integer(size);
    w.key("stream").integer(0).key("time_us").unsigned_integer(t).key("frames").begin_list();
    if (file != nullptr) frame(file, name);
    w.end_list().end_dict();
  };
  w.begin_dict();
  w.key("segments").begin_list();
  w.begin_dict().key("device").integer(0).key("address").integer(0x100000).key("total_size").integer(2 << 20);
  w.key("stream").integer(0).key("segment_type").str("large").key("blocks").begin_list();
  w.begin_dict().key("size").integer(1024).key("requested_size").integer(1000).key("state").str("active_allocated");
  w.key("frames").begin_list().end_list().end_dict();
  w.begin_dict().key("size").integer((2 << 20) - 1024).key("requested_size").integer(0).key("state").str("inactive");
  w.key("frames").begin_list().end_list().end_dict();
  w.end_list().end_dict();
  w.end_list();
  w.key("device_traces").begin_list().begin_list();
  entry("segment_alloc", 0x100000, 2 << 20, 4000, nullptr, nullptr);
  entry("alloc", 0x100000, 1000, 5000, "torch/nn/modules/linear.py", "reset_parameters");
  entry("alloc", 0x200000, 3000, 6000, "torch/nn/modules/module.py", "_call_impl");
  entry("alloc", 0x300000, 100, 7000, "torch/_tensor.py", "backward");
  entry("free_requested", 0x200000, 3000, 7100, nullptr, nullptr);
  entry("free_completed", 0x200000, 3000, 7100, nullptr, nullptr);
  entry("free_completed", 0x900000, 512, 7200, nullptr, nullptr);  // freed, never allocated here
  entry("alloc", 0x400000, 1000, 8000, "torch/optim/adam.py", "_init_group");
  entry("oom", 0, 1 << 30, 8100, nullptr, nullptr);
  entry("annotate", 0x400000, 0, 8200, nullptr, nullptr);
  entry("snapshot", 0, 0, 8300, nullptr, nullptr);
  w.end_list().end_list();
  w.key("external_annotations").begin_list();
  w.begin_dict().key("name").str("Optimizer.step#Adam.step").key("stage").str("START").key("time_us").integer(7900);
  w.key("device").integer(0).end_dict();
  w.begin_dict().key("name").str("Optimizer.step#Adam.step").key("stage").str("END").key("time_us").integer(8250);
  w.end_dict();
  w.end_list();
  w.key("allocator_settings").begin_dict().key("expandable_segments").boolean(false).end_dict();
  w.end_dict();
  w.finish();
  return w.take();
}

// The same snapshot as Python 3.14's pickle.dump writes it by default: protocol 5, in a FRAME.
std::string protocol5_snapshot_bytes() {
  const std::string p4 = torch_snapshot_bytes();
  const std::string body = p4.substr(2);
  std::string out = "\x80\x05\x95";
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((body.size() >> (8 * i)) & 0xFF));
  return out + body;
}

std::string exported_snapshot_bytes(const std::string& trace_bytes) {
  TempPath trace, pickle(".pickle");
  spill(trace.str(), trace_bytes);
  write_snapshot(trace.str(), pickle.str());
  return slurp(pickle.str());
}

// Tokens that steer mutations towards the readers' keywords.
const std::vector<std::string> kPickleTokens = {
    "\x8c\x05" "alloc", "\x8c\x04" "addr", "\x8c\x04" "size", "\x8c\x0e" "free_completed",
    "\x8c\x08" "segments", "\x8c\x0d" "device_traces", "\x8c\x06" "frames", "\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00",
    "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80", "J\xff\xff\xff\xff", "h\x00", "j\xff\xff\xff\xff", "\x94", "(", "e", "u",
    "]", "}", ")", "\x85", "\x87", "N", "\x88", "t", "l", "d", "a", "s", "\x95\xff\xff\xff\xff\xff\xff\xff\xff",
    "X\xff\xff\xff\x7f", "c", "\x93", "R", ".",
    // protocol 5: PROTO 5, 8-byte lengths, bytes, sets, out-of-band buffers
    std::string("\x80\x05", 2), std::string("\x8d\x01\x00\x00\x00\x00\x00\x00\x00" "a", 10),
    std::string("\x8e\xff\xff\xff\xff\xff\xff\xff\x7f", 9), std::string("\x96\x00\x00\x00\x00\x00\x00\x00\x00", 9),
    "C\x02" "ab", std::string("B\x00\x00\x00\x00", 5), "\x8f", "\x90", "\x91", "\x97", "\x98"};
const std::vector<std::string> kJsonTokens = {"{", "}", "[", "]", ",", ":", "\"", "\\u", "\\ud800", "\\udc00",
                                              "\\uD83D\\uDE00", "1e999", "-0", "9223372036854775808",
                                              "-9223372036854775809", "null", "true", "\\", "\x01", "\xff",
                                              "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "0.", ".5", "1e"};
const std::vector<std::string> kSettingsTokens = {
    ",", ":", "[", "]", ">", "True", "False", "0", "1", "1024", "18446744073709551615",
    "18446744073709551616", "1e308", "nan", "inf", "-1", "0.5", "max_split_size_mb",
    "roundup_power2_divisions", "expandable_segments", "garbage_collection_threshold",
    "per_process_memory_fraction", "large_segment_size_mb", "max_non_split_rounding_mb",
    "backend", "cudaMallocAsync", "native", "1073741824", "2147483648", " "};
const std::vector<std::string> kTraceTokens = {"CHNK", "RIDGESCP", std::string("\x0b\x00", 2),
                                               std::string("\x01\x00", 2), std::string("\x0c\x01", 2)};

// --- Trace chunks (structure-aware mutation past the CRC) ---------------------------------------

struct Chunk {
  std::string payload;
  std::uint32_t records = 0;
};

std::vector<Chunk> split_chunks(const std::string& file) {
  std::vector<Chunk> out;
  std::size_t at = trace_format::kFileHeaderBytes;
  while (at + trace_format::kChunkHeaderBytes <= file.size()) {
    const std::uint32_t length = detail::get_u32(file.data() + at + 4);
    Chunk c;
    c.records = detail::get_u32(file.data() + at + 8);
    c.payload = file.substr(at + trace_format::kChunkHeaderBytes, length);
    out.push_back(std::move(c));
    at += trace_format::kChunkHeaderBytes + length;
  }
  return out;
}

std::string join_chunks(const std::string& header, const std::vector<Chunk>& chunks) {
  std::string out = header.substr(0, trace_format::kFileHeaderBytes);
  for (const Chunk& c : chunks) {
    char h[trace_format::kChunkHeaderBytes];
    detail::put_u32(h, trace_format::kChunkMagic);
    detail::put_u32(h + 4, static_cast<std::uint32_t>(c.payload.size()));
    detail::put_u32(h + 8, c.records);
    detail::put_u32(h + 12, detail::crc32(c.payload));
    out.append(h, sizeof h);
    out += c.payload;
  }
  return out;
}

// Splits a chunk payload into its records (kind byte, varint length, payload).
std::vector<std::string> split_records(const std::string& payload) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < payload.size()) {
    std::size_t p = pos + 1;
    std::uint64_t length = 0;
    if (!detail::get_varint(payload, &p, &length) || length > payload.size() - p) break;
    out.push_back(payload.substr(pos, p + length - pos));
    pos = p + length;
  }
  return out;
}

// --- Event-level mutation: readable traces with weird event sequences ----------------------------

struct Script {
  std::vector<Event> events;
  std::vector<std::string> texts;  // by string id as the reader numbered them
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<FrameRecord> frames;  // by frame id - 1 (string ids as the reader numbered them)
  std::vector<std::pair<std::vector<std::uint32_t>, std::uint32_t>> stacks;  // by stack id - 1
};

Script read_script(const std::string& path) {
  Script s;
  TraceReader r(path);
  Event e;
  std::uint32_t frames = 0, stacks = 0;
  while (r.next(e)) {
    if (e.kind == EventKind::String) continue;
    if (e.kind == EventKind::Frame) frames = std::max(frames, e.string_id);
    if (e.kind == EventKind::Stack) stacks = std::max(stacks, e.string_id);
    if (e.kind == EventKind::Frame || e.kind == EventKind::Stack) continue;
    if (e.kind == EventKind::Metadata) {
      s.metadata.emplace_back(std::string(r.string(e.string_id)), std::string(e.text));
      continue;
    }
    e.text = {};
    s.events.push_back(e);
  }
  for (std::uint32_t id = 0; id < 64; ++id) s.texts.emplace_back(r.string(id));
  for (std::uint32_t id = 1; id <= frames; ++id) s.frames.push_back(r.frame(id));
  for (std::uint32_t id = 1; id <= stacks; ++id) {
    const StackView v = r.stack(id);
    s.stacks.emplace_back(std::vector<std::uint32_t>(v.frames, v.frames + v.size), v.site);
  }
  return s;
}

void mutate_event(Event& e, Rng& rng, const std::vector<Event>& all) {
  const Event& other = all[rng.below(all.size())];
  switch (rng.below(10)) {
    case 0: {  // Alloc .. Sample, ExternalAlloc, ExternalFree
      const std::uint64_t k = rng.below(12);
      e.kind = static_cast<EventKind>(k < 10 ? 1 + k : 3 + k);
      break;
    }
    case 9: e.stack_id = static_cast<std::uint32_t>(rng.chance(70) ? rng.below(6) : rng.next()); break;
    case 1: e.addr = rng.chance(50) ? other.addr : interesting(rng); break;
    case 2: e.bytes = interesting(rng); break;
    case 3: e.requested_bytes = interesting(rng); break;
    case 4: e.time_ns = rng.chance(50) ? e.time_ns - std::min<std::uint64_t>(e.time_ns, 1 + rng.below(3000)) : interesting(rng); break;
    case 5:
      e.device = rng.chance(50) ? Device{} : Device{DeviceType::CUDA, static_cast<std::int16_t>(rng.below(3) == 2 ? 32767 : rng.below(2))};
      break;
    case 6: e.category = category_from_byte(static_cast<std::uint8_t>(rng.below(16))); e.flags = static_cast<std::uint8_t>(rng.below(3)); break;
    case 7: e.string_id = static_cast<std::uint32_t>(rng.chance(70) ? rng.below(40) : rng.next()); break;
    default: e.value = interesting(rng); e.stream = rng.chance(50) ? 0 : interesting(rng); break;
  }
}

Script mutate_script(Script s, Rng& rng, const std::string& json_seed) {
  const int ops = 1 + static_cast<int>(rng.below(6));
  for (int k = 0; k < ops && !s.events.empty(); ++k) {
    const std::size_t i = static_cast<std::size_t>(rng.below(s.events.size()));
    switch (rng.below(6)) {
      case 0: s.events.insert(s.events.begin() + static_cast<std::ptrdiff_t>(i), s.events[i]); break;  // double alloc/free
      case 1: s.events.erase(s.events.begin() + static_cast<std::ptrdiff_t>(i)); break;  // a lost alloc or free
      case 2: std::swap(s.events[i], s.events[rng.below(s.events.size())]); break;  // out of order, time backwards
      case 3: {  // a random event made of another's fields
        Event e = s.events[rng.below(s.events.size())];
        mutate_event(e, rng, s.events);
        s.events.insert(s.events.begin() + static_cast<std::ptrdiff_t>(i), e);
        break;
      }
      case 4:
        if (!s.metadata.empty()) {
          auto& m = s.metadata[rng.below(s.metadata.size())];
          m.second = mutate_bytes(m.second, rng, json_seed, kJsonTokens);
        }
        break;
      default: mutate_event(s.events[i], rng, s.events); break;
    }
  }
  return s;
}

void write_script(const Script& s, const std::string& path) {
  Recorder rec(path);
  for (const auto& [k, v] : s.metadata) rec.metadata(k, v);
  std::vector<std::uint32_t> ids(s.texts.size(), 0);
  for (std::size_t i = 1; i < s.texts.size(); ++i) ids[i] = rec.intern(s.texts[i]);
  // The seed's frames and stacks, in order, so that its stack ids mean the same again (a
  // mutated stack id may point nowhere).
  auto text_id = [&](std::uint32_t id) { return id < ids.size() ? ids[id] : id; };
  for (FrameRecord f : s.frames) {
    f.file_id = text_id(f.file_id);
    f.function_id = text_id(f.function_id);
    f.module_id = text_id(f.module_id);
    rec.intern_frame(f);
  }
  for (const auto& [frames, site] : s.stacks) rec.intern_stack(frames.data(), frames.size(), site);
  for (Event e : s.events) {
    e.string_id = e.string_id < ids.size() ? ids[e.string_id] : e.string_id;
    rec.record_timed(e);
  }
  rec.close();
  if (rec.failed()) throw std::runtime_error("cannot write the mutated trace: " + rec.error());
}

// --- Pickle trees (structure-aware: valid pickles with wrong content) ----------------------------

void write_scalar(detail::PickleWriter& w, Rng& rng) {
  switch (rng.below(7)) {
    case 0: w.none(); break;
    case 1: w.boolean(rng.chance(50)); break;
    case 2: w.unsigned_integer(interesting(rng)); break;
    case 3: w.integer(-static_cast<std::int64_t>(rng.below(1u << 20)) - 1); break;
    case 4: w.real(rng.chance(50) ? -1e300 : 0.5); break;
    case 5: w.str(rng.chance(50) ? "alloc" : "free_completed"); break;
    default: w.begin_list().end_list(); break;
  }
}

// Each value is changed with probability `p` per mille.
void write_tree(detail::PickleWriter& w, const PickleValue& v, Rng& rng, unsigned p) {
  if (rng.permille(p)) {
    write_scalar(w, rng);
    return;
  }
  switch (v.type) {
    case PickleValue::Type::None: w.none(); break;
    case PickleValue::Type::Bool: w.boolean(v.boolean); break;
    case PickleValue::Type::Int:
      if (v.negative) {
        std::int64_t x = 0;
        if (v.to_int64(&x)) w.integer(x); else w.integer(INT64_MIN);
      } else {
        w.unsigned_integer(rng.permille(p) ? v.magnitude + interesting(rng) : v.magnitude);
      }
      break;
    case PickleValue::Type::Float: w.real(v.real); break;
    case PickleValue::Type::Str: w.str(v.str()); break;
    case PickleValue::Type::Bytes: w.str(v.bytes()); break;  // (the writer has no bytes; the seeds none)
    case PickleValue::Type::Set: w.begin_list().end_list(); break;
    case PickleValue::Type::List:
    case PickleValue::Type::Tuple: {
      const bool tuple = v.type == PickleValue::Type::Tuple && v.list().size() <= 3;
      if (tuple) w.begin_tuple(); else w.begin_list();
      for (const PickleValue& item : v.list()) {
        if (!tuple && rng.permille(p)) continue;  // dropped
        write_tree(w, item, rng, p);
        if (!tuple && rng.permille(p)) write_tree(w, item, rng, p);  // repeated
      }
      if (tuple) w.end_tuple(); else w.end_list();
      break;
    }
    case PickleValue::Type::Dict:
      w.begin_dict();
      for (const auto& [k, item] : v.dict()) {
        if (rng.permille(p)) continue;  // a key missing
        if (k.is_str()) w.key(k.str()); else w.integer(0);
        write_tree(w, item, rng, p);
      }
      w.end_dict();
      break;
  }
}

std::string mutate_tree(const PickleValue& root, Rng& rng) {
  detail::PickleWriter w(rng.chance(50));
  write_tree(w, root, rng, 1 + static_cast<unsigned>(rng.below(12)));
  w.finish();
  return w.take();
}

}  // namespace

namespace {
// A seed must read back whole; otherwise the mutations would say nothing.
void require_readable_seed(const std::string& bytes) {
  TempPath p;
  spill(p.str(), bytes);
  REQUIRE(read_all(p.str()) > 10);
  const Report r = analyze_trace(p.str());
  REQUIRE_FALSE(r.trace.truncated);
  REQUIRE(r.allocations > 0);
}

void require_readable_snapshot(const std::string& bytes) {
  TempPath p(".pickle");
  spill(p.str(), bytes);
  const Report r = analyze_snapshot(p.str());
  REQUIRE(r.snapshot.has_value());
  REQUIRE(r.allocations > 0);
}
}  // namespace

SCENARIO("corrupt trace files are refused with a TraceError or read as a truncated prefix, never a crash",
         "[core][fuzz][trace]") {
  GIVEN("valid CPU and CUDA traces of a training step, written by the Recorder, and a bounded trace") {
    const std::string seeds[3] = {step_trace_bytes(false), step_trace_bytes(true), bounded_trace_bytes()};
    for (const std::string& seed : seeds) require_readable_seed(seed);
    WHEN("their bytes are mutated: flips, insertions, deletions, truncations, inflated lengths, splices") {
      const std::uint64_t n = iterations();
      Rng rng = rng_for(1);
      Outcomes o{"trace bytes"};
      TempPath path(".trace_bytes");
      for (std::uint64_t i = 0; i < n; ++i) {
        spill(path.str(), mutate_bytes(seeds[i % 3], rng, seeds[(i + 1) % 3], kTraceTokens));
        o.run<TraceError>(i, [&] {
          read_all(path.str());
          (void)analyze_trace(path.str()).to_json();
        });
      }
      o.report();
      THEN("each read delivered events or threw a TraceError naming the problem; both happened") {
        CHECK(o.unexpected == 0);
        CHECK(o.ok + o.refused == n);
        CHECK(o.ok > 0);
        CHECK(o.refused > 0);
      }
    }
    WHEN("a chunk's records are mutated and the chunk gets a correct length and checksum") {
      // Past the checksum, the record decoder and the analysis see the damage. The file header
      // is intact, so nothing may throw: a corrupt record ends the stream (truncated prefix).
      const std::uint64_t n = iterations();
      Rng rng = rng_for(2);
      Outcomes o{"trace chunks"};
      TempPath path(".trace_chunks");
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::string& seed = seeds[i % 3];
        std::vector<Chunk> chunks = split_chunks(seed);
        REQUIRE_FALSE(chunks.empty());
        Chunk& c = chunks[rng.below(chunks.size())];
        std::vector<std::string> records = split_records(c.payload);
        switch (records.empty() ? 0 : rng.below(4)) {
          case 0: c.payload = mutate_bytes(c.payload, rng, seeds[(i + 1) % 3], kTraceTokens); break;
          case 1: c.records = static_cast<std::uint32_t>(rng.chance(50) ? c.records + rng.below(3) - 1 : interesting(rng)); break;
          default: {  // one record's bytes changed, dropped, repeated or moved; the count kept right
            const std::size_t r = static_cast<std::size_t>(rng.below(records.size()));
            switch (rng.below(4)) {
              case 0: records[r] = mutate_bytes(records[r], rng, records[rng.below(records.size())], kTraceTokens); break;
              case 1: records.erase(records.begin() + static_cast<std::ptrdiff_t>(r)); break;
              case 2: records.insert(records.begin() + static_cast<std::ptrdiff_t>(r), records[rng.below(records.size())]); break;
              default: std::swap(records[r], records[rng.below(records.size())]); break;
            }
            c.payload.clear();
            for (const std::string& rec : records) c.payload += rec;
            c.records = static_cast<std::uint32_t>(records.size());
            break;
          }
        }
        spill(path.str(), join_chunks(seed, chunks));
        o.run<NoError>(i, [&] {
          read_all(path.str());
          (void)analyze_trace(path.str()).to_json();
        });
      }
      o.report();
      THEN("every file opened, and the reader and the analysis delivered the readable prefix") {
        CHECK(o.unexpected == 0);
        CHECK(o.ok == n);
      }
    }
  }
}

SCENARIO("readable traces of weird event sequences are analysed without error or undefined behaviour",
         "[core][fuzz][analysis]") {
  GIVEN("the events of valid CPU and CUDA traces") {
    Script seeds[2];
    for (int k = 0; k < 2; ++k) {
      TempPath p;
      spill(p.str(), step_trace_bytes(k == 1));
      seeds[k] = read_script(p.str());
      REQUIRE(seeds[k].events.size() > 5);
    }
    WHEN("events are repeated (double allocs, double frees), dropped (frees of unknown addresses), "
         "reordered (time going backwards), or given zero sizes, sizes near UINT64_MAX, other "
         "devices, unknown string ids and corrupt run metadata") {
      const std::uint64_t n = iterations();
      Rng rng = rng_for(3);
      Outcomes o{"event sequences"};
      TempPath path(".trace_events"), pickle(".trace_events_pickle");
      for (std::uint64_t i = 0; i < n; ++i) {
        const Script s = mutate_script(seeds[i % 2], rng, kRunJson);
        AnalysisOptions options;
        options.top_blocks = static_cast<std::size_t>(rng.below(4));
        options.top_labels = static_cast<std::size_t>(rng.below(4));
        options.timeline_columns = static_cast<std::size_t>(1 + rng.below(5));
        if (rng.chance(30)) options.probe_time_ns = rng.chance(50) ? rng.below(6000) : interesting(rng);
        const bool export_snapshot = rng.chance(25);
        o.run<NoError>(i, [&] {
          write_script(s, path.str());
          (void)analyze_trace(path.str(), options).to_json();
          (void)attribute_blocks(path.str());
          if (export_snapshot) {
            write_snapshot(path.str(), pickle.str());
            (void)analyze_snapshot(pickle.str()).to_json();
          }
        });
      }
      o.report();
      THEN("each trace was analysed (and exported and read back as a snapshot) without an error") {
        CHECK(o.unexpected == 0);
        CHECK(o.ok == n);
      }
    }
  }
}

SCENARIO("hostile or corrupt snapshot pickles are refused with a PickleError or SnapshotError, never a crash",
         "[core][fuzz][snapshot]") {
  GIVEN("snapshots in torch's layout (protocol 4, and 5 in a FRAME as Python 3.14 writes) and ridgescope's exports of CPU and CUDA traces") {
    const std::string seeds[4] = {torch_snapshot_bytes(), exported_snapshot_bytes(step_trace_bytes(false)),
                                  exported_snapshot_bytes(step_trace_bytes(true)), protocol5_snapshot_bytes()};
    for (const std::string& s : seeds) require_readable_snapshot(s);
    WHEN("their bytes are mutated, with pickle opcodes, huge lengths and memo indices spliced in") {
      const std::uint64_t n = iterations();
      Rng rng = rng_for(4);
      Outcomes parsed{"pickle bytes"}, analysed{"snapshot bytes"};
      TempPath path(".pickle_bytes");
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::string bytes = mutate_bytes(seeds[i % 4], rng, seeds[(i + 1) % 4], kPickleTokens);
        spill(path.str(), bytes);
        parsed.run<detail::PickleError>(i, [&] {
          const detail::PickleResult r = detail::parse_pickle(bytes);
          if (r.protocol < 2 || r.protocol > 5) throw std::logic_error("protocol out of range");
        });
        analysed.run<SnapshotError>(i, [&] { (void)analyze_snapshot(path.str()).to_json(); });
      }
      parsed.report();
      analysed.report();
      THEN("each pickle parsed or was refused with a PickleError; each snapshot read or threw a SnapshotError") {
        CHECK(parsed.unexpected == 0);
        CHECK(analysed.unexpected == 0);
        CHECK(parsed.refused > 0);
        CHECK(analysed.ok > 0);  // some mutants stay usable snapshots, so the replay is fuzzed too
      }
    }
    WHEN("valid pickles are written with wrong content: values replaced by other types, huge or "
         "negative integers, keys missing, list items dropped or repeated") {
      const std::uint64_t n = iterations();
      Rng rng = rng_for(5);
      Outcomes o{"snapshot trees"};
      std::vector<detail::PickleResult> trees;
      for (const std::string& s : seeds) trees.push_back(detail::parse_pickle(s));
      TempPath path(".pickle_tree");
      for (std::uint64_t i = 0; i < n; ++i) {
        spill(path.str(), mutate_tree(trees[i % 4].root, rng));
        o.run<SnapshotError>(i, [&] { (void)analyze_snapshot(path.str()).to_json(); });
      }
      o.report();
      THEN("each snapshot was read or refused with a SnapshotError naming the place") {
        CHECK(o.unexpected == 0);
        CHECK(o.ok > 0);
        CHECK(o.refused > 0);
      }
    }
  }
}

SCENARIO("corrupt run metadata JSON gets an error message, and what parses writes back as valid JSON",
         "[core][fuzz][json]") {
  GIVEN("the run, session and driver_view metadata a trace carries") {
    const std::string seeds[3] = {kRunJson, kSessionJson, kDriverJson};
    WHEN("the texts are mutated") {
      const std::uint64_t n = iterations() * 4;  // cheap: no files
      Rng rng = rng_for(6);
      Outcomes o{"json"};
      std::uint64_t parsed = 0, refused = 0;
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::string text = mutate_bytes(seeds[i % 3], rng, seeds[(i + 1) % 3], kJsonTokens);
        if (verbose()) std::cerr << "json " << i << ": " << text << '\n';
        o.run<NoError>(i, [&] {
          std::string error;
          const auto v = detail::parse_json(text, &error);
          if (!v) {
            if (error.empty()) throw std::logic_error("refused without a message");
            ++refused;
            return;
          }
          ++parsed;
          detail::JsonWriter w1;
          detail::write_json_value(w1, *v);
          const std::string once = w1.take();
          const auto back = detail::parse_json(once, &error);
          if (!back) throw std::logic_error("written JSON does not parse: " + error + ": " + once);
          detail::JsonWriter w2;
          detail::write_json_value(w2, *back);
          if (w2.take() != once) throw std::logic_error("written JSON does not write back the same: " + once);
        });
      }
      o.report();
      THEN("every text parsed or was refused with a message; none threw") {
        CHECK(o.unexpected == 0);
        CHECK(parsed > 0);
        CHECK(refused > 0);
      }
    }
  }
}

SCENARIO("malformed allocator settings are refused with a message; accepted ones drive the model safely",
         "[core][fuzz][allocator]") {
  GIVEN("PYTORCH_CUDA_ALLOC_CONF strings torch accepts") {
    const std::string seeds[3] = {
        "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:4",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],garbage_collection_threshold:0.6,"
        "per_process_memory_fraction:0.5",
        "backend:native,large_segment_size_mb:64,max_non_split_rounding_mb:40,pinned_use_cuda_host_register:True"};
    for (const std::string& s : seeds) {
      std::string error;
      AllocatorSettings settings;
      REQUIRE(parse_allocator_settings(s, &settings, &error));
    }
    WHEN("the strings are mutated and the accepted settings serve requests of boundary sizes") {
      const std::uint64_t n = iterations() * 2;
      Rng rng = rng_for(7);
      Outcomes o{"allocator settings"};
      std::uint64_t accepted = 0, refused = 0;
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::string text = mutate_bytes(seeds[i % 3], rng, seeds[(i + 1) % 3], kSettingsTokens);
        const std::uint64_t capacity = rng.chance(50) ? 0 : (rng.chance(50) ? interesting(rng) : 80ull << 30);
        std::vector<std::uint64_t> sizes;
        for (int k = 0; k < 12; ++k) sizes.push_back(rng.chance(50) ? interesting(rng) : rng.below(64ull << 20));
        if (verbose()) {
          std::cerr << "allocator settings " << i << ": '" << text << "' capacity " << capacity << " sizes";
          for (std::uint64_t b : sizes) std::cerr << ' ' << b;
          std::cerr << '\n';
        }
        o.run<NoError>(i, [&] {
          AllocatorSettings s;
          s.capacity_bytes = capacity;
          std::string error;
          if (!parse_allocator_settings(text, &s, &error)) {
            if (error.empty()) throw std::logic_error("refused without a message");
            ++refused;
            return;
          }
          ++accepted;
          const std::string canonical = format_allocator_settings(s);
          AllocatorSettings again;
          if (!parse_allocator_settings(canonical, &again, &error) || format_allocator_settings(again) != canonical) {
            throw std::logic_error("the canonical form '" + canonical + "' does not parse back: " + error);
          }
          AllocatorModel model(s);
          std::vector<std::uint64_t> live;
          for (std::size_t k = 0; k < sizes.size(); ++k) {
            if (model.malloc(k, sizes[k], k % 2).ok()) live.push_back(k);
            if (k % 4 == 3 && !live.empty()) {
              model.free(live.front());
              live.erase(live.begin());
            }
          }
          for (std::uint64_t id : live) model.free(id);
          model.empty_cache();
          if (model.allocated_bytes() != 0) throw std::logic_error("bytes still allocated after every free");
        });
      }
      o.report();
      THEN("every string was accepted or refused with a message, and the model never failed") {
        CHECK(o.unexpected == 0);
        CHECK(accepted > 0);
        CHECK(refused > 0);
      }
    }
  }
}

namespace {
// A short unicode string opcode.
std::string pickle_str(const std::string& s) {
  std::string out(1, '\x8c');
  out.push_back(static_cast<char>(s.size()));
  return out + s;
}

// {"device_traces": [[entry, entry, ...]]} where every entry is the same memoized dict whose
// 'frames' list holds `frames` references to one frame dict: `entries` x `frames` frames to
// visit from a file of about 2 x (entries + frames) bytes.
std::string frame_bomb(int entries, int frames) {
  std::string p = "\x80\x04}(" + pickle_str("device_traces") + "](](";
  p += "}(" + pickle_str("action") + pickle_str("alloc") + pickle_str("addr") + "K\x01" + pickle_str("size") + "K\x01";
  p += pickle_str("frames") + "](";
  p += "}(" + pickle_str("filename") + pickle_str("torch/optim/adam.py") + pickle_str("name") + pickle_str("f") + "uq\x01";
  for (int i = 1; i < frames; ++i) p += "h\x01";
  p += "eu";     // the frames list, then the entry dict's items
  p += std::string("q\0", 2);  // the entry, memoized
  for (int i = 1; i < entries; ++i) p += std::string("h\0", 2);
  p += "eeu.";
  return p;
}
}  // namespace

SCENARIO("a snapshot pickle that references one list from many places (a decompression bomb) is refused",
         "[core][fuzz][snapshot]") {
  GIVEN("a pickle of a few KiB whose entries all share one frames list") {
    TempPath pickle(".pickle");
    const std::string bytes = frame_bomb(3000, 3000);  // 9 million frames to copy
    REQUIRE(bytes.size() < 16 * 1024);
    spill(pickle.str(), bytes);
    THEN("the pickle itself is valid: memo references share the containers, nothing is copied") {
      const detail::PickleResult r = detail::parse_pickle(bytes);
      CHECK(r.values < 20);
    }
    THEN("the snapshot reader refuses it with a SnapshotError before copying the frames") {
      std::string message;
      try {
        analyze_snapshot(pickle.str());
      } catch (const SnapshotError& e) {
        message = e.what();
      }
      CHECK(message.find("decompression bomb") != std::string::npos);
      CHECK(message.find("device_traces[0][") != std::string::npos);
    }
  }
  GIVEN("the same layout with few references (each list used once or twice)") {
    TempPath pickle(".pickle");
    spill(pickle.str(), frame_bomb(2, 40));
    THEN("it is read: the limit only counts what the file's own bytes could not hold") {
      const Report r = analyze_snapshot(pickle.str());
      REQUIRE(r.snapshot.has_value());
      CHECK(r.snapshot->trace_entries == 2);
    }
  }
}

// The cases the fuzz found, as specifications.

SCENARIO("a trace whose clock jumps to near 2^64 is analysed, with the dashboards' samples counted",
         "[core][fuzz][analysis]") {
  GIVEN("an allocation at 1000 ns freed at UINT64_MAX - 5 ns (a corrupt or hostile time)") {
    TempPath trace;
    const std::uint64_t end = UINT64_MAX - 5;
    {
      TraceBuilder t(trace.str());
      t.at(1000).alloc(0x1000, 4096);
      t.at(end).free(0x1000);
      t.close();
    }
    WHEN("it is analysed") {
      const Report r = analyze_trace(trace.str());  // stepping the samplers never ended here
      THEN("each sampler counts one sample per period from the first event, and saw the 4096 bytes") {
        REQUIRE(r.dashboards.size() == 2);
        for (const SamplerView& d : r.dashboards) {
          CHECK(d.samples == (end - 1000) / d.period_ns + 1);
          CHECK(d.max_sample_bytes == 4096);
        }
        CHECK(r.final_live_bytes == 0);
      }
    }
  }
}

SCENARIO("an allocator reading near 2^64 is a mismatch whose difference saturates", "[core][fuzz][analysis]") {
  GIVEN("4096 live bytes and an allocator_live_bytes reading of UINT64_MAX") {
    TempPath trace;
    {
      TraceBuilder t(trace.str());
      t.alloc(0x1000, 4096).sample(UINT64_MAX);
      t.close();
    }
    const Report r = analyze_trace(trace.str());
    THEN("the ledger-minus-allocator difference is the most negative int64, not an overflow") {
      CHECK(r.consistency.samples == 1);
      CHECK(r.consistency.mismatches == 1);
      CHECK(r.consistency.first_difference_bytes == INT64_MIN);
    }
  }
}

SCENARIO("the allocator model refuses requests no device could serve as out of memory", "[core][fuzz][allocator]") {
  GIVEN("the default settings with no capacity set") {
    AllocatorModel m;
    WHEN("UINT64_MAX bytes are requested (rounding it up would wrap to 0)") {
      const MallocResult r = m.malloc(1, UINT64_MAX);
      THEN("it is out of memory, nothing is allocated, and the model still serves requests") {
        CHECK(r.status == MallocStatus::OutOfMemory);
        CHECK(m.allocated_bytes() == 0);
        CHECK(m.reserved_bytes() == 0);
        const MallocResult ok = m.malloc(2, 1000);
        CHECK(ok.ok());
        CHECK(m.allocated_bytes() == 1024);
      }
    }
  }
  GIVEN("expandable segments with no capacity set (1 TiB of address space per segment, 1 1/8 reserved)") {
    AllocatorSettings s;
    s.expandable_segments = true;
    AllocatorModel m(s);
    WHEN("2 TiB are requested, more than the segment's address space") {
      const MallocResult r = m.malloc(1, 2ull << 40);
      THEN("it is out of memory instead of walking past the segment's last block") {
        CHECK(r.status == MallocStatus::OutOfMemory);
        CHECK(m.allocated_bytes() == 0);
        const MallocResult ok = m.malloc(2, 3ull << 20);
        CHECK(ok.ok());
        CHECK(m.allocated_bytes() == 3ull << 20);
      }
    }
  }
}
