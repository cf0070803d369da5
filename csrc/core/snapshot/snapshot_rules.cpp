// snapshot_rules.cpp — the inference rules' ids and the reasons reports print (see
// snapshot_inference.h; docs/snapshot.md lists them).
#include <array>
#include <string>
#include <string_view>

#include "ridgescope/report.h"
#include "snapshot_inference.h"

namespace ridgescope::detail {
namespace {

struct RuleText {
  InferenceRule rule;
  std::string_view id;
  std::string_view reason;
};

constexpr std::array<RuleText, 24> kRules = {{
    {InferenceRule::Recorded, "recorded", "recorded in the snapshot (its 'category' key)"},
    {InferenceRule::UserRule, "user_rule", "a user rule matched a frame"},
    {InferenceRule::WorkspaceFrames, "workspace_frames", "allocated by a library's workspace function"},
    {InferenceRule::OptimizerInitGroup, "optimizer_init_group", "allocated under torch/optim _init_group"},
    {InferenceRule::AccumulateGrad, "accumulate_grad", "allocated by autograd's AccumulateGrad (a parameter's .grad)"},
    {InferenceRule::ParameterFrames, "parameter_frames",
     "allocated where weights are made, loaded or moved to the device"},
    {InferenceRule::DataLoader, "data_loader", "allocated under torch/utils/data (the data loader)"},
    {InferenceRule::CommFrames, "comm_frames",
     "made by DDP's reducer and kept past the phase it was made in (its gradient buckets)"},
    {InferenceRule::GradientKept, "gradient_kept", "made in backward and still live when it ended"},
    {InferenceRule::OptimizerStateKept, "optimizer_state_kept",
     "made in the optimizer step and still live when it ended"},
    {InferenceRule::ParameterMatchedGradient, "parameter_matched_gradient",
     "live before the first forward, matched by a gradient of the same size allocated in backward"},
    {InferenceRule::OptimizerStateReplaced, "optimizer_state_replaced",
     "live before the first forward, freed in an optimizer step that made a block of the same size and "
     "kept it (state replaced every step)"},
    {InferenceRule::CommBufferReplaced, "comm_buffer_replaced",
     "live before the first forward and freed where DDP's reducer made buckets of the same total size "
     "(its buckets rebuilt)"},
    {InferenceRule::GradientZeroGrad, "gradient_zero_grad",
     "live before the first forward and freed by zero_grad (a .grad set to None)"},
    {InferenceRule::WorkspaceSize, "workspace_size",
     "exactly 8,519,680 bytes, with no C++ frame to say more: cuBLAS's default workspace (2 x 4 MiB + "
     "8 x 16 KiB)"},
    {InferenceRule::Temporary, "temporary", "made and freed inside one phase"},
    {InferenceRule::Activation, "activation", "made in forward and freed in backward (saved for backward)"},
    {InferenceRule::ForwardOutput, "forward_output",
     "made in forward and still live after it, not freed by a backward (an output the caller kept)"},
    {InferenceRule::WeightsByLifetime, "weights_by_lifetime",
     "live before the first forward and to the end, no stack (weights loaded before recording began)"},
    {InferenceRule::ForwardFrames, "forward_frames",
     "older than the trace, made inside an nn.Module call and live when the snapshot was taken"},
    {InferenceRule::ParameterShapedState, "parameter_shaped_state",
     "made outside any phase at one place of the user's code, one block the size of each of a set of "
     "parameters (per-parameter state, as an optimizer keeps)"},
    {InferenceRule::InputBeforeForward, "input_before_forward",
     "made by the user's code outside any phase before a forward, and still live when it began"},
    {InferenceRule::RepeatedStep, "repeated_step",
     "made at the same place as blocks another rule decided (the step repeats)"},
    {InferenceRule::Unknown, "unknown", "no rule applies"},
}};

const RuleText& rule_text(InferenceRule rule) {
  for (const RuleText& r : kRules) {
    if (r.rule == rule) return r;
  }
  return kRules.back();
}

// The reason as reports print it: the rule's text with what decided it.
}  // namespace

std::string inference_reason_text(InferenceRule rule, Category category, std::string_view detail) {
  switch (rule) {
    case InferenceRule::UserRule: return std::string(detail);
    case InferenceRule::WorkspaceFrames: return "allocated by " + std::string(detail) + " (a library's workspace)";
    case InferenceRule::OptimizerInitGroup: return "allocated under " + std::string(detail);
    case InferenceRule::AccumulateGrad:
      return "allocated by " + std::string(detail) + " (autograd accumulating a parameter's .grad)";
    case InferenceRule::ParameterFrames:
      return "allocated under " + std::string(detail) + " (weights made, loaded or moved to the device)";
    case InferenceRule::DataLoader: return "allocated under " + std::string(detail) + " (the data loader)";
    case InferenceRule::CommFrames:
      return "allocated under " + std::string(detail) + " and kept past its phase (DDP's gradient buckets)";
    case InferenceRule::ForwardFrames:
      return "older than the trace, made inside an nn.Module call and live when the snapshot was taken: " +
             std::string(detail);
    case InferenceRule::ParameterShapedState:
      return "made outside any phase at " + std::string(detail) +
             ", one block the size of each of a set of parameters (per-parameter state, as an optimizer keeps)";
    case InferenceRule::InputBeforeForward:
      return "made by the user's code outside any phase before a forward, and still live when it began" +
             (detail.empty() ? std::string() : ": " + std::string(detail));
    case InferenceRule::RepeatedStep:
      return "made at the same place as blocks decided " + std::string(category_name(category)) +
             " elsewhere in the trace (the step repeats)" +
             (detail.empty() ? std::string() : ": " + std::string(detail));
    default: return std::string(rule_text(rule).reason);
  }
}

std::string_view inference_evidence_id(InferenceEvidence evidence) noexcept {
  const auto i = static_cast<std::size_t>(evidence);
  return i < kSnapshotEvidence.size() ? kSnapshotEvidence[i] : kSnapshotEvidence.back();
}

InferenceEvidence inference_rule_evidence(InferenceRule rule, bool phases) noexcept {
  using R = InferenceRule;
  switch (rule) {
    case R::Recorded: return InferenceEvidence::Recorded;
    case R::UserRule:
    case R::WorkspaceFrames:
    case R::OptimizerInitGroup:
    case R::AccumulateGrad:
    case R::ParameterFrames:
    case R::DataLoader:
    case R::CommFrames: return InferenceEvidence::Frames;
    case R::ParameterMatchedGradient:
    case R::OptimizerStateReplaced:
    case R::CommBufferReplaced:
    case R::GradientZeroGrad:
    case R::RepeatedStep: return InferenceEvidence::Structure;
    case R::GradientKept:
    case R::OptimizerStateKept:
    case R::Temporary:
    case R::Activation:
    case R::ForwardOutput:
    case R::InputBeforeForward: return phases ? InferenceEvidence::Structure : InferenceEvidence::Weak;
    case R::WorkspaceSize:
    case R::WeightsByLifetime:
    case R::ForwardFrames:
    case R::ParameterShapedState: return InferenceEvidence::Weak;
    case R::Unknown: break;
  }
  return InferenceEvidence::None;
}

std::string_view inference_rule_id(InferenceRule rule) noexcept { return rule_text(rule).id; }
std::string_view inference_rule_reason(InferenceRule rule) noexcept { return rule_text(rule).reason; }

}  // namespace ridgescope::detail
