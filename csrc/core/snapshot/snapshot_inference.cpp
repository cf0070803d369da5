// snapshot_inference.cpp — categories of a PyTorch snapshot's blocks, with their reasons (see
// snapshot_inference.h and docs/snapshot.md, "Inference rules").
#include "snapshot_inference.h"

#include "snapshot_frames.h"
#include "ridgescope/cuda_workspace.h"

#include <algorithm>
#include <array>
#include <limits>
#include <regex>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "ridgescope/phase.h"

namespace ridgescope::detail {
namespace {

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
constexpr std::size_t kMaxUserRules = 64;

// --- Phases -----------------------------------------------------------------------------------

enum PhaseBit : std::uint32_t {
  kForward = 1, kBackward = 2, kOptimizer = 4, kZeroGrad = 8, kRecompute = 16, kOtherPhase = 32,
};

std::uint32_t phase_bit(std::string_view name) {
  switch (parse_phase_kind(name)) {
    case PhaseKind::Forward: return kForward;
    case PhaseKind::Backward: return kBackward;
    case PhaseKind::OptimizerStep: return kOptimizer;
    case PhaseKind::ZeroGrad: return kZeroGrad;
    case PhaseKind::Recompute: return kRecompute;
    default: return kOtherPhase;
  }
}

struct UserRule {
  std::string name;
  Category category;
  bool any_name, any_file;
  std::regex name_re, file_re;
};

}  // namespace


// --- The aggregator -------------------------------------------------------------------------------

struct SnapshotInference::Impl {
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
    bool after_a_forward = false;       // a forward had begun before the alloc
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

  void decide(Block& b, Category category, InferenceRule rule, std::string_view detail = {}) {
    b.decided = true;
    b.category = category;
    b.rule = rule;
    const std::string text = inference_reason_text(rule, category, detail);
    auto key = std::make_tuple(rule, category, text);
    auto it = reason_index.find(key);
    if (it == reason_index.end()) {
      it = reason_index.emplace(std::move(key), static_cast<std::uint32_t>(reasons.size())).first;
      InferenceReason r;
      r.rule = rule;
      r.category = category;
      r.text = text;
      reasons.push_back(std::move(r));
    }
    b.reason = it->second;
  }

  // ---- rules on one block's frames (in this order) ----

  // recorded: the snapshot names the category itself.
  bool rule_recorded(Block& b) {
    if (!b.recorded) return false;
    decide(b, *b.recorded, InferenceRule::Recorded);
    return true;
  }

  std::uint64_t user_matches(const SnapshotFrame& f) {
    const auto key = std::make_tuple(f.filename.data(), f.filename.size(), f.name.data(), f.name.size());
    auto it = rule_matches.find(key);
    if (it != rule_matches.end()) return it->second;
    std::uint64_t mask = 0;
    const std::string name(f.name), file(f.filename);
    for (std::size_t i = 0; i < user_rules.size(); ++i) {
      const UserRule& r = user_rules[i];
      if ((r.any_name || std::regex_search(name, r.name_re)) && (r.any_file || std::regex_search(file, r.file_re))) {
        mask |= 1ull << i;
      }
    }
    rule_matches.emplace(key, mask);
    return mask;
  }

  // user_rule: the first user rule with a matching frame (innermost frame first).
  bool rule_user(Block& b) {
    if (user_rules.empty() || !b.has_frames()) return false;
    std::uint64_t any = 0;
    for (const SnapshotFrame& f : *b.frames) any |= user_matches(f);
    if (any == 0) return false;
    std::size_t first = 0;
    while ((any & (1ull << first)) == 0) ++first;
    for (const SnapshotFrame& f : *b.frames) {
      if ((user_matches(f) & (1ull << first)) == 0) continue;
      const UserRule& r = user_rules[first];
      decide(b, r.category, InferenceRule::UserRule, "user rule '" + r.name + "' matched " + frame_text(f));
      return true;
    }
    return false;
  }

