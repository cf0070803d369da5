#include "ridgescope/category.h"

#include <array>

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

}  // namespace ridgescope
