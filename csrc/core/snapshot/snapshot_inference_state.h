// snapshot_inference_state.h — the state of SnapshotInference (snapshot_inference.h) that its rules
// share, internal to the files that hold them: snapshot_inference.cpp (the replayed stream and the
// order of the rules), snapshot_frame_rules.cpp (rules on a block's frames), snapshot_lifetime_rules.cpp
// (rules on lifetimes over the phases), snapshot_matching_rules.cpp (rules that match blocks with each
// other: sizes, replacements, the repeated step).
//
// Thread-safety: none; one instance per replay.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ridgescope/category.h"
#include "snapshot_frames.h"
#include "snapshot_inference.h"

namespace ridgescope::detail {

struct SnapshotInference::Impl {
  static constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
  static constexpr std::size_t kMaxUserRules = 64;

  enum PhaseBit : std::uint32_t {
    kForward = 1, kBackward = 2, kOptimizer = 4, kZeroGrad = 8, kRecompute = 16, kOtherPhase = 32,
  };
  static std::uint32_t phase_bit(std::string_view name);
  static bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

  struct UserRule {
    std::string name;
    Category category;
    bool any_name, any_file;
    std::regex name_re, file_re;
  };

  struct Instance {
    std::uint32_t bit = 0;
    std::string name;
    std::uint64_t begin_op = 0, end_op = kNever;
    bool open = true;
  };

  struct Block {
    std::uint64_t addr = 0, bytes = 0, requested = 0;
    const SnapshotFrames* frames = nullptr;       // allocation stack (null: none)
    const SnapshotFrames* free_frames = nullptr;  // the free entry's stack
    std::uint64_t alloc_op = 0, free_op = kNever;
    std::int32_t alloc_instance = -1;   // innermost open phase at alloc (-1: idle)
    std::int32_t backward_at_alloc = -1, optimizer_at_alloc = -1, optimizer_at_free = -1;
    std::uint32_t alloc_bits = 0, free_bits = 0;
    std::uint32_t last_begun_bit = 0;   // the phase that began last before the alloc (0: none)
    std::uint64_t alloc_idle_epoch = 0;
    bool before_trace = false;
    bool freed_in_trace = false;        // a free the trace recorded (not the end state's)
    bool freed_in_alloc_phase = false;  // still inside the phase (or idle stretch) it was made in
    std::optional<Category> recorded;
    bool decided = false;
    Category category = Category::Unknown;
    InferenceRule rule = InferenceRule::Unknown;
    std::uint32_t reason = 0;

    bool has_frames() const { return frames != nullptr && !frames->empty(); }
    // For lifetimes: the op at which the trace saw it freed (kNever: live to the end).
    std::uint64_t lifetime_end() const { return freed_in_trace ? free_op : kNever; }
    std::uint64_t size_key() const { return requested > 0 ? requested : bytes; }
  };

  std::vector<UserRule> user_rules;
  std::vector<Instance> instances;
  std::vector<std::uint32_t> stack;  // open instances, outermost first
  std::vector<Block> blocks;
  absl::flat_hash_map<std::uint64_t, std::uint32_t> live;  // addr -> block
  std::vector<std::uint64_t> forward_begins;                // ops, ascending
  std::vector<std::uint64_t> backward_begins;               // ops, ascending
  std::uint64_t op = 0, idle_epoch = 0;
  std::uint64_t live_bytes = 0, peak = 0, peak_op = kNever;
  std::uint64_t first_backward_op = kNever;
  std::size_t first_backward_instance = 0;
  // Per distinct frame (by its strings' addresses in the parsed pickle): which user rules match.
  absl::flat_hash_map<std::tuple<const char*, std::size_t, const char*, std::size_t>, std::uint64_t> rule_matches;
  std::vector<InferenceReason> reasons;
  absl::flat_hash_map<std::tuple<InferenceRule, Category, std::string>, std::uint32_t> reason_index;
  bool finished = false;
  absl::flat_hash_map<const SnapshotFrames*, std::optional<std::tuple<Category, InferenceRule, std::uint32_t>>>
      frame_verdicts;
  absl::flat_hash_map<const SnapshotFrames*, std::uint64_t> site_hashes;
  bool saw_forward = false;  // a forward phase, or a block made inside an nn.Module call

  std::uint32_t open_bits() const {
    std::uint32_t bits = 0;
    for (auto i : stack) bits |= instances[i].bit;
    return bits;
  }
  std::int32_t open_instance_with(std::uint32_t bit) const {
    for (std::size_t k = stack.size(); k-- > 0;) {
      if (instances[stack[k]].bit == bit) return static_cast<std::int32_t>(stack[k]);
    }
    return -1;
  }
  std::uint64_t first_forward_op() const { return forward_begins.empty() ? kNever : forward_begins.front(); }
  bool before_first_forward(const Block& b) const { return b.before_trace || b.alloc_op < first_forward_op(); }

  // The block's category, rule and reason (the rule's text with `detail`).
  void decide(Block& b, Category category, InferenceRule rule, std::string_view detail = {});

  // snapshot_frame_rules.cpp (function_is: snapshot_frames.h)
  bool rule_recorded(Block& b);
  std::uint64_t user_matches(const SnapshotFrame& f);
  bool rule_user(Block& b);
  bool rule_workspace_frames(Block& b);
  bool rule_optimizer_init_group(Block& b);
  bool rule_accumulate_grad(Block& b);
  bool rule_parameter_frames(Block& b);
  bool rule_data_loader(Block& b);
  bool rule_comm_frames(Block& b);

  // snapshot_lifetime_rules.cpp
  bool rule_gradient_kept(Block& b);
  bool rule_optimizer_state_kept(Block& b);
  bool rule_workspace_size(Block& b);
  bool rule_temporary(Block& b);
  bool rule_activation(Block& b);
  bool rule_forward_output(Block& b);
  bool rule_weights_by_lifetime(Block& b);
  bool rule_forward_frames(Block& b);
  bool rule_input_before_forward(Block& b);

  // snapshot_matching_rules.cpp
  void rule_parameter_matched_gradient();
  void rule_optimizer_state_replaced();
  void rule_comm_buffer_replaced();
  void rule_gradient_zero_grad();
  void rule_parameter_shaped_state();
  void rule_repeated_step();
  std::uint64_t cached_site_hash(const SnapshotFrames* frames);
  static std::uint64_t site_hash(const SnapshotFrames& frames);

  // Decides every block, the rules in their order (snapshot_inference.cpp).
  void run();
};

}  // namespace ridgescope::detail
