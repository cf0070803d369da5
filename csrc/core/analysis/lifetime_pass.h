// lifetime_pass.h — pass 1 of the analysis (analysis.cpp, see ridgescope/analysis.h): one
// streaming read of the trace that follows every block's lifetime through the phases and tags,
// decides the category it has for its whole life (docs/categories.md), and finds the peak of
// every device. Internal to the analysis layer.
//
// Thread-safety: none; one pass per analysis.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ridgescope/category.h"
#include "ridgescope/event.h"
#include "ridgescope/phase.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope::detail {

// Device and address in one key: user-space addresses fit in 48 bits on every platform torch
// supports, so the device code takes the top 16.
inline std::uint64_t device_code(Device d) {
  return (static_cast<std::uint64_t>(d.type) << 8) |
         static_cast<std::uint64_t>(static_cast<std::uint8_t>(d.index + 1));
}
inline std::uint64_t block_key(Device d, std::uint64_t addr) {
  return (device_code(d) << 48) ^ addr;
}
inline Device device_from_code(std::uint64_t code) {
  Device d;
  d.type = static_cast<DeviceType>(code >> 8);
  d.index = static_cast<std::int16_t>(static_cast<int>(code & 0xFF) - 1);
  return d;
}

// The category a block gets for its whole life, decided in pass 1 (indexed by block id: the
// order of the trace's allocations).
struct Resolved {
  Category category = Category::Unknown;
  bool inferred = false;
  std::uint32_t label_id = 0;
};

class LifetimePass {
 public:
  struct DevicePeak {
    std::uint64_t live = 0, peak = 0, peak_seq = 0;
    bool seen = false;
  };

  void run(TraceReader& reader);

  const std::vector<Resolved>& resolved() const { return resolved_; }
  const absl::flat_hash_map<std::uint64_t, DevicePeak>& peaks() const { return peaks_; }
  std::uint64_t events() const { return events_; }
  std::uint64_t last_time() const { return last_time_; }

 private:
  struct Instance {
    PhaseKind kind;
    std::uint32_t name_id;
    bool open;
  };
  struct Pending {
    std::uint64_t block_id, alloc_seq, bytes, idle_epoch;
    std::int32_t instance;  // innermost open phase at alloc, -1 when idle
    bool forwardish, in_backward, in_optimizer, in_compile;
    bool has_strong = false, has_weak = false, strong_inferred = false;
    Category strong = Category::Unknown, weak = Category::Unknown;
    std::uint32_t strong_label = 0, weak_label = 0;
  };

  bool stack_has(PhaseKind kind) const;
  void on_alloc(const Event& e);
  void on_free(const Event& e);
  void on_tag(const Event& e);
  void on_phase_begin(const Event& e, std::string_view name);
  void on_phase_end(const Event& e);
  // Decides a block's category for its whole life, in the order of docs/categories.md.
  void resolve(const Pending& p, bool freed);

  absl::flat_hash_map<std::uint64_t, Pending> live_;
  absl::flat_hash_map<std::uint64_t, DevicePeak> peaks_;
  std::vector<Resolved> resolved_;
  std::vector<Instance> instances_;
  std::vector<std::uint32_t> stack_;
  std::uint64_t next_block_id_ = 0;
  std::uint64_t idle_epoch_ = 0;
  std::uint64_t last_forward_begin_seq_ = 0;
  bool have_forward_ = false;
  std::uint64_t events_ = 0;
  std::uint64_t last_seq_ = 0;
  std::uint64_t last_time_ = 0;
};

}  // namespace ridgescope::detail
