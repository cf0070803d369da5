// distributed_bindings.cpp — ridgescope._C's distributed conversions (docs/distributed.md):
// `ddp_buckets(reducer)` turns torch's own `torch._C._distributed_c10d.Reducer` object (DDP's
// `ddp.reducer`) into a list of (index, bucket tensor, [parameters]). Conversions only.

#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "bindings.h"
#include "ddp_reducer.h"

namespace ridgescope_bindings {

void bind_distributed(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("ddp_buckets", [](py::handle reducer) {
    // The reducer is a pybind11 object of torch's own module, held by shared_ptr; casting it
    // needs torch's and our module's pybind11 to share type information (same pybind11 build
    // ABI). When they do not, or it is something else, this raises TypeError (the caller
    // reports it in the bucket section).
    if (!py::isinstance<c10d::Reducer>(reducer)) {
      throw py::type_error("ddp_buckets: expected DDP's reducer (torch._C._distributed_c10d.Reducer), got " +
                           py::str(py::type::of(reducer)).cast<std::string>() +
                           " (or torch's pybind11 types are not visible to ridgescope's module)");
    }
    auto* r = reducer.cast<c10d::Reducer*>();
    std::string error;
    auto buckets = ridgescope::sources::ddp_buckets(*r, &error);
    if (!error.empty()) throw std::runtime_error(error);
    py::list out;
    for (auto& b : buckets) out.append(py::make_tuple(b.index, b.buffer, b.parameters));
    return out;
  }, py::arg("reducer"));
}

}  // namespace ridgescope_bindings
