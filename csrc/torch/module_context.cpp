#include "module_context.h"

#include <atomic>
#include <cstddef>

namespace ridgescope::sources {
namespace {

// A fixed-size stack: module nesting deeper than this is tracked by depth only, so pushes and
// pops stay balanced and nothing is allocated on the allocation path.
constexpr std::size_t kMaxDepth = 256;
thread_local ModuleFrame t_frames[kMaxDepth];
thread_local std::size_t t_depth = 0;
thread_local std::uint64_t t_generation = 0;  // the generation t_depth counts for
std::atomic<std::uint64_t> g_generation{1};

// This thread's depth in the current generation (a stack left by an earlier session is empty).
std::size_t& depth() noexcept {
  const std::uint64_t generation = module_context_generation();
  if (t_generation != generation) {
    t_generation = generation;
    t_depth = 0;
  }
  return t_depth;
}

}  // namespace

void new_module_contexts() noexcept { g_generation.fetch_add(1, std::memory_order_relaxed); }

std::uint64_t module_context_generation() noexcept { return g_generation.load(std::memory_order_relaxed); }

void push_module(ModuleFrame frame) noexcept {
  std::size_t& d = depth();
  if (d < kMaxDepth) t_frames[d] = frame;
  ++d;
}

void pop_module() noexcept {
  std::size_t& d = depth();
  if (d > 0) --d;
}

const ModuleFrame* current_module() noexcept {
  const std::size_t d = depth();
  if (d == 0) return nullptr;
  return &t_frames[(d <= kMaxDepth ? d : kMaxDepth) - 1];
}

std::uint32_t current_module_context() noexcept {
  const ModuleFrame* f = current_module();
  return f == nullptr ? 0 : f->context_id;
}

}  // namespace ridgescope::sources
