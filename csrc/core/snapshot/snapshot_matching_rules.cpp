// snapshot_matching_rules.cpp — the inference rules that match blocks with each other: sizes, replacements, the step repeated
// (see snapshot_inference.h; docs/snapshot.md, "Inference rules", lists them in order).
#include "snapshot_inference_state.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"

namespace ridgescope::detail {

using Block = SnapshotInference::Impl::Block;

// ---- rules that match blocks with each other ----

// parameter_matched_gradient: a parameter exists before the forward and lives through the
// backward, which gives it a gradient of exactly its size. For each size, as many of the
// oldest blocks live before the first forward as the most gradients of that size one
// backward made.
void SnapshotInference::Impl::rule_parameter_matched_gradient() {
  if (first_backward_op == kNever) return;
  // A parameter lives through the first step: past the first backward (an input saved for it
  // dies inside) and past the optimizer step that follows it, where there is one (the batch of
  // the first step, even one that requires grad and gets a gradient, dies before).
  std::uint64_t lives_past = instances[first_backward_instance].end_op;
  for (const Instance& in : instances) {
    if (in.bit == kOptimizer && in.begin_op >= lives_past) {
      lives_past = in.end_op;
      break;
    }
  }
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
    if (!b.decided && before_first_forward(b) && b.lifetime_end() > lives_past) candidates.push_back(i);
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
void SnapshotInference::Impl::rule_optimizer_state_replaced() {
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
void SnapshotInference::Impl::rule_gradient_zero_grad() {
  for (Block& b : blocks) {
    if (b.decided || !before_first_forward(b) || !b.freed_in_trace) continue;
    bool zero_grad = (b.free_bits & kZeroGrad) != 0;
    if (!zero_grad && b.free_frames != nullptr) {
      for (const SnapshotFrame& f : *b.free_frames) zero_grad = zero_grad || contains(f.name, "zero_grad");
    }
    if (zero_grad) decide(b, Category::Gradient, InferenceRule::GradientZeroGrad);
  }
}

// parameter_shaped_state: a group of blocks made at one place of the user's code outside any
// phase, each the size of a parameter (zeros_like(p) for every p: an optimizer's or a
// gradient estimator's per-parameter state, made before the loop).
void SnapshotInference::Impl::rule_parameter_shaped_state() {
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

// repeated_step: the same stack makes the same kind of block every step, so a block no rule
// decided takes the category most blocks made at its place got; a block older than the trace
// (no allocation stack) is compared by where it was freed.
void SnapshotInference::Impl::rule_repeated_step() {
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

std::uint64_t SnapshotInference::Impl::cached_site_hash(const SnapshotFrames* frames) {
  auto [it, inserted] = site_hashes.try_emplace(frames, 0);
  if (inserted) it->second = site_hash(*frames);
  return it->second;
}

std::uint64_t SnapshotInference::Impl::site_hash(const SnapshotFrames& frames) {
  std::uint64_t h = absl::HashOf(frames.size());
  for (const SnapshotFrame& f : frames) h = absl::HashOf(h, f.filename, f.name, f.line);
  return h == 0 ? 1 : h;
}

// comm_buffer_replaced: when DDP rebuilds its buckets (before the second forward) it frees
// the ones it made when it was built, which hold the same gradients: a block older than the
// first forward, freed while the reducer makes the new buckets (between two of them, or next to
// them with no other allocation in between: the old ones go just before or just after), whose
// size is the total of some of those buckets (one bucket of everything, one of theirs; what
// else the reducer keeps there, a few bytes, is left out).
void SnapshotInference::Impl::rule_comm_buffer_replaced() {
  struct Rebuild {
    std::uint64_t first = kNever, last = 0;
    std::vector<std::uint64_t> sizes;
    absl::flat_hash_set<std::uint64_t> sums;  // totals of subsets of the buckets (bounded)
  };
  absl::flat_hash_map<std::int32_t, Rebuild> rebuilds;  // phase instance (-1: idle) -> its buckets
  for (const Block& b : blocks) {
    if (!b.decided || b.rule != InferenceRule::CommFrames) continue;
    Rebuild& r = rebuilds[b.alloc_instance];
    r.first = std::min(r.first, b.alloc_op);
    r.last = std::max(r.last, b.alloc_op);
    r.sizes.push_back(b.size_key());
  }
  if (rebuilds.empty()) return;
  constexpr std::size_t kMaxSums = 4096;
  for (auto& [instance, r] : rebuilds) {
    for (std::uint64_t n : r.sizes) {
      std::vector<std::uint64_t> add{n};
      for (std::uint64_t s : r.sums) add.push_back(s + n);
      for (std::uint64_t s : add) {
        if (r.sums.size() < kMaxSums) r.sums.insert(s);
      }
    }
  }
  std::vector<std::uint64_t> alloc_ops;  // ascending: blocks are kept in allocation order
  alloc_ops.reserve(blocks.size());
  for (const Block& b : blocks) alloc_ops.push_back(b.alloc_op);
  auto allocations_between = [&](std::uint64_t lo, std::uint64_t hi) {  // in (lo, hi)
    return std::lower_bound(alloc_ops.begin(), alloc_ops.end(), hi) -
           std::upper_bound(alloc_ops.begin(), alloc_ops.end(), lo);
  };
  for (Block& b : blocks) {
    if (b.decided || !before_first_forward(b) || !b.freed_in_trace) continue;
    for (const auto& [instance, r] : rebuilds) {
      const std::uint64_t f = b.free_op;
      const bool during = (f > r.first && f < r.last) || (f < r.first && allocations_between(f, r.first) == 0) ||
                          (f > r.last && allocations_between(r.last, f) == 0);
      if (during && r.sums.contains(b.size_key())) {
        decide(b, Category::CommBuffer, InferenceRule::CommBufferReplaced);
        break;
      }
    }
  }
}

}  // namespace ridgescope::detail
