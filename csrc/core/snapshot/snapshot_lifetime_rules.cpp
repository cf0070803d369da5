// snapshot_lifetime_rules.cpp — the inference rules on a block's lifetime over the phases
// (see snapshot_inference.h; docs/snapshot.md, "Inference rules", lists them in order).
#include "snapshot_inference_state.h"

#include <algorithm>

#include "ridgescope/cuda_workspace.h"

namespace ridgescope::detail {

using Block = SnapshotInference::Impl::Block;

// ---- rules on lifetimes that other rules build on ----

// gradient_kept: made in backward (not in a recomputation inside it) and still live when that
// backward ended: what autograd left in .grad.
bool SnapshotInference::Impl::rule_gradient_kept(Block& b) {
  if (b.backward_at_alloc < 0 || (b.alloc_bits & (kForward | kRecompute)) != 0) return false;
  if (b.lifetime_end() <= instances[static_cast<std::size_t>(b.backward_at_alloc)].end_op) return false;
  decide(b, Category::Gradient, InferenceRule::GradientKept);
  return true;
}

// optimizer_state_kept: made in the optimizer step and still live when it ended.
bool SnapshotInference::Impl::rule_optimizer_state_kept(Block& b) {
  if (b.optimizer_at_alloc < 0) return false;
  if (b.lifetime_end() <= instances[static_cast<std::size_t>(b.optimizer_at_alloc)].end_op) return false;
  decide(b, Category::OptimizerState, InferenceRule::OptimizerStateKept);
  return true;
}

// workspace_size: exactly cuBLAS's default workspace size, where no C++ frame can say so: no
// stack at all, or Python frames only (then live to the end, as a handle's workspace is).
bool SnapshotInference::Impl::rule_workspace_size(Block& b) {
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
bool SnapshotInference::Impl::rule_temporary(Block& b) {
  if (!b.freed_in_trace || !b.freed_in_alloc_phase) return false;
  decide(b, Category::Temporary, InferenceRule::Temporary);
  return true;
}

// activation: made in forward (or a recomputation), or between a forward and the backward
// (the loss), and freed while backward runs: what autograd saved.
bool SnapshotInference::Impl::rule_activation(Block& b) {
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
bool SnapshotInference::Impl::rule_forward_output(Block& b) {
  if ((b.alloc_bits & (kForward | kRecompute)) == 0 || (b.alloc_bits & kBackward) != 0) return false;
  decide(b, Category::Activation, InferenceRule::ForwardOutput);
  return true;
}

// weights_by_lifetime: without a stack (made before recording began), live before the first
// forward and to the end, where recording saw a forward (a forward phase, or blocks whose
// frames are inside one).
bool SnapshotInference::Impl::rule_weights_by_lifetime(Block& b) {
  if (!saw_forward || b.has_frames() || !before_first_forward(b) || b.lifetime_end() != kNever) return false;
  decide(b, Category::Parameter, InferenceRule::WeightsByLifetime);
  return true;
}

// forward_frames: a block the trace never saw made (the snapshot's segments hold it) whose
// stack is inside an nn.Module call, live when the snapshot was taken: a forward's output or
// cache, still held.
bool SnapshotInference::Impl::rule_forward_frames(Block& b) {
  if (!b.before_trace || !b.has_frames() || b.lifetime_end() != kNever) return false;
  if (phase_from_frames(*b.frames) != PhaseKind::Forward) return false;
  decide(b, Category::Activation, InferenceRule::ForwardFrames, where_from_frames(*b.frames));
  return true;
}

// input_before_forward: made by the user's code (it has a stack, no rule above named it)
// outside any phase, and still live when the next forward began: the batch, a mask, a prompt.
bool SnapshotInference::Impl::rule_input_before_forward(Block& b) {
  if (!b.has_frames() || b.alloc_instance >= 0) return false;
  auto next = std::upper_bound(forward_begins.begin(), forward_begins.end(), b.alloc_op);
  if (next == forward_begins.end() || b.lifetime_end() <= *next) return false;
  decide(b, Category::Input, InferenceRule::InputBeforeForward, where_from_frames(*b.frames));
  return true;
}

}  // namespace ridgescope::detail
