// snapshot_frame_rules.cpp — the inference rules on a block's allocation frames
// (see snapshot_inference.h; docs/snapshot.md, "Inference rules", lists them in order).
#include "snapshot_inference_state.h"

#include <string>

namespace ridgescope::detail {

using Block = SnapshotInference::Impl::Block;

// ---- rules on one block's frames (in this order) ----

// recorded: the snapshot names the category itself.
bool SnapshotInference::Impl::rule_recorded(Block& b) {
  if (!b.recorded) return false;
  decide(b, *b.recorded, InferenceRule::Recorded);
  return true;
}

std::uint64_t SnapshotInference::Impl::user_matches(const SnapshotFrame& f) {
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
bool SnapshotInference::Impl::rule_user(Block& b) {
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
bool SnapshotInference::Impl::rule_workspace_frames(Block& b) {
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
bool SnapshotInference::Impl::rule_optimizer_init_group(Block& b) {
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
bool SnapshotInference::Impl::rule_accumulate_grad(Block& b) {
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
bool SnapshotInference::Impl::rule_parameter_frames(Block& b) {
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
bool SnapshotInference::Impl::rule_data_loader(Block& b) {
  if (!b.has_frames()) return false;
  for (const SnapshotFrame& f : *b.frames) {
    if (path_has(f.filename, "torch/utils/data/")) {
      decide(b, Category::Input, InferenceRule::DataLoader, frame_text(f));
      return true;
    }
  }
  return false;
}

// comm_frames: DDP's reducer makes its gradient buckets when it is built and rebuilds them
// before the second forward (torch/nn/parallel/distributed.py __init__/_ddp_init_helper/
// _pre_forward calling into c10d::Reducer). What it keeps past the phase is a bucket; the
// temporaries of its broadcasts there are not.
bool SnapshotInference::Impl::rule_comm_frames(Block& b) {
  if (!b.has_frames() || (b.freed_in_trace && b.freed_in_alloc_phase)) return false;
  for (const SnapshotFrame& f : *b.frames) {
    const bool ddp = path_has(f.filename, "torch/nn/parallel/distributed.py") &&
                     (function_is(f.name, "_pre_forward") || function_is(f.name, "_ddp_init_helper") ||
                      function_is(f.name, "__init__"));
    if (ddp || contains(f.name, "c10d::Reducer::")) {
      decide(b, Category::CommBuffer, InferenceRule::CommFrames, frame_text(f));
      return true;
    }
  }
  return false;
}

}  // namespace ridgescope::detail
