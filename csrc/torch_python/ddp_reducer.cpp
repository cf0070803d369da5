#include "ddp_reducer.h"

#include <exception>

#include <torch/csrc/distributed/c10d/reducer.hpp>

namespace ridgescope::sources {

std::vector<DdpBucket> ddp_buckets(const c10d::Reducer& reducer, std::string* error) noexcept {
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
