#include "ridgescope/category.h"

#include <array>

#include "ridgescope/event.h"

namespace ridgescope {
namespace {
constexpr std::array<std::string_view, kCategoryCount> kNames = {
    "unknown",    "parameter", "buffer",    "gradient",  "optimizer_state",
    "activation", "input",     "temporary", "workspace", "comm_buffer"};
}  // namespace

std::string_view category_name(Category category) noexcept {
  const auto i = category_index(category);
  return i < kNames.size() ? kNames[i] : kNames[0];
}

bool parse_category(std::string_view name, Category* out) noexcept {
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) {
      *out = static_cast<Category>(i);
      return true;
    }
  }
  return false;
}

Category category_from_byte(std::uint8_t value) noexcept {
  return value < kCategoryCount ? static_cast<Category>(value) : Category::Unknown;
}

std::string_view event_kind_name(EventKind kind) noexcept {
  switch (kind) {
    case EventKind::Alloc: return "alloc";
    case EventKind::Free: return "free";
    case EventKind::SegmentAlloc: return "segment_alloc";
    case EventKind::SegmentFree: return "segment_free";
    case EventKind::Tag: return "tag";
    case EventKind::PhaseBegin: return "phase_begin";
    case EventKind::PhaseEnd: return "phase_end";
    case EventKind::Step: return "step";
    case EventKind::Oom: return "oom";
    case EventKind::Sample: return "sample";
    case EventKind::String: return "string";
    case EventKind::Metadata: return "metadata";
    case EventKind::ExternalAlloc: return "external_alloc";
    case EventKind::ExternalFree: return "external_free";
    case EventKind::Frame: return "frame";
    case EventKind::Stack: return "stack";
  }
  return "unknown_kind";
}

}  // namespace ridgescope
