// trace_builder.h — writes a scripted trace through the real Recorder, for specification tests.
#pragma once

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <unistd.h>
#include <vector>

#include "ridgescope/category.h"
#include "ridgescope/event.h"
#include "ridgescope/recorder.h"
#include "ridgescope/stack.h"

namespace ridgescope::testing {

// A fresh temporary path, removed when the object dies.
class TempPath {
 public:
  explicit TempPath(const std::string& suffix = ".rstrace") {
    static int counter = 0;
    path_ = "/tmp/ridgescope_test_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter++) + suffix;
  }
  ~TempPath() { std::remove(path_.c_str()); }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

class TraceBuilder {
 public:
  explicit TraceBuilder(const std::string& path, Device device = {}) : recorder_(path), device_(device) {}

  TraceBuilder& alloc(std::uint64_t addr, std::uint64_t bytes) {
    Event e = make(EventKind::Alloc, addr);
    e.bytes = e.requested_bytes = bytes;
    return emit(e);
  }
  // An allocation made at stack `stack_id` (see frame() and stack()).
  TraceBuilder& alloc(std::uint64_t addr, std::uint64_t bytes, std::uint32_t stack_id) {
    Event e = make(EventKind::Alloc, addr);
    e.bytes = e.requested_bytes = bytes;
    e.stack_id = stack_id;
    return emit(e);
  }
  // An allocation made while module `context` ran (the module context the sources record).
  TraceBuilder& alloc_in(std::uint64_t addr, std::uint64_t bytes, const std::string& context) {
    Event e = make(EventKind::Alloc, addr);
    e.bytes = e.requested_bytes = bytes;
    e.string_id = recorder_.intern(context);
    return emit(e);
  }
  // Interns a frame / a stack (frame ids innermost first; `site` its site's position).
  std::uint32_t frame(FrameKind kind, const std::string& file, std::uint64_t line, const std::string& function,
                      const std::string& module = "") {
    return recorder_.intern_frame(FrameText{kind, file, line, function, module});
  }
  std::uint32_t python_frame(const std::string& file, std::uint64_t line, const std::string& function) {
    return frame(FrameKind::Python, file, line, function);
  }
  std::uint32_t stack(std::initializer_list<std::uint32_t> frames, std::uint32_t site = 0) {
    const std::vector<std::uint32_t> v(frames);
    return recorder_.intern_stack(v.data(), v.size(), site);
  }
  TraceBuilder& free(std::uint64_t addr, std::uint64_t bytes = 0) {
    Event e = make(EventKind::Free, addr);
    e.bytes = bytes;
    return emit(e);
  }
  TraceBuilder& tag(std::uint64_t addr, Category c, const std::string& label, bool weak = false) {
    Event e = make(EventKind::Tag, addr);
    e.category = c;
    e.flags = weak ? kTagWeak : 0;
    e.string_id = recorder_.intern(label);
    return emit(e);
  }
  TraceBuilder& segment(std::uint64_t addr, std::uint64_t bytes) {
    Event e = make(EventKind::SegmentAlloc, addr);
    e.bytes = bytes;
    return emit(e);
  }
  TraceBuilder& begin(const std::string& phase) { return phase_event(EventKind::PhaseBegin, phase); }
  TraceBuilder& end(const std::string& phase) { return phase_event(EventKind::PhaseEnd, phase); }
  TraceBuilder& step(std::uint64_t n) {
    Event e = make(EventKind::Step);
    e.value = n;
    return emit(e);
  }
  TraceBuilder& sample(std::uint64_t live_bytes) {
    Event e = make(EventKind::Sample);
    e.string_id = recorder_.intern("allocator_live_bytes");
    e.value = live_bytes;
    return emit(e);
  }
  // A sample under any key (the driver's view, host memory: docs/trace_format.md).
  TraceBuilder& sample(const std::string& key, std::uint64_t value) {
    Event e = make(EventKind::Sample);
    e.string_id = recorder_.intern(key);
    e.value = value;
    return emit(e);
  }
  // Device memory allocated / freed outside PyTorch (kinds 13 and 14), by `library` with `api`.
  TraceBuilder& external_alloc(std::uint64_t addr, std::uint64_t bytes, const std::string& library,
                               std::uint8_t api, std::uint32_t stack_id = 0) {
    Event e = make(EventKind::ExternalAlloc, addr);
    e.bytes = bytes;
    e.flags = api;
    e.string_id = recorder_.intern(library);
    e.stack_id = stack_id;
    return emit(e);
  }
  TraceBuilder& external_free(std::uint64_t addr, std::uint64_t bytes, std::uint8_t api) {
    Event e = make(EventKind::ExternalFree, addr);
    e.bytes = bytes;
    e.flags = api;
    return emit(e);
  }
  TraceBuilder& segment_free(std::uint64_t addr, std::uint64_t bytes) {
    Event e = make(EventKind::SegmentFree, addr);
    e.bytes = bytes;
    return emit(e);
  }
  TraceBuilder& oom(std::uint64_t request, std::uint64_t device_free) {
    Event e = make(EventKind::Oom);
    e.bytes = request;
    e.value = device_free;
    return emit(e);
  }
  // rs.mark(name) (format 4).
  TraceBuilder& mark(const std::string& name) {
    Event e = make(EventKind::Mark);
    e.string_id = recorder_.intern(name);
    return emit(e);
  }
  TraceBuilder& metadata(const std::string& key, const std::string& json) {
    recorder_.metadata(key, json);
    return *this;
  }
  // From now on, events carry this time (nanoseconds) instead of the clock's.
  TraceBuilder& at(std::uint64_t time_ns) {
    explicit_time_ = true;
    time_ns_ = time_ns;
    return *this;
  }
  void close() { recorder_.close(); }
  Recorder& recorder() { return recorder_; }

