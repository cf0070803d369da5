// bindings.h — the parts of ridgescope._C, one source file each (module.cpp calls them in
// order), and the one conversion they share. Conversions only: the logic lives in csrc/core
// and csrc/torch, the policy in python/ridgescope. The build joins the parts into one unity
// translation unit (cmake/RidgescopeBindings.cmake), so names at file scope (anonymous
// namespaces included) must be unique across the parts.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "ridgescope/category.h"

namespace ridgescope_bindings {

// The constants and rules Python shares with C++ (_C.VERSION, TRACE_MAGIC, CATEGORIES, ...),
// format_bytes, the trace and snapshot readers and TraceWriter (trace_bindings.cpp).
void bind_trace(pybind11::module_& m);
// _C.Session, the saved-tensor hooks, the allocator sources' probes, Python frames
// (session_bindings.cpp; torch's Python headers).
void bind_session(pybind11::module_& m);
// _C.AllocatorModel, parse_alloc_conf, simulate_allocator (allocator_model_bindings.cpp).
void bind_allocator_model(pybind11::module_& m);
// _C.ddp_buckets (distributed_bindings.cpp; torch's c10d headers).
void bind_distributed(pybind11::module_& m);
// _C.compact_trace, read_summaries, TraceFollower (flight_bindings.cpp).
void bind_flight(pybind11::module_& m);

// A category by its name (ridgescope/category.h); ValueError for an unknown one.
inline ridgescope::Category to_category(const std::string& name) {
  ridgescope::Category c;
  if (!ridgescope::parse_category(name, &c)) {
    throw pybind11::value_error("unknown category '" + name + "'");
  }
  return c;
}

}  // namespace ridgescope_bindings
