#include "ridgescope/phase.h"

namespace ridgescope {

std::string_view builtin_phase_name(PhaseKind kind) noexcept {
  const auto i = static_cast<std::size_t>(kind);
  return i >= 1 && i <= kBuiltinPhases.size() ? kBuiltinPhases[i - 1] : std::string_view();
}

PhaseKind parse_phase_kind(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kBuiltinPhases.size(); ++i) {
    if (kBuiltinPhases[i] == name) return static_cast<PhaseKind>(i + 1);
  }
  return PhaseKind::Other;
}

bool is_step_phase(PhaseKind kind) noexcept {
  switch (kind) {
    case PhaseKind::Forward:
    case PhaseKind::Backward:
    case PhaseKind::OptimizerStep:
    case PhaseKind::ZeroGrad:
    case PhaseKind::Recompute: return true;
    default: return false;
  }
}

}  // namespace ridgescope
