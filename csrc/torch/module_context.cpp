#include "module_context.h"

#include <cstddef>

namespace ridgescope::sources {
namespace {

// A fixed-size stack: module nesting deeper than this is tracked by depth only, so pushes and
// pops stay balanced and nothing is allocated on the allocation path.
constexpr std::size_t kMaxDepth = 256;
thread_local ModuleFrame t_frames[kMaxDepth];
thread_local std::size_t t_depth = 0;

}  // namespace

void push_module(ModuleFrame frame) noexcept {
  if (t_depth < kMaxDepth) t_frames[t_depth] = frame;
  ++t_depth;
}

void pop_module() noexcept {
  if (t_depth > 0) --t_depth;
}

const ModuleFrame* current_module() noexcept {
  if (t_depth == 0) return nullptr;
  return &t_frames[(t_depth <= kMaxDepth ? t_depth : kMaxDepth) - 1];
}

std::uint32_t current_module_context() noexcept {
  const ModuleFrame* f = current_module();
  return f == nullptr ? 0 : f->context_id;
}

}  // namespace ridgescope::sources