  // workspace_frames: cuBLAS's per-handle workspace (CublasHandlePool.cpp getNewWorkspace,
  // getCUDABlasLtWorkspace) or a cuDNN convolution's Workspace.
  bool rule_workspace_frames(Block& b) {
    if (!b.has_frames()) return false;
    for (const SnapshotFrame& f : *b.frames) {
      if (contains(f.name, "getNewWorkspace") || contains(f.name, "BlasLtWorkspace") ||
          contains(f.name, "Workspace::Workspace")) {
        decide(b, Category::Workspace, InferenceRule::WorkspaceFrames, frame_text(f));
        return true;
      }
    }
    return false;
  }

  // optimizer_init_group: torch.optim creates each parameter's state lazily in _init_group.
  bool rule_optimizer_init_group(Block& b) {
    if (!b.has_frames()) return false;
    for (const SnapshotFrame& f : *b.frames) {
      if (path_has(f.filename, "torch/optim/") && f.name == "_init_group") {
        decide(b, Category::OptimizerState, InferenceRule::OptimizerInitGroup, frame_text(f));
        return true;
      }
    }
    return false;
  }

  // accumulate_grad: autograd's AccumulateGrad node writes a parameter's .grad.
  bool rule_accumulate_grad(Block& b) {
    if (!b.has_frames()) return false;
    for (const SnapshotFrame& f : *b.frames) {
      if (contains(f.name, "AccumulateGrad") || path_has(f.filename, "accumulate_grad")) {
        decide(b, Category::Gradient, InferenceRule::AccumulateGrad, frame_text(f));
        return true;
      }
    }
    return false;
  }

  // parameter_frames: weights are made (reset_parameters, torch/nn/parameter.py, an nn.Module
  // __init__), moved or cast (Module._apply: .to(), .cuda(), .half()) or loaded
  // (load_state_dict, _load_from_state_dict, from_pretrained). Buffers go the same way.
  bool rule_parameter_frames(Block& b) {
    if (!b.has_frames()) return false;
    for (const SnapshotFrame& f : *b.frames) {
      if (!is_python(f)) continue;
      const bool nn_module = path_has(f.filename, "torch/nn/modules/");
      if (f.name == "reset_parameters" || path_has(f.filename, "torch/nn/parameter.py") ||
          (nn_module && f.name == "__init__") ||
          (path_has(f.filename, "torch/nn/modules/module.py") &&
           (f.name == "_apply" || f.name == "load_state_dict" || f.name == "_load_from_state_dict")) ||
          f.name == "from_pretrained" || f.name == "_load_pretrained_model") {
        decide(b, Category::Parameter, InferenceRule::ParameterFrames, frame_text(f));
        return true;
      }
    }
    return false;
  }

  // data_loader: made by torch.utils.data (collate, pin memory, a dataset on the device).
  bool rule_data_loader(Block& b) {
    if (!b.has_frames()) return false;
    for (const SnapshotFrame& f : *b.frames) {
      if (path_has(f.filename, "torch/utils/data/")) {
        decide(b, Category::Input, InferenceRule::DataLoader, frame_text(f));
        return true;
      }
    }
    return false;
  }

  // ---- rules on lifetimes that other rules build on ----

  // gradient_kept: made in backward (not in a recomputation inside it) and still live when that
  // backward ended: what autograd left in .grad.
  bool rule_gradient_kept(Block& b) {
    if (b.backward_at_alloc < 0 || (b.alloc_bits & (kForward | kRecompute)) != 0) return false;
    if (b.lifetime_end() <= instances[static_cast<std::size_t>(b.backward_at_alloc)].end_op) return false;
    decide(b, Category::Gradient, InferenceRule::GradientKept);
    return true;
  }

  // optimizer_state_kept: made in the optimizer step and still live when it ended.
  bool rule_optimizer_state_kept(Block& b) {
    if (b.optimizer_at_alloc < 0) return false;
    if (b.lifetime_end() <= instances[static_cast<std::size_t>(b.optimizer_at_alloc)].end_op) return false;
    decide(b, Category::OptimizerState, InferenceRule::OptimizerStateKept);
    return true;
  }

  // ---- rules that match blocks with each other ----

