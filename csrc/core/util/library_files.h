// library_files.h — which source files are library code rather than the user's: the one rule
// behind every "is this frame library code?" (docs/sites.md, "Library frames"). The live site
// capture (csrc/torch_python/python_frames.cpp) skips library frames when it looks for the
// user's frame; a snapshot's reader (csrc/core/snapshot/snapshot_stacks.cpp) picks its sites by
// the same rule; the report marks every frame with it (`frames[].library`, through
// trace/frame_text.h), and the text and HTML reports fold library frames by that flag.
// Internal to csrc/core (util: the named internal interface, also used by csrc/torch_python).
//
// Library code is:
//   * torch, everywhere: a `torch/` directory in the path (site-packages/torch/..., a source
//     checkout's torch/...), or under the torch directory this machine knows;
//   * code generated for torch: torch.fx's `<eval_with_key>.N` modules and Inductor's output
//     (`/torchinductor_<user>/`, the default cache, or the configured cache directory);
//   * ridgescope itself (`site-packages/ridgescope/`, or its directory on this machine);
//   * Python's standard library: `.../lib/pythonX.Y/...` (also `lib64`, a `t` build, Windows'
//     `\Lib\`), frozen modules (`<frozen ...>`), or under this machine's stdlib directories;
//     never what is installed inside it (`site-packages/`, `dist-packages/`).
//   * installed packages that wrap a tensor operation as torch.nn.functional does: einops,
//     opt_einsum, triton (Inductor's kernels), flash_attn (the line that called them is the
//     place to look; their own line is the same for every call).
// Other third-party packages (transformers, accelerate, your own installed package) are the
// user's code: a model's line in transformers is where its activations are made.
//
// A snapshot made elsewhere is judged by the path patterns alone; a live trace adds the
// directories the tracking process knew (CodeRoots, recorded in the trace's `sites` metadata
// as `library_roots` and `stdlib_roots`), so the report judges a frame as the capture did.
//
// Thread-safety: pure functions; CodeRoots is plain data.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ridgescope::detail {

// Directories this machine's Python holds library code in (each ends with the separator).
struct CodeRoots {
  std::vector<std::string> library;  // torch's, ridgescope's, Inductor's cache: everything under them
  std::vector<std::string> stdlib;   // the standard library's: except what is installed inside it
  bool empty() const { return library.empty() && stdlib.empty(); }
};

// Whether the Python source `file` is library code (the rule above); `roots` may be null.
bool is_library_file(std::string_view file, const CodeRoots* roots = nullptr) noexcept;

// The roots a trace's `sites` metadata records ({"library_roots": [...], "stdlib_roots":
// [...]}); empty when it records none or is not valid JSON.
CodeRoots code_roots_from_sites_metadata(std::string_view json);

// `needle` (written with '/') occurs in `path`, where '\' counts as '/' (Windows paths).
bool path_has(std::string_view path, std::string_view needle) noexcept;

}  // namespace ridgescope::detail
