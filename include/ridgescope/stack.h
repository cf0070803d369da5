// ridgescope/stack.h — where an allocation was made: frames and stacks (docs/sites.md).
//
// A *frame* is one place in code: a Python frame (file, line, function), a native frame
// (library, function), an autograd node (its name and the module whose forward created it), or
// an `untracked` marker that says why no real frame is known. A *stack* is a list of frames,
// innermost first, with one of them marked as the allocation's *site*: the frame a person
// should look at (the innermost frame of the user's code, or the autograd node). An alloc event
// refers to a stack by id (Event::stack_id); a trace defines every frame and stack once, before
// the first record that uses it (docs/trace_format.md, kinds `frame` and `stack`), so both are
// interned: one definition per distinct frame, one per distinct stack.
//
// Every source that knows where an allocation came from emits the same records: the live
// sources (csrc/torch, from Python frames and the autograd engine; a one-frame stack in the
// default mode, the whole stack with stacks="python" or "all") and a replay of a torch memory
// snapshot, whose entries carry full stacks (Python and C++ frames with file, line and name).
// The analysis groups the peak's bytes by site and draws the peak by stack from these alone.
//
// Thread-safety: plain data.
#pragma once

#include <cstdint>
#include <string_view>

namespace ridgescope {

// What a frame is. Stored as a number in the trace; an unknown number reads as Untracked.
enum class FrameKind : std::uint8_t {
  Python = 0,     // file, line, function (qualified name where Python has one)
  Native = 1,     // file = the shared library, function = the demangled symbol, line 0 when unknown
  Autograd = 2,   // function = the node ("MmBackward0"), module = the module that made it ("" if none)
  Untracked = 3,  // no real frame: function says why ("allocated before tracking started")
};

std::string_view frame_kind_name(FrameKind kind) noexcept;  // "python", "native", ...
FrameKind frame_kind_from_byte(std::uint8_t value) noexcept;

// A frame as the trace stores it: texts are trace string ids (0: empty).
struct FrameRecord {
  FrameKind kind = FrameKind::Untracked;
  std::uint32_t file_id = 0;
  std::uint64_t line = 0;  // 1-based source line; 0 when none
  std::uint32_t function_id = 0;
  std::uint32_t module_id = 0;  // Autograd frames: the module's hierarchical name
};

// A frame by its texts, for interning (Recorder::intern_frame).
struct FrameText {
  FrameKind kind = FrameKind::Untracked;
  std::string_view file;
  std::uint64_t line = 0;
  std::string_view function;
  std::string_view module;
};

// A stack as a reader holds it: frame ids innermost first, and the site's position in them.
struct StackView {
  const std::uint32_t* frames = nullptr;
  std::uint32_t size = 0;
  std::uint32_t site = 0;  // index into frames; == size when the stack names no site
  std::uint32_t site_frame() const noexcept { return site < size ? frames[site] : 0; }
};

// Limits every writer keeps and every reader enforces (a hostile file cannot exceed them).
inline constexpr std::uint32_t kMaxStackFrames = 4096;  // frames in one stack

}  // namespace ridgescope
