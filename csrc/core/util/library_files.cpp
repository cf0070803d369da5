// library_files.cpp — which source files are library code (see library_files.h).
#include "library_files.h"

#include "json_value.h"

namespace ridgescope::detail {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

char normal(char c) { return c == '\\' ? '/' : c; }

// The position of `needle` in `path` ('\' read as '/'), or npos.
std::size_t path_find(std::string_view path, std::string_view needle, std::size_t from = 0) {
  if (needle.size() > path.size()) return std::string_view::npos;
  for (std::size_t i = from; i + needle.size() <= path.size(); ++i) {
    std::size_t j = 0;
    while (j < needle.size() && normal(path[i + j]) == needle[j]) ++j;
    if (j == needle.size()) return i;
  }
  return std::string_view::npos;
}

bool installed_package(std::string_view rest) {
  return path_has(rest, "site-packages/") || path_has(rest, "dist-packages/");
}

bool digit(char c) { return c >= '0' && c <= '9'; }

// ".../lib/python3.11/...", ".../lib64/python3.13t/...", "...\Lib\..." (Windows), outside the
// packages installed there.
bool stdlib_by_path(std::string_view file) {
  for (std::string_view lib : {std::string_view("/lib/python"), std::string_view("/lib64/python")}) {
    for (std::size_t at = path_find(file, lib); at != std::string_view::npos; at = path_find(file, lib, at + 1)) {
      std::size_t i = at + lib.size();
      if (i >= file.size() || !digit(file[i])) continue;
      while (i < file.size() && (digit(file[i]) || file[i] == '.')) ++i;
      if (i < file.size() && file[i] == 't') ++i;  // a free-threaded build
      if (i < file.size() && normal(file[i]) == '/') return !installed_package(file.substr(i));
    }
  }
  if (const std::size_t at = path_find(file, "/Lib/"); at != std::string_view::npos) {
    return !installed_package(file.substr(at));
  }
  return false;
}

}  // namespace

bool path_has(std::string_view path, std::string_view needle) noexcept {
  if (path.find('\\') == std::string_view::npos) return path.find(needle) != std::string_view::npos;
  return path_find(path, needle) != std::string_view::npos;
}

bool is_library_file(std::string_view file, const CodeRoots* roots) noexcept {
  // Frozen standard-library modules, and the code torch.fx generates (the graph Dynamo captured).
  if (starts_with(file, "<frozen ") || starts_with(file, "<eval_with_key>")) return true;
  if (roots != nullptr) {
    for (const std::string& root : roots->library) {
      if (starts_with(file, root)) return true;
    }
    for (const std::string& root : roots->stdlib) {
      if (starts_with(file, root) && !installed_package(file.substr(root.size()))) return true;
    }
  }
  if (starts_with(file, "torch/") || starts_with(file, "torch\\") || path_has(file, "/torch/")) return true;
  if (path_has(file, "-packages/ridgescope/") || path_has(file, "/torchinductor_")) return true;
  // Installed packages that wrap a tensor operation, as torch.nn.functional does: the line
  // that called them is the place to look (einops.einsum's own line is the same for every call).
  for (std::string_view op_library : {"-packages/einops/", "-packages/opt_einsum/", "-packages/triton/",
                                      "-packages/flash_attn/"}) {
    if (path_has(file, op_library)) return true;
  }
  return stdlib_by_path(file);
}

CodeRoots code_roots_from_sites_metadata(std::string_view json) {
  CodeRoots out;
  std::string error;
  const std::optional<JsonValue> v = parse_json(json, &error);
  if (!v) return out;
  auto strings = [&](std::string_view key, std::vector<std::string>& into) {
    const JsonValue* a = v->get(key);
    if (a == nullptr || a->type != JsonValue::Type::Array) return;
    for (const JsonValue& s : a->array) {
      if (s.type == JsonValue::Type::String && !s.string.empty()) into.push_back(s.string);
    }
  };
  strings("library_roots", out.library);
  strings("stdlib_roots", out.stdlib);
  return out;
}

}  // namespace ridgescope::detail
