// ridgescope/category.h — the public vocabulary of memory categories (design.md §3).
//
// Every live allocator block has exactly one Category at every instant. The names returned by
// category_name() are the stable strings used in the JSON report, the snapshot export and the
// HTML report; never rename one without a schema bump.
//
// Thread-safety: everything here is a pure function of its arguments; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ridgescope {

enum class Category : std::uint8_t {
  Unknown = 0,      // none of the signals below
  Parameter = 1,    // storage of an nn.Parameter
  Buffer = 2,       // registered module buffer
  Gradient = 3,     // .grad storage of a parameter
  OptimizerState = 4,  // tensors held in optimizer.state (moments, step counters, master weights)
  Activation = 5,   // tensors saved for backward, and recomputed ones
  Input = 6,        // the batch and other inputs of the root module
  Temporary = 7,    // allocated and freed inside one phase, nothing else known
  Workspace = 8,    // library scratch that never backs a tensor storage
  CommBuffer = 9,   // collective communication buffers
};

inline constexpr std::size_t kCategoryCount = 10;

// The stable public name ("parameter", "optimizer_state", ...). Unknown values give "unknown".
std::string_view category_name(Category category) noexcept;

// Parses a public name; returns false (and leaves *out alone) when the name is not a category.
bool parse_category(std::string_view name, Category* out) noexcept;

// Converts a stored byte to a Category; out-of-range values (a newer or corrupt trace) map to
// Unknown.
Category category_from_byte(std::uint8_t value) noexcept;

inline constexpr std::size_t category_index(Category category) noexcept {
  return static_cast<std::size_t>(category);
}

}  // namespace ridgescope
