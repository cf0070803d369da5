// Specification of the one frame-text formatter and the library-frame rule by kind
// (csrc/core/trace/frame_text.h), what every report frame carries as `text`, `location` and
// `library`.
#include <string>

#include "catch.h"
#include "frame_text.h"

using ridgescope::FrameKind;
using ridgescope::detail::format_frame;
using ridgescope::detail::FramePath;
using ridgescope::detail::is_library_frame;

SCENARIO("a frame reads the same everywhere", "[core][frame_text]") {
  GIVEN("a Python frame") {
    THEN("short: the file's base name, line and function; full: the whole path") {
      CHECK(format_frame(FrameKind::Python, "/home/me/proj/model.py", 50, "MLPBlock.forward", "") ==
            "model.py:50 in MLPBlock.forward");
      CHECK(format_frame(FrameKind::Python, "/home/me/proj/model.py", 50, "MLPBlock.forward", "", FramePath::Full) ==
            "/home/me/proj/model.py:50 in MLPBlock.forward");
      CHECK(format_frame(FrameKind::Python, "C:\\proj\\train.py", 7, "main", "") == "train.py:7 in main");
      CHECK(format_frame(FrameKind::Python, "", 0, "", "") == "?");
    }
  }
  GIVEN("native frames, as torch's snapshots and stacks=\"all\" record them") {
    THEN("the function, then its file when one is known") {
      CHECK(format_frame(FrameKind::Native, "??", 0, "_PyEval_EvalFrameDefault", "") == "_PyEval_EvalFrameDefault");
      CHECK(format_frame(FrameKind::Native, "", 0, "at::native::empty_cuda", "") == "at::native::empty_cuda");
      CHECK(format_frame(FrameKind::Native, "/x/lib/libtorch_cpu.so", 0, "at::native::empty_cpu", "") ==
            "at::native::empty_cpu (libtorch_cpu.so)");
      CHECK(format_frame(FrameKind::Native, "/x/lib/libtorch_cpu.so", 0, "at::native::empty_cpu", "",
                         FramePath::Full) == "at::native::empty_cpu (/x/lib/libtorch_cpu.so)");
      CHECK(format_frame(FrameKind::Native, "RegisterCUDA_0.cpp", 12, "f", "") == "f (RegisterCUDA_0.cpp:12)");
    }
  }
  GIVEN("an autograd node and a marker") {
    CHECK(format_frame(FrameKind::Autograd, "", 0, "MmBackward0", "layers.3.mlp.fc1") == "MmBackward0 of layers.3.mlp.fc1");
    CHECK(format_frame(FrameKind::Autograd, "", 0, "AccumulateGrad", "") == "AccumulateGrad");
    CHECK(format_frame(FrameKind::Untracked, "", 0, "allocated before tracking started", "") ==
          "(allocated before tracking started)");
    CHECK(format_frame(FrameKind::Untracked, "", 0, "", "") == "(no site)");
  }
}

SCENARIO("which frames are library code, by kind", "[core][frame_text]") {
  THEN("native frames always: the interpreter's, libc's and torch's C++") {
    CHECK(is_library_frame(FrameKind::Native, "??"));
    CHECK(is_library_frame(FrameKind::Native, "/home/me/ext/_C.so"));
  }
  THEN("Python frames by their file; autograd nodes (they name the user's module) and markers never") {
    CHECK(is_library_frame(FrameKind::Python, "/usr/lib/python3.11/runpy.py"));
    CHECK_FALSE(is_library_frame(FrameKind::Python, "/home/me/train.py"));
    CHECK_FALSE(is_library_frame(FrameKind::Autograd, ""));
    CHECK_FALSE(is_library_frame(FrameKind::Untracked, ""));
  }
}
