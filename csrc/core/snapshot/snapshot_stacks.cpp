// snapshot_stacks.cpp — a snapshot's allocation stacks as trace frames and stacks
// (snapshot_stacks.h).
#include "snapshot_stacks.h"

#include <string>
#include <string_view>
#include <utility>

#include "ridgescope/stack.h"

namespace ridgescope::detail {
namespace {

bool is_pseudo(const SnapshotFrame& f) { return f.filename == "ridgescope" && f.line == 0; }

// The autograd node a native frame runs, from torch's C++ frames in backward:
// "torch::autograd::generated::AddmmBackward0::apply(...)" is "AddmmBackward0",
// "torch::autograd::AccumulateGrad::apply(...)" is "AccumulateGrad"; "" for any other frame.
std::string node_of(const SnapshotFrame& f) {
  if (is_python(f) || f.name.find("torch::autograd::") == std::string_view::npos) return {};
  const std::string name = cpp_function_name(f.name);
  constexpr std::string_view kApply = "::apply";
  if (name.size() <= kApply.size() || name.compare(name.size() - kApply.size(), kApply.size(), kApply) != 0) return {};
  const std::string owner = name.substr(0, name.size() - kApply.size());
  const auto colon = owner.rfind("::");
  std::string node = colon == std::string::npos ? owner : owner.substr(colon + 2);
  if (node.empty() || node == "Node" || node == "Engine" || node == "(anonymous)") return {};
  return node;
}

FrameText to_frame(const SnapshotFrame& f, std::string& function_storage) {
  FrameText t;
  t.line = f.line > 0 ? static_cast<std::uint64_t>(f.line) : 0;
  if (std::string node = node_of(f); !node.empty()) {  // torch's own frame of an autograd node
    t.kind = FrameKind::Autograd;
    t.line = 0;
    function_storage = std::move(node);
    t.function = function_storage;
    return t;
  }
  if (f.filename == "<autograd>") {  // ridgescope's export: "MmBackward0 of layers.3.mlp.fc1"
    t.kind = FrameKind::Autograd;
    t.line = 0;
    const std::string_view name = f.name;
    const auto of = name.find(" of ");
    t.function = of == std::string_view::npos ? name : name.substr(0, of);
    t.module = of == std::string_view::npos ? std::string_view() : name.substr(of + 4);
    return t;
  }
  if (f.filename == "<ridgescope>") {
    t.kind = FrameKind::Untracked;
    t.line = 0;
    t.function = f.name;
    return t;
  }
  t.file = f.filename;
  if (is_python(f)) {
    t.kind = FrameKind::Python;
    t.function = f.name;
  } else {
    t.kind = FrameKind::Native;
    function_storage = cpp_function_name(f.name);
    t.function = function_storage;
  }
  return t;
}

}  // namespace

std::size_t snapshot_site(const SnapshotFrames& frames) {
  std::size_t autograd = frames.size();
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const SnapshotFrame& f = frames[i];
    if (is_pseudo(f)) continue;
    if (is_python(f) && !is_library(f)) return i;
    if (autograd == frames.size() &&
        (f.filename == "<autograd>" || f.filename == "<ridgescope>" || !node_of(f).empty()))
      autograd = i;
  }
  return autograd;
}

std::uint32_t SnapshotStacks::stack_of(const SnapshotFrames& frames) {
  if (frames.empty()) return 0;
  auto [it, inserted] = ids_.try_emplace(&frames, 0);
  if (!inserted) return it->second;
  const std::size_t site = snapshot_site(frames);
  scratch_.clear();
  std::uint32_t site_index = UINT32_MAX;
  std::string storage;
  for (std::size_t i = 0; i < frames.size() && scratch_.size() < kMaxStackFrames; ++i) {
    if (is_pseudo(frames[i])) continue;
    if (i == site) site_index = static_cast<std::uint32_t>(scratch_.size());
    const std::uint32_t id = rec_.intern_frame(to_frame(frames[i], storage));
    if (id == 0) return 0;  // the recorder failed; the replay reports that
    scratch_.push_back(id);
  }
  if (scratch_.empty()) return 0;
  if (site_index == UINT32_MAX) site_index = static_cast<std::uint32_t>(scratch_.size());
  it->second = rec_.intern_stack(scratch_.data(), scratch_.size(), site_index);
  return it->second;
}

}  // namespace ridgescope::detail
