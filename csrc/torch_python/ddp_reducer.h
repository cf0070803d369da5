// ddp_reducer.h — the gradient buckets of a DistributedDataParallel reducer, read from the
// reducer itself (c10d::Reducer::get_grad_buckets(false): the real bucket tensors, not the zero
// copies Python's `_get_zeros_like_grad_buckets` returns). Used by python/ridgescope/distributed
// to tag each bucket's storage as a communication buffer (docs/distributed.md).
//
// The API used is the same in torch 2.11 through 2.14; it takes the reducer's own mutex.
// Thread-safety: call while no backward pass is running on the reducer (between steps, or from
// a forward hook); it never throws (an error returns no buckets and says why).
//
// Header-only: c10d's reducer.hpp is among the costliest headers to compile, and the module's
// bindings (csrc/bindings/distributed_bindings.cpp) include it already, so the one translation
// unit that includes this header parses it once.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <exception>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/reducer.hpp>

namespace ridgescope::sources {

struct DdpBucket {
  std::size_t index = 0;            // the reducer's bucket index (reduction order)
  at::Tensor buffer;                // the flat bucket tensor the allreduce runs on
  std::vector<at::Tensor> parameters;  // the parameters whose gradients it holds, in order
};

// The reducer's buckets now; on failure none, and *error says why.
inline std::vector<DdpBucket> ddp_buckets(const c10d::Reducer& reducer, std::string* error) noexcept {
  std::vector<DdpBucket> out;
  try {
    const std::vector<c10d::GradBucket> buckets = reducer.get_grad_buckets(/*return_zero_tensors=*/false);
    out.reserve(buckets.size());
    for (const auto& b : buckets) {
      DdpBucket d;
      d.index = b.getIndex();
      d.buffer = b.getBuffer();
      d.parameters = b.getParameters();
      out.push_back(std::move(d));
    }
  } catch (const std::exception& ex) {
    out.clear();
    if (error != nullptr) *error = ex.what();
  } catch (...) {
    out.clear();
    if (error != nullptr) *error = "unknown error reading the DDP reducer's buckets";
  }
  return out;
}

}  // namespace ridgescope::sources
