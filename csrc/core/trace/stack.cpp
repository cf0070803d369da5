// stack.cpp — frame kinds (ridgescope/stack.h).
#include "ridgescope/stack.h"

namespace ridgescope {

std::string_view frame_kind_name(FrameKind kind) noexcept {
  switch (kind) {
    case FrameKind::Python: return "python";
    case FrameKind::Native: return "native";
    case FrameKind::Autograd: return "autograd";
    case FrameKind::Untracked: return "untracked";
  }
  return "untracked";
}

FrameKind frame_kind_from_byte(std::uint8_t value) noexcept {
  return value <= static_cast<std::uint8_t>(FrameKind::Untracked) ? static_cast<FrameKind>(value)
                                                                    : FrameKind::Untracked;
}

}  // namespace ridgescope
