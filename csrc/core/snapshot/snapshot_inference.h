// snapshot_inference.h — the category of every block of a snapshot PyTorch wrote, decided from
// what the snapshot holds: stack frames (Python and C++), lifetimes over the phases, sizes, and
// the structure of the step (internal to the core; fed by snapshot_sink.cpp).
//
// PyTorch's snapshots record addresses, sizes, times and frames but no categories. The reader
// replays one device's entries as events (alloc, free, phase begin/end); SnapshotInference is an
// aggregator over that replayed stream. It sees each event once, in order, and at finish()
// decides every block with hindsight by a fixed list of rules, the first that fires wins
// (docs/snapshot.md, "Inference rules", lists them with their reasons):
//
//   recorded                     the entry's own 'category' key (ridgescope's export, memory_viz)
//   user_rule                    --rules: a regular expression over frame names and files
//   workspace_frames             cuBLAS / cuDNN workspace frames (getNewWorkspace, ...)
//   optimizer_init_group         torch/optim/*.py _init_group         -> optimizer_state
//   accumulate_grad              autograd's AccumulateGrad            -> gradient
//   parameter_frames             Module._apply (.to/.cuda), reset_parameters, load_state_dict,
//                                from_pretrained, torch/nn/parameter.py, an nn.Module __init__
//   data_loader                  torch/utils/data                     -> input
//   comm_frames                  DDP's reducer making its buckets (torch/nn/parallel/distributed.py,
//                                c10d::Reducer), kept past its phase  -> comm_buffer
//   gradient_kept                made in backward, still live when it ends
//   optimizer_state_kept         made in the optimizer step, still live when it ends
//   parameter_matched_gradient   live before the first forward, matched by a gradient of the
//                                same size made in backward
//   optimizer_state_replaced     live before the first forward, freed in an optimizer step that
//                                made (and kept) a block of the same size
//   comm_buffer_replaced         live before the first forward, freed while DDP's reducer made
//                                buckets of the same total size (its buckets rebuilt)
//   gradient_zero_grad           live before the first forward, freed by zero_grad
//   workspace_size               exactly cuBLAS's default workspace (8,519,680 B), no C++ frames
//   temporary                    made and freed inside one phase (or one idle stretch)
//   activation                   made in forward and freed in backward, or made after the forward
//                                (the loss) and live when the backward begins
//   forward_output               made in forward, live after it, not freed by a backward
//   weights_by_lifetime          no frames, live before the first forward and to the end
//   forward_frames               older than the trace, made inside an nn.Module call, live at
//                                the snapshot                  -> activation
//   parameter_shaped_state       made at one place outside any phase, one block the size of
//                                each of a set of parameters   -> optimizer_state
//   input_before_forward         made by the user's code outside any phase before a forward,
//                                still live when it begins
//   repeated_step                made (or, for a block older than the trace, freed) at the same
//                                place as blocks another rule decided: the step repeats
//   unknown                      none of the above
//
// Each decision carries its reason (the rule's text with the deciding frame), and reasons()
// says how many bytes each reason holds at the peak and at the end, so every inferred byte in a
// report names why.
//
// Thread-safety: none; one instance per replay.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ridgescope/category.h"
#include "ridgescope/snapshot.h"
#include "snapshot_frames.h"

