// module.cpp — ridgescope._C: the module's definition. Each part is bound in its own
// translation unit (bindings.h); the logic lives in csrc/core and csrc/torch, the policy in
// python/ridgescope.
#include <pybind11/pybind11.h>

#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "ridgescope native core (see python/ridgescope for the public API)";
  ridgescope_bindings::bind_trace(m);             // constants, format_bytes, analyze, snapshots, TraceWriter
  ridgescope_bindings::bind_allocator_model(m);  // _C.AllocatorModel, simulate_allocator
  ridgescope_bindings::bind_distributed(m);      // _C.ddp_buckets
  ridgescope_bindings::bind_flight(m);           // _C.compact_trace, read_summaries, TraceFollower
  ridgescope_bindings::bind_session(m);          // _C.Session and the sources' probes
}
