// ridgescope/phase.h — the built-in phase names (docs/phases.md) and their parsing: the one
// definition every part that recognises a phase by its name uses (the analysis's lifetime pass,
// the snapshot reader and its inference, the C++ session). A trace's PhaseBegin and PhaseEnd
// events carry the name as a string; a name that is not built in is a phase of the user's own
// (PhaseKind::Other), reported like the others but given no meaning.
//
// The names are stable strings of the trace, the JSON report and the snapshot export; never
// rename one without a schema bump.
//
// Thread-safety: constants and pure functions of their arguments; safe from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ridgescope {

enum class PhaseKind : std::uint8_t {
  Other = 0,          // a name of the user's own
  Forward = 1,        // the module's forward (training)
  Backward = 2,       // autograd's backward
  OptimizerStep = 3,  // optimizer.step(); its end counts a step
  ZeroGrad = 4,       // optimizer.zero_grad() / module.zero_grad()
  Checkpoint = 5,     // torch.save
  Eval = 6,           // a forward without grad
  Data = 7,           // the data loader
  Recompute = 8,      // activation checkpointing recomputing a forward in backward
  Compile = 9,        // torch.compile compiling
};

// The built-in names, in PhaseKind order from Forward (index = kind - 1).
inline constexpr std::array<std::string_view, 9> kBuiltinPhases = {
    "forward", "backward", "optimizer_step", "zero_grad", "checkpoint", "eval", "data", "recompute", "compile"};

// The built-in name of a kind ("optimizer_step", ...); "" for Other and out-of-range values.
std::string_view builtin_phase_name(PhaseKind kind) noexcept;

// The kind a phase name denotes: a built-in name's kind, else Other.
PhaseKind parse_phase_kind(std::string_view name) noexcept;

// Whether a kind is one of the phases of the training step itself: forward, backward,
// optimizer_step, zero_grad and recompute (not eval, data, checkpoint or compile). These are
// the phases a torch snapshot's frames and record_function annotations can show.
bool is_step_phase(PhaseKind kind) noexcept;

}  // namespace ridgescope