namespace ridgescope::detail {

// --- The rules ---------------------------------------------------------------------------------

enum class InferenceRule : std::uint8_t {
  Recorded,
  UserRule,
  WorkspaceFrames,
  OptimizerInitGroup,
  AccumulateGrad,
  ParameterFrames,
  DataLoader,
  CommFrames,
  GradientKept,
  OptimizerStateKept,
  ParameterMatchedGradient,
  OptimizerStateReplaced,
  CommBufferReplaced,
  GradientZeroGrad,
  WorkspaceSize,
  Temporary,
  Activation,
  ForwardOutput,
  WeightsByLifetime,
  ForwardFrames,
  ParameterShapedState,
  InputBeforeForward,
  RepeatedStep,
  Unknown,
};

// The stable identifier ("parameter_matched_gradient") and the plain-language reason without
// its frame ("live before the first forward, matched by a gradient of the same size allocated
// in backward").
std::string_view inference_rule_id(InferenceRule rule) noexcept;
std::string_view inference_rule_reason(InferenceRule rule) noexcept;
// The reason as reports print it: the rule's text with what decided it (`detail`: a frame, a
// user rule's match, a place in the code), e.g. "allocated under torch/optim/adamw.py _init_group".
std::string inference_reason_text(InferenceRule rule, Category category, std::string_view detail);

// How strong the evidence behind a rule is (docs/snapshot.md, "How sure the categories are"):
//   recorded    the snapshot names the category itself
//   frames      a frame of the block's own stack names what made it
//   structure   the step's structure: lifetimes across the phases (torch's annotations or the
//               frames), a gradient matched to its parameter's size in the same step, state
//               replaced in the optimizer step, the same place deciding in another step
//   weak        size or lifetime alone: an exact size, or live from before the trace to the end,
//               with no phase or frame to confirm it (also every lifetime rule in a replay that
//               has no phases at all)
//   none        unknown
enum class InferenceEvidence : std::uint8_t { Recorded, Frames, Structure, Weak, None };

// "recorded", "frames", "structure", "weak", "none" (ridgescope/report.h kSnapshotEvidence, in
// this order).
std::string_view inference_evidence_id(InferenceEvidence evidence) noexcept;
// The evidence behind `rule`'s decisions; `phases`: the replay has phases (without any, the
// lifetime rules rest on lifetimes alone).
InferenceEvidence inference_rule_evidence(InferenceRule rule, bool phases) noexcept;

// One reason and the bytes it decided: at the peak (the first instant live bytes reached their
// maximum, the analysis's peak) and at the end.
struct InferenceReason {
  InferenceRule rule = InferenceRule::Unknown;
  Category category = Category::Unknown;
  std::string text;             // the reason with its deciding frame
  InferenceEvidence evidence = InferenceEvidence::None;
  std::uint64_t allocations = 0;
  std::uint64_t peak_bytes = 0, peak_blocks = 0, end_bytes = 0;
};

struct InferenceDecision {
  Category category = Category::Unknown;
  InferenceRule rule = InferenceRule::Unknown;
};

class SnapshotInference {
 public:
  // Compiles the user's rules (ECMAScript regular expressions, matched anywhere in a frame's
  // name or file). Throws std::invalid_argument naming the rule when one does not compile.
  explicit SnapshotInference(const std::vector<SnapshotCategoryRule>& user_rules = {});
  ~SnapshotInference();
  SnapshotInference(const SnapshotInference&) = delete;
  SnapshotInference& operator=(const SnapshotInference&) = delete;

  // The replayed stream of one device, in order. Phase names are ridgescope's (the step
  // phases of ridgescope/phase.h; others count as phases too).
  void phase_begin(std::string_view name);
  void phase_end(std::string_view name);
  // A block became live. `frames`: its allocation stack (nullptr or empty: none recorded; it
  // must outlive the inference). `before_trace`: it existed before the first trace entry.
  // `recorded`: a category the snapshot itself names. Returns the block's number (0, 1, ...).
  std::uint32_t alloc(std::uint64_t addr, std::uint64_t bytes, std::uint64_t requested,
                      const SnapshotFrames* frames, bool before_trace, std::optional<Category> recorded);
  // The block at `addr` stopped being live; `frames`: the free entry's stack (may be null).
  // `after_trace`: the trace never recorded the free (the snapshot's segments say the block is
  // gone): for lifetimes the block counts as live to the end.
  void free(std::uint64_t addr, const SnapshotFrames* frames, bool after_trace = false);

  // Decides every block and counts the bytes of each reason. Call once, after the last event.
  void finish();

  InferenceDecision decision(std::uint32_t block) const;
  std::vector<InferenceReason> reasons() const;  // largest at the peak first (then at the end)
  std::uint64_t peak_bytes() const;
  std::uint64_t blocks() const;

  // The state the rules share (opaque here; snapshot_inference_state.h, for the rules' files).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ridgescope::detail