  // parameter_matched_gradient: a parameter exists before the forward and lives through the
  // backward, which gives it a gradient of exactly its size. For each size, as many of the
  // oldest blocks live before the first forward as the most gradients of that size one
  // backward made.
  void rule_parameter_matched_gradient() {
    if (first_backward_op == kNever) return;
    const std::uint64_t first_backward_end = instances[first_backward_instance].end_op;
    absl::flat_hash_map<std::pair<std::int32_t, std::uint64_t>, std::uint64_t> per_backward;
    for (const Block& b : blocks) {
      if (!b.decided || b.category != Category::Gradient || b.backward_at_alloc < 0) continue;
      if (b.rule != InferenceRule::GradientKept && b.rule != InferenceRule::AccumulateGrad) continue;
      ++per_backward[{b.backward_at_alloc, b.size_key()}];
    }
    absl::flat_hash_map<std::uint64_t, std::uint64_t> need;  // size -> parameters to find
    for (const auto& [key, n] : per_backward) need[key.second] = std::max(need[key.second], n);
    if (need.empty()) return;
    std::vector<std::uint32_t> candidates;
    for (std::uint32_t i = 0; i < blocks.size(); ++i) {
      const Block& b = blocks[i];
      // a parameter lives through the first backward (an input saved for it dies inside)
      if (!b.decided && before_first_forward(b) && b.lifetime_end() > first_backward_end) candidates.push_back(i);
    }
    // Parameters are the oldest blocks and, updated in place, live to the end: those first (an
    // optimizer's old state, freed in the step, is then left to optimizer_state_replaced).
    std::stable_sort(candidates.begin(), candidates.end(), [&](std::uint32_t x, std::uint32_t y) {
      const Block& a = blocks[x];
      const Block& b = blocks[y];
      return std::make_tuple(!a.before_trace, a.lifetime_end() != kNever, a.alloc_op) <
             std::make_tuple(!b.before_trace, b.lifetime_end() != kNever, b.alloc_op);
    });
    for (std::uint32_t i : candidates) {
      auto it = need.find(blocks[i].size_key());
      if (it == need.end() || it->second == 0) continue;
      --it->second;
      decide(blocks[i], Category::Parameter, InferenceRule::ParameterMatchedGradient);
    }
  }

  // optimizer_state_replaced: an optimizer that computes new state tensors each step (instead
  // of updating them in place) frees the old ones in the step that makes the new ones.
  void rule_optimizer_state_replaced() {
    absl::flat_hash_map<std::pair<std::int32_t, std::uint64_t>, std::uint64_t> made;  // (step, size)
    for (const Block& b : blocks) {
      if (!b.decided || b.category != Category::OptimizerState) continue;
      if (b.rule != InferenceRule::OptimizerStateKept && b.rule != InferenceRule::OptimizerInitGroup) continue;
      if (b.optimizer_at_alloc >= 0) ++made[{b.optimizer_at_alloc, b.size_key()}];
    }
    if (made.empty()) return;
    for (Block& b : blocks) {
      if (b.decided || !before_first_forward(b) || !b.freed_in_trace || b.optimizer_at_free < 0) continue;
      auto it = made.find({b.optimizer_at_free, b.size_key()});
      if (it == made.end() || it->second == 0) continue;
      --it->second;
      decide(b, Category::OptimizerState, InferenceRule::OptimizerStateReplaced);
    }
  }

  // gradient_zero_grad: zero_grad(set_to_none=True) frees the gradients of the last backward.
  void rule_gradient_zero_grad() {
    for (Block& b : blocks) {
      if (b.decided || !before_first_forward(b) || !b.freed_in_trace) continue;
      bool zero_grad = (b.free_bits & kZeroGrad) != 0;
      if (!zero_grad && b.free_frames != nullptr) {
        for (const SnapshotFrame& f : *b.free_frames) zero_grad = zero_grad || contains(f.name, "zero_grad");
      }
      if (zero_grad) decide(b, Category::Gradient, InferenceRule::GradientZeroGrad);
    }
  }