 private:
  TraceBuilder& phase_event(EventKind kind, const std::string& phase) {
    Event e = make(kind);
    e.string_id = recorder_.intern(phase);
    return emit(e);
  }
  Event make(EventKind kind, std::uint64_t addr = 0) const {
    Event e;
    e.kind = kind;
    e.device = device_;
    e.addr = addr;
    return e;
  }
  TraceBuilder& emit(Event e) {
    if (explicit_time_) {
      e.time_ns = time_ns_;
      recorder_.record_timed(e);
    } else {
      recorder_.record(e);
    }
    return *this;
  }
  Recorder recorder_;
  Device device_;
  bool explicit_time_ = false;
  std::uint64_t time_ns_ = 0;
};

// What write_adam_step() adds to the plain step (for specs that need the extra records).
struct AdamStepExtras {
  std::uint64_t forward_sample_bytes = 0;  // an allocator_live_bytes sample in forward; 0: none
  std::uint64_t oom_request_bytes = 0;     // a failed request in the optimizer step; 0: none
  std::uint64_t oom_device_free_bytes = 0;
};

// One CPU training step of a two-layer model with Adam, a known trace for several specs:
// parameters (4096 + 1024 B), an input (512 B), a saved activation (2048 B), a temporary (700 B)
// in forward; gradients (1024 + 4096 B) and a temporary (2048 B) in backward; optimizer state
// created lazily (4096 + 1024 B) and a temporary (512 B) in the optimizer step. Times 1000 ns
// (parameters), 2000 (forward), 3000 (backward), 4000 (optimizer step). Closes the trace.
inline void write_adam_step(TraceBuilder& t, const AdamStepExtras& extras = {}) {
  t.at(1000);
  t.alloc(0x1000, 4096).tag(0x1000, Category::Parameter, "fc1.weight");
  t.alloc(0x3000, 1024).tag(0x3000, Category::Parameter, "fc2.weight");
  t.alloc(0x10000, 512);
  t.at(2000).begin("forward").tag(0x10000, Category::Input, "input", true);
  t.alloc(0x20000, 2048).tag(0x20000, Category::Activation, "activation saved in fc1", true);
  t.alloc(0x30000, 700).free(0x30000);
  if (extras.forward_sample_bytes != 0) t.sample(extras.forward_sample_bytes);
  t.end("forward");
  t.at(3000).begin("backward");
  t.alloc(0x60000, 1024).tag(0x60000, Category::Gradient, "grad of fc2.weight");
  t.alloc(0x70000, 2048);
  t.alloc(0x80000, 4096).tag(0x80000, Category::Gradient, "grad of fc1.weight");
  t.free(0x70000).free(0x20000);
  t.end("backward");
  t.at(4000).begin("optimizer_step");
  t.alloc(0x90000, 4096).alloc(0xB0000, 1024);
  t.alloc(0xE0000, 512).free(0xE0000);
  t.tag(0x90000, Category::OptimizerState, "exp_avg of fc1.weight");
  t.tag(0xB0000, Category::OptimizerState, "exp_avg of fc2.weight");
  if (extras.oom_request_bytes != 0) t.oom(extras.oom_request_bytes, extras.oom_device_free_bytes);
  t.end("optimizer_step").step(0);
  t.close();
}

}  // namespace ridgescope::testing
