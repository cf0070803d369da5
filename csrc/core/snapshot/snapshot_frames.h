// snapshot_frames.h — reading the stack frames of a torch memory snapshot's entries: which
// phase a stack names, where a block was made (the user frame and the module path from
// nn.Module calls), and frames as reasons print them (internal to the core; used by the reader
// and the inference).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "library_files.h"  // path_has
#include "ridgescope/phase.h"

namespace ridgescope::detail {

// One stack frame of a snapshot entry (torch lists them innermost first). The views point into
// the parsed pickle, which outlives the inference.
struct SnapshotFrame {
  std::string_view filename, name;
  std::int64_t line = 0;
};
using SnapshotFrames = std::vector<SnapshotFrame>;

// The phase a stack names, decisive frame kinds in this order: zero_grad, the optimizer
// (torch/optim/), a recomputation (an nn.Module call under autograd's engine or a checkpoint's
// recomputing frame: CheckpointFunction.backward, unpack_hook, recompute_fn of
// torch/utils/checkpoint.py), backward (Tensor.backward, autograd's engine), forward (an
// nn.Module call or a `forward`); PhaseKind::Other when no frame decides.
PhaseKind phase_from_frames(const SnapshotFrames& frames);

// The stack is a Python program's main thread: its outermost Python frame is a script's
// `<module>` (or runpy's, for `python -m`). Python code that autograd's engine thread runs (a
// hook, a recomputation) starts from the function the engine called instead.
bool from_main_thread(const SnapshotFrames& frames);

// Where a block was made, for labels: the user frame that called the outermost module, then
// the module path, one `forward` frame per nn.Module call (`_call_impl` frames of
// torch/nn/modules/module.py), outermost first, e.g. "train.py:42 in main > model.py:88 in forward >
// linear.py:116 in forward" (at most four module frames; "..." marks omitted outer ones). Without
// module calls: the innermost frame of the user's code (a Python file not library code), else the
// innermost Python frame; "" when there is no Python frame.
std::string where_from_frames(const SnapshotFrames& frames);

// A frame as reasons print it: the file from its "torch/" part (or its base name), and the
// function: "torch/optim/adamw.py _init_group".
std::string frame_text(const SnapshotFrame& frame);

// A frame as labels print it: "model.py:88 in forward" (format_frame, frame_text.h).
std::string python_frame_text(const SnapshotFrame& frame);

// A C++ function name without its return type, template arguments and argument list:
// "void torch::autograd::AccumulateGrad::accumulateGrad<...>(at::Tensor&, ...)" becomes
// "torch::autograd::AccumulateGrad::accumulateGrad".
std::string cpp_function_name(std::string_view name);

// A Python function's name is `name`: torch records the code object's name ("backward"); a
// qualified name ("CheckpointFunction.backward") counts too.
bool function_is(std::string_view function, std::string_view name);

// A Python frame (a .py file).
bool is_python(const SnapshotFrame& frame);

// A frame of library code, not the user's: the core's one rule (library_files.h; torch, the
// standard library, code generated for torch, ridgescope). Third-party packages are the user's.
bool is_library(const SnapshotFrame& frame);

}  // namespace ridgescope::detail