  // workspace_size: exactly cuBLAS's default workspace size, where no C++ frame can say so: no
  // stack at all, or Python frames only (then live to the end, as a handle's workspace is).
  bool rule_workspace_size(Block& b) {
    if (b.size_key() != kCublasDefaultWorkspaceBytes) return false;
    if (b.has_frames()) {
      for (const SnapshotFrame& f : *b.frames) {
        if (!is_python(f)) return false;
      }
      if (b.lifetime_end() != kNever) return false;
    }
    decide(b, Category::Workspace, InferenceRule::WorkspaceSize);
    return true;
  }

  // ---- lifetime rules for the rest ----

  // temporary: freed inside the phase (or the idle stretch) it was made in.
  bool rule_temporary(Block& b) {
    if (!b.freed_in_trace || !b.freed_in_alloc_phase) return false;
    decide(b, Category::Temporary, InferenceRule::Temporary);
    return true;
  }

  // activation: made in forward (or a recomputation), or between a forward and the backward
  // (the loss), and freed while backward runs: what autograd saved.
  bool rule_activation(Block& b) {
    const bool forwardish = (b.alloc_bits & (kForward | kRecompute)) != 0;
    if (forwardish) {
      if (!b.freed_in_trace || (b.free_bits & kBackward) == 0) return false;
    } else {
      // Made between a forward and the backward (the loss and what it saves), and still live
      // when that backward began.
      if (b.alloc_instance >= 0 || (b.last_begun_bit & (kForward | kRecompute)) == 0) return false;
      auto next = std::upper_bound(backward_begins.begin(), backward_begins.end(), b.alloc_op);
      if (next == backward_begins.end() || b.lifetime_end() <= *next) return false;
    }
    decide(b, Category::Activation, InferenceRule::Activation);
    return true;
  }

  // forward_output: made in forward and outliving it without a backward freeing it: logits,
  // a cache, an output the caller keeps (inference).
  bool rule_forward_output(Block& b) {
    if ((b.alloc_bits & (kForward | kRecompute)) == 0 || (b.alloc_bits & kBackward) != 0) return false;
    decide(b, Category::Activation, InferenceRule::ForwardOutput);
    return true;
  }

  // weights_by_lifetime: without a stack (made before recording began), live before the first
  // forward and to the end, where recording saw a forward (a forward phase, or blocks whose
  // frames are inside one).
  bool rule_weights_by_lifetime(Block& b) {
    if (!saw_forward || b.has_frames() || !before_first_forward(b) || b.lifetime_end() != kNever) return false;
    decide(b, Category::Parameter, InferenceRule::WeightsByLifetime);
    return true;
  }

  // forward_frames: a block the trace never saw made (the snapshot's segments hold it) whose
  // stack is inside an nn.Module call, live when the snapshot was taken: a forward's output or
  // cache, still held.
  bool rule_forward_frames(Block& b) {
    if (!b.before_trace || !b.has_frames() || b.lifetime_end() != kNever) return false;
    if (phase_from_frames(*b.frames) != PhaseKind::Forward) return false;
    decide(b, Category::Activation, InferenceRule::ForwardFrames, where_from_frames(*b.frames));
    return true;
  }

  // parameter_shaped_state: a group of blocks made at one place of the user's code outside any
  // phase, each the size of a parameter (zeros_like(p) for every p: an optimizer's or a
  // gradient estimator's per-parameter state, made before the loop).
  void rule_parameter_shaped_state() {
    absl::flat_hash_map<std::uint64_t, std::uint64_t> params;  // size -> parameter blocks
    for (const Block& b : blocks) {
      if (b.decided && b.category == Category::Parameter) ++params[b.size_key()];
    }
    if (params.empty()) return;
    std::vector<std::pair<std::string, std::vector<std::uint32_t>>> groups;  // in order of first block
    absl::flat_hash_map<std::string, std::size_t> group_of;
    for (std::uint32_t i = 0; i < blocks.size(); ++i) {
      const Block& b = blocks[i];
      if (b.decided || !b.has_frames() || b.alloc_instance >= 0) continue;
      const SnapshotFrame* user = nullptr;
      for (const SnapshotFrame& f : *b.frames) {
        if (is_python(f) && !is_library(f)) {
          user = &f;
          break;
        }
      }
      if (user == nullptr) continue;
      std::string site = python_frame_text(*user);
      auto [it, inserted] = group_of.try_emplace(site, groups.size());
      if (inserted) groups.emplace_back(std::move(site), std::vector<std::uint32_t>{});
      groups[it->second].second.push_back(i);
    }
    for (const auto& [site, members] : groups) {
      if (members.size() < 2) continue;
      absl::flat_hash_map<std::uint64_t, std::uint64_t> left = params;
      bool all = true;
      for (std::uint32_t i : members) {
        auto it = left.find(blocks[i].size_key());
        if (it == left.end() || it->second == 0) {
          all = false;
          break;
        }
        --it->second;
      }
      if (!all) continue;
      for (std::uint32_t i : members) {
        decide(blocks[i], Category::OptimizerState, InferenceRule::ParameterShapedState, site);
      }
    }
  }

