// module_context.h — the innermost module running on this thread, as the Python (or C++)
// module hooks report it. The saved-tensor hook labels activations with it and the CPU
// allocator source stamps it on every allocation, so even blocks no tag explains carry the
// module that made them ("temporary in layers.0.attn").
//
// Thread-safety: the stack is thread-local (forward, and the recomputation of checkpointed
// regions, run a module's hooks and its allocations on one thread). Reads are lock-free and
// never allocate, so the allocator source may call current_module_context(). Each session
// starts every thread's stack empty (new_module_contexts()): a session that stopped inside a
// module call (an internal error) leaves nothing for the next one.
#pragma once

#include <cstdint>

namespace ridgescope::sources {

struct ModuleFrame {
  std::uint32_t activation_label_id = 0;  // trace string "activation saved in <module>"
  std::uint32_t context_id = 0;           // trace string "<module>" (hierarchical name)
};

// A session starts: every thread's stack reads as empty from now on (one atomic increment).
void new_module_contexts() noexcept;
// The session generation new_module_contexts() last began: other per-thread module state
// (ModuleRanges' open calls) is tagged with it by the same rule.
std::uint64_t module_context_generation() noexcept;
void push_module(ModuleFrame frame) noexcept;
void pop_module() noexcept;
// The innermost frame on this thread, or nullptr outside every module.
const ModuleFrame* current_module() noexcept;
// The innermost module's context string id, 0 outside every module.
std::uint32_t current_module_context() noexcept;

}  // namespace ridgescope::sources
