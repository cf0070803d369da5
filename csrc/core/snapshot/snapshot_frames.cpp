// snapshot_frames.cpp — reading a snapshot entry's stack frames (see snapshot_frames.h).
#include "snapshot_frames.h"

#include <algorithm>

#include "frame_text.h"

namespace ridgescope::detail {
namespace {

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_module_call(const SnapshotFrame& f) {
  return path_has(f.filename, "torch/nn/modules/module.py") && (f.name == "_call_impl" || f.name == "_wrapped_call_impl");
}

std::string_view base_name(std::string_view file) {
  const auto slash = file.find_last_of("/\\");
  return slash == std::string_view::npos ? file : file.substr(slash + 1);
}

// A C++ function name without its return type, template arguments and argument list:
// "void torch::autograd::AccumulateGrad::accumulateGrad<std::function<...> >(at::Tensor&, ...)"
// becomes "torch::autograd::AccumulateGrad::accumulateGrad".
std::string short_cpp_name(std::string_view name) {
  std::string out;
  int angle = 0;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name.substr(i, 21) == "(anonymous namespace)") {
      if (angle == 0) out += "(anonymous)";
      i += 20;
      continue;
    }
    const char c = name[i];
    if (c == '<' && !(i > 0 && name.substr(i - 1, 2) == "<<") && name.substr(0, i).rfind("operator") != i - 8) {
      ++angle;
      continue;
    }
    if (c == '>' && angle > 0) {
      --angle;
      continue;
    }
    if (angle > 0) continue;
    if (c == '(') break;  // the argument list
    out += c;
  }
  if (const auto space = out.rfind(' '); space != std::string::npos) out = out.substr(space + 1);  // return type
  return out.empty() ? std::string(name) : out;
}

}  // namespace

std::string cpp_function_name(std::string_view name) { return short_cpp_name(name); }

bool is_python(const SnapshotFrame& f) { return ends_with(f.filename, ".py"); }

bool is_library(const SnapshotFrame& f) { return is_library_file(f.filename); }

std::string python_frame_text(const SnapshotFrame& f) {
  return format_frame(FrameKind::Python, f.filename, f.line > 0 ? static_cast<std::uint64_t>(f.line) : 0, f.name, {});
}

bool function_is(std::string_view function, std::string_view name) {
  return function == name || (function.size() > name.size() && ends_with(function, name) &&
                              function[function.size() - name.size() - 1] == '.');
}

// A frame of activation checkpointing that recomputes a forward during backward: the reentrant
// CheckpointFunction.backward, the non-reentrant unpack hook and its recompute_fn.
bool is_recompute_frame(const SnapshotFrame& f) {
  return path_has(f.filename, "torch/utils/checkpoint.py") &&
         (function_is(f.name, "backward") || function_is(f.name, "unpack_hook") || function_is(f.name, "recompute_fn"));
}

PhaseKind phase_from_frames(const SnapshotFrames& frames) {
  bool zero_grad = false, optimizer = false, backward = false, forward = false, recompute = false;
  for (const SnapshotFrame& f : frames) {
    if (contains(f.name, "zero_grad")) zero_grad = true;
    if (path_has(f.filename, "torch/optim/")) optimizer = true;
    if ((function_is(f.name, "backward") && (path_has(f.filename, "torch/_tensor.py") || path_has(f.filename, "torch/autograd/"))) ||
        contains(f.name, "_engine_run_backward") || contains(f.name, "autograd::Engine") ||
        contains(f.name, "evaluate_function")) {
      backward = true;
    }
    if (is_recompute_frame(f)) recompute = true;
    if (is_module_call(f) || function_is(f.name, "forward")) forward = true;
  }
  if (zero_grad) return PhaseKind::ZeroGrad;
  if (optimizer) return PhaseKind::OptimizerStep;
  // A module's forward run while autograd evaluates the backward: a checkpoint's recomputation.
  if (forward && (recompute || backward)) return PhaseKind::Recompute;
  if (backward) return PhaseKind::Backward;
  if (recompute) return PhaseKind::Recompute;
  if (forward) return PhaseKind::Forward;
  return PhaseKind::Other;
}

bool from_main_thread(const SnapshotFrames& frames) {
  for (std::size_t i = frames.size(); i-- > 0;) {
    const SnapshotFrame& f = frames[i];
    if (!is_python(f) && f.name != "<module>") continue;  // `python -c` runs "<string>"
    // The outermost Python frame: a script's top level, or runpy running a module (python -m).
    return f.name == "<module>" || path_has(f.filename, "/runpy.py") || f.filename == "runpy.py";
  }
  return false;
}

std::string where_from_frames(const SnapshotFrames& frames) {
  // Python frames, innermost first.
  std::vector<const SnapshotFrame*> py;
  for (const SnapshotFrame& f : frames) {
    if (is_python(f)) py.push_back(&f);
  }
  if (py.empty()) return {};
  std::vector<const SnapshotFrame*> modules;  // the module's own frame inside each call, innermost first
  std::size_t outermost_call = py.size();
  for (std::size_t i = 0; i < py.size(); ++i) {
    if (!is_module_call(*py[i])) continue;
    outermost_call = i;
    std::size_t j = i;
    while (j > 0 && path_has(py[j - 1]->filename, "torch/nn/modules/module.py")) --j;
    if (j > 0 && (modules.empty() || modules.back() != py[j - 1])) modules.push_back(py[j - 1]);
  }
  const SnapshotFrame* user = nullptr;
  if (!modules.empty()) {
    for (std::size_t i = outermost_call + 1; i < py.size(); ++i) {
      if (!is_library(*py[i])) {
        user = py[i];
        break;
      }
    }
    std::string out = user != nullptr ? python_frame_text(*user) : std::string();
    const std::size_t shown = std::min<std::size_t>(modules.size(), 4);
    if (modules.size() > shown) out += out.empty() ? "..." : " > ...";
    for (std::size_t k = shown; k-- > 0;) {
      if (!out.empty()) out += " > ";
      out += python_frame_text(*modules[k]);
    }
    return out;
  }
  for (const SnapshotFrame* f : py) {
    if (!is_library(*f)) return python_frame_text(*f);
  }
  return python_frame_text(*py.front());
}

std::string frame_text(const SnapshotFrame& f) {
  if (!is_python(f)) return short_cpp_name(f.name);
  std::string_view file = f.filename;
  std::size_t torch = std::string_view::npos;
  for (std::size_t i = 0; i + 6 <= file.size(); ++i) {
    if (path_has(file.substr(i, 6), "torch/") && (i == 0 || file[i - 1] == '/' || file[i - 1] == '\\')) torch = i;
  }
  std::string shown(torch != std::string_view::npos ? file.substr(torch) : base_name(file));
  std::replace(shown.begin(), shown.end(), '\\', '/');
  return shown + " " + std::string(f.name);
}

}  // namespace ridgescope::detail