  // input_before_forward: made by the user's code (it has a stack, no rule above named it)
  // outside any phase, and still live when the next forward began: the batch, a mask, a prompt.
  bool rule_input_before_forward(Block& b) {
    if (!b.has_frames() || b.alloc_instance >= 0) return false;
    auto next = std::upper_bound(forward_begins.begin(), forward_begins.end(), b.alloc_op);
    if (next == forward_begins.end() || b.lifetime_end() <= *next) return false;
    decide(b, Category::Input, InferenceRule::InputBeforeForward, where_from_frames(*b.frames));
    return true;
  }

  // repeated_step: the same stack makes the same kind of block every step, so a block no rule
  // decided takes the category most blocks made at its place got; a block older than the trace
  // (no allocation stack) is compared by where it was freed.
  void rule_repeated_step() {
    bool any = false;  // an undecided block with a stack to compare
    for (const Block& b : blocks) {
      any = any || (!b.decided && (b.has_frames() || (b.free_frames != nullptr && !b.free_frames->empty())));
    }
    if (!any) return;
    using Counts = std::array<std::uint64_t, kCategoryCount>;
    absl::flat_hash_map<std::uint64_t, Counts> by_alloc_site, by_free_site;
    std::vector<std::uint64_t> alloc_site(blocks.size(), 0), free_site(blocks.size(), 0);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const Block& b = blocks[i];
      if (b.has_frames()) alloc_site[i] = cached_site_hash(b.frames);
      if (b.free_frames != nullptr && !b.free_frames->empty()) free_site[i] = cached_site_hash(b.free_frames);
      if (!b.decided || b.rule == InferenceRule::Recorded || b.rule == InferenceRule::UserRule) continue;
      if (alloc_site[i] != 0) ++by_alloc_site[alloc_site[i]][category_index(b.category)];
      if (free_site[i] != 0) ++by_free_site[free_site[i]][category_index(b.category)];
    }
    auto majority = [](const Counts& c) {
      std::size_t best = 0;
      for (std::size_t k = 1; k < c.size(); ++k) {
        if (c[k] > c[best]) best = k;
      }
      return c[best] > 0 ? std::optional<Category>(static_cast<Category>(best)) : std::nullopt;
    };
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      Block& b = blocks[i];
      if (b.decided) continue;
      std::optional<Category> c;
      const SnapshotFrames* site = nullptr;
      if (auto it = by_alloc_site.find(alloc_site[i]); alloc_site[i] != 0 && it != by_alloc_site.end()) {
        c = majority(it->second);
        site = b.frames;
      } else if (auto jt = by_free_site.find(free_site[i]); !b.has_frames() && free_site[i] != 0 && jt != by_free_site.end()) {
        c = majority(jt->second);
        site = b.free_frames;
      }
      if (c) decide(b, *c, InferenceRule::RepeatedStep, where_from_frames(*site));
    }
  }

  std::uint64_t cached_site_hash(const SnapshotFrames* frames) {
    auto [it, inserted] = site_hashes.try_emplace(frames, 0);
    if (inserted) it->second = site_hash(*frames);
    return it->second;
  }

  static std::uint64_t site_hash(const SnapshotFrames& frames) {
    std::uint64_t h = absl::HashOf(frames.size());
    for (const SnapshotFrame& f : frames) h = absl::HashOf(h, f.filename, f.name, f.line);
    return h == 0 ? 1 : h;
  }

  void run() {
    // Phases left open close at the end.
    for (auto i : stack) instances[i].end_op = op;
    saw_forward = !forward_begins.empty();
    for (const Block& b : blocks) {
      if (saw_forward) break;
      saw_forward = b.has_frames() && phase_from_frames(*b.frames) == PhaseKind::Forward;
    }
    for (Block& b : blocks) {
      if (rule_recorded(b) || !b.has_frames()) continue;
      // The frame rules depend on the stack only: decided once per frames list (torch shares
      // one list among an allocation's entries and its block).
      auto [it, inserted] = frame_verdicts.try_emplace(b.frames);
      if (inserted) {
        Block probe = b;
        rule_user(probe) || rule_workspace_frames(probe) || rule_optimizer_init_group(probe) ||
            rule_accumulate_grad(probe) || rule_parameter_frames(probe) || rule_data_loader(probe);
        it->second = probe.decided ? std::optional<std::tuple<Category, InferenceRule, std::uint32_t>>(
                                         std::make_tuple(probe.category, probe.rule, probe.reason))
                                   : std::nullopt;
      }
      if (it->second) {
        b.decided = true;
        std::tie(b.category, b.rule, b.reason) = *it->second;
      }
    }
    for (Block& b : blocks) {
      if (!b.decided) rule_gradient_kept(b) || rule_optimizer_state_kept(b);
    }
    rule_parameter_matched_gradient();
    rule_optimizer_state_replaced();
    rule_gradient_zero_grad();
    for (Block& b : blocks) {
      if (!b.decided) {
        rule_workspace_size(b) || rule_temporary(b) || rule_activation(b) || rule_forward_output(b) ||
            rule_weights_by_lifetime(b) || rule_forward_frames(b);
      }
    }
    rule_parameter_shaped_state();
    for (Block& b : blocks) {
      if (!b.decided) rule_input_before_forward(b);
    }
    rule_repeated_step();
    for (Block& b : blocks) {
      if (!b.decided) decide(b, Category::Unknown, InferenceRule::Unknown);
    }
    for (const Block& b : blocks) {
      InferenceReason& r = reasons[b.reason];
      ++r.allocations;
      if (peak_op != kNever && b.alloc_op <= peak_op && b.free_op > peak_op) {
        r.peak_bytes += b.bytes;
        ++r.peak_blocks;
      }
      if (b.free_op == kNever) r.end_bytes += b.bytes;
    }
  }
};

