// trace_builder.h — writes a scripted trace through the real Recorder, for specification tests.
#pragma once

#include <cstdio>
#include <string>
#include <unistd.h>

#include "ridgescope/category.h"
#include "ridgescope/event.h"
#include "ridgescope/recorder.h"

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
  TraceBuilder& oom(std::uint64_t request, std::uint64_t device_free) {
    Event e = make(EventKind::Oom);
    e.bytes = request;
    e.value = device_free;
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

}  // namespace ridgescope::testing
