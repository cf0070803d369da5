// Specification of the built-in phase names (ridgescope/phase.h): the one table every part that
// recognises a phase by its name reads.
#include <iterator>
#include <string>
#include <string_view>
#include <utility>

#include "catch.h"
#include "ridgescope/phase.h"

using ridgescope::builtin_phase_name;
using ridgescope::is_step_phase;
using ridgescope::kBuiltinPhases;
using ridgescope::parse_phase_kind;
using ridgescope::PhaseKind;

SCENARIO("each built-in name parses to its kind and back", "[core][phase]") {
  // The names docs/phases.md lists, in the order of PhaseKind.
  const std::pair<std::string_view, PhaseKind> expected[] = {
      {"forward", PhaseKind::Forward},     {"backward", PhaseKind::Backward},
      {"optimizer_step", PhaseKind::OptimizerStep}, {"zero_grad", PhaseKind::ZeroGrad},
      {"checkpoint", PhaseKind::Checkpoint}, {"eval", PhaseKind::Eval},
      {"data", PhaseKind::Data},           {"recompute", PhaseKind::Recompute},
      {"compile", PhaseKind::Compile}};
  REQUIRE(kBuiltinPhases.size() == std::size(expected));
  for (const auto& [name, kind] : expected) {
    CHECK(parse_phase_kind(name) == kind);
    CHECK(builtin_phase_name(kind) == name);
  }
}

SCENARIO("a name of the user's own is Other, and Other has no built-in name", "[core][phase]") {
  for (std::string_view name : {"", "idle", "Forward", "forward ", "optimizer", "train_step", "Optimizer.step#SGD.step"}) {
    CHECK(parse_phase_kind(name) == PhaseKind::Other);
  }
  CHECK(builtin_phase_name(PhaseKind::Other).empty());
  CHECK(builtin_phase_name(static_cast<PhaseKind>(200)).empty());
}

SCENARIO("the step phases are forward, backward, optimizer_step, zero_grad and recompute", "[core][phase]") {
  std::string step_phases;
  for (std::string_view name : kBuiltinPhases) {
    if (is_step_phase(parse_phase_kind(name))) step_phases += std::string(name) + " ";
  }
  CHECK(step_phases == "forward backward optimizer_step zero_grad recompute ");
  CHECK_FALSE(is_step_phase(PhaseKind::Other));
}
