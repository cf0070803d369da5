// frame_text.h — a frame as a person reads it, and whether it is library code: the one
// spelling and the one rule every report uses (internal to csrc/core). The analysis stores both
// on each report frame (`frames[].text`, `.location`, `.library`, docs/report_schema.md), so the
// text report, the HTML report and the site tables print what the core decided, and a
// snapshot's labels spell their frames the same way.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "library_files.h"
#include "ridgescope/stack.h"

namespace ridgescope::detail {

// How much of a frame's file to show.
enum class FramePath : std::uint8_t {
  Base,  // its last component: "model.py:50 in MLPBlock.forward"
  Full,  // the whole path: "/home/me/proj/model.py:50 in MLPBlock.forward"
};

// A frame as text:
//   python     "model.py:50 in MLPBlock.forward" (":line" only when known)
//   native     "at::native::empty_cpu (libtorch_cpu.so)" (the file only when known, not "??")
//   autograd   "MmBackward0 of layers.3.mlp.fc1" (" of module" only when known)
//   untracked  "(allocated before tracking started)"
std::string format_frame(FrameKind kind, std::string_view file, std::uint64_t line, std::string_view function,
                         std::string_view module, FramePath path = FramePath::Base);

// Whether a frame is library code: a native frame always (the interpreter's, libc's, torch's
// C++); a Python frame by its file (library_files.h); an autograd node (it names the user's
// module) or a marker never.
bool is_library_frame(FrameKind kind, std::string_view file, const CodeRoots* roots = nullptr) noexcept;

}  // namespace ridgescope::detail
