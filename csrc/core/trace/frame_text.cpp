// frame_text.cpp — frames as text, and which are library code (see frame_text.h).
#include "frame_text.h"

namespace ridgescope::detail {
namespace {

std::string_view base_name(std::string_view file) {
  const auto slash = file.find_last_of("/\\");
  return slash == std::string_view::npos ? file : file.substr(slash + 1);
}

}  // namespace

std::string format_frame(FrameKind kind, std::string_view file, std::uint64_t line, std::string_view function,
                         std::string_view module, FramePath path) {
  const std::string_view shown = path == FramePath::Base ? base_name(file) : file;
  std::string out;
  switch (kind) {
    case FrameKind::Python:
      out = shown.empty() ? std::string("?") : std::string(shown);
      if (line != 0) out += ":" + std::to_string(line);
      if (!function.empty()) out += " in " + std::string(function);
      return out;
    case FrameKind::Native:
      out = function.empty() ? std::string("?") : std::string(function);
      if (!shown.empty() && shown != "??") {
        out += " (" + std::string(shown);
        if (line != 0) out += ":" + std::to_string(line);
        out += ")";
      }
      return out;
    case FrameKind::Autograd:
      out = std::string(function);
      if (!module.empty()) out += " of " + std::string(module);
      return out;
    case FrameKind::Untracked:
      break;
  }
  // Not a place in code: what is known instead, in parentheses.
  return "(" + (function.empty() ? std::string("no site") : std::string(function)) + ")";
}

bool is_library_frame(FrameKind kind, std::string_view file, const CodeRoots* roots) noexcept {
  switch (kind) {
    case FrameKind::Native: return true;
    case FrameKind::Python: return is_library_file(file, roots);
    case FrameKind::Autograd:
    case FrameKind::Untracked: return false;
  }
  return false;
}

}  // namespace ridgescope::detail