SnapshotInference::SnapshotInference(const std::vector<SnapshotCategoryRule>& user_rules)
    : impl_(std::make_unique<Impl>()) {
  if (user_rules.size() > kMaxUserRules) {
    throw std::invalid_argument("at most " + std::to_string(kMaxUserRules) + " category rules are supported, got " +
                                std::to_string(user_rules.size()));
  }
  for (const SnapshotCategoryRule& r : user_rules) {
    UserRule u;
    u.name = r.name;
    u.category = r.category;
    u.any_name = r.frame_name.empty();
    u.any_file = r.file.empty();
    try {
      if (!u.any_name) u.name_re = std::regex(r.frame_name, std::regex::ECMAScript);
      if (!u.any_file) u.file_re = std::regex(r.file, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw std::invalid_argument("category rule '" + r.name + "': invalid regular expression (" + e.what() + ")");
    }
    if (u.any_name && u.any_file) {
      throw std::invalid_argument("category rule '" + r.name + "' has neither a frame nor a file pattern");
    }
    impl_->user_rules.push_back(std::move(u));
  }
}

SnapshotInference::~SnapshotInference() = default;

void SnapshotInference::phase_begin(std::string_view name) {
  Impl& m = *impl_;
  if (m.stack.empty()) ++m.idle_epoch;
  Impl::Instance in;
  in.bit = phase_bit(name);
  in.name = std::string(name);
  in.begin_op = m.op;
  if (in.bit == kForward || in.bit == kRecompute) m.forward_begins.push_back(m.op);
  if (in.bit == kBackward) {
    if (m.first_backward_op == kNever) m.first_backward_instance = m.instances.size();
    if (m.first_backward_op == kNever) m.first_backward_op = m.op;
    m.backward_begins.push_back(m.op);
  }
  m.instances.push_back(std::move(in));
  m.stack.push_back(static_cast<std::uint32_t>(m.instances.size() - 1));
  ++m.op;
}

void SnapshotInference::phase_end(std::string_view name) {
  Impl& m = *impl_;
  for (std::size_t i = m.stack.size(); i-- > 0;) {
    if (m.instances[m.stack[i]].name != name) continue;
    for (std::size_t j = i; j < m.stack.size(); ++j) {
      m.instances[m.stack[j]].open = false;
      m.instances[m.stack[j]].end_op = m.op;
    }
    m.stack.resize(i);
    if (m.stack.empty()) ++m.idle_epoch;
    break;
  }
  ++m.op;
}

std::uint32_t SnapshotInference::alloc(std::uint64_t addr, std::uint64_t bytes, std::uint64_t requested,
                                       const SnapshotFrames* frames, bool before_trace,
                                       std::optional<Category> recorded) {
  Impl& m = *impl_;
  if (m.live.contains(addr)) free(addr, nullptr);  // a missed free: the old block ends here
  Impl::Block b;
  b.addr = addr;
  b.bytes = bytes;
  b.requested = requested;
  b.frames = frames;
  b.before_trace = before_trace;
  b.recorded = recorded;
  b.alloc_op = m.op;
  b.alloc_instance = m.stack.empty() ? -1 : static_cast<std::int32_t>(m.stack.back());
  b.alloc_bits = m.open_bits();
  b.alloc_idle_epoch = m.idle_epoch;
  b.backward_at_alloc = m.open_instance_with(kBackward);
  b.optimizer_at_alloc = m.open_instance_with(kOptimizer);
  b.after_a_forward = !m.forward_begins.empty();
  b.last_begun_bit = m.instances.empty() ? 0 : m.instances.back().bit;
  const auto id = static_cast<std::uint32_t>(m.blocks.size());
  m.blocks.push_back(b);
  m.live[addr] = id;
  m.live_bytes += bytes;
  if (m.live_bytes > m.peak) {
    m.peak = m.live_bytes;
    m.peak_op = m.op;
  }
  ++m.op;
  return id;
}

void SnapshotInference::free(std::uint64_t addr, const SnapshotFrames* frames, bool after_trace) {
  Impl& m = *impl_;
  auto it = m.live.find(addr);
  if (it == m.live.end()) {
    ++m.op;
    return;
  }
  Impl::Block& b = m.blocks[it->second];
  m.live.erase(it);
  m.live_bytes -= b.bytes;
  b.free_op = m.op;
  b.free_frames = frames;
  b.freed_in_trace = !after_trace;
  b.free_bits = m.open_bits();
  b.optimizer_at_free = m.open_instance_with(kOptimizer);
  b.freed_in_alloc_phase = b.alloc_instance >= 0
                               ? m.instances[static_cast<std::size_t>(b.alloc_instance)].open
                               : m.stack.empty() && m.idle_epoch == b.alloc_idle_epoch;
  ++m.op;
}

void SnapshotInference::finish() {
  if (impl_->finished) return;
  impl_->finished = true;
  impl_->run();
}

InferenceDecision SnapshotInference::decision(std::uint32_t block) const {
  const Impl::Block& b = impl_->blocks.at(block);
  return InferenceDecision{b.category, b.rule};
}

std::vector<InferenceReason> SnapshotInference::reasons() const {
  std::vector<InferenceReason> out = impl_->reasons;
  std::stable_sort(out.begin(), out.end(), [](const InferenceReason& a, const InferenceReason& b) {
    return std::tie(b.peak_bytes, b.end_bytes, b.allocations) < std::tie(a.peak_bytes, a.end_bytes, a.allocations);
  });
  return out;
}

std::uint64_t SnapshotInference::peak_bytes() const { return impl_->peak; }
std::uint64_t SnapshotInference::blocks() const { return impl_->blocks.size(); }

}  // namespace ridgescope::detail
