// ridgescope/session.h — tracking from a libtorch C++ trainer: a Session, RAII phase markers,
// and the tagging of a torch::nn::Module and a torch::optim::Optimizer.
//
//   #include <ridgescope/ridgescope.h>
//   ridgescope::Session session(ridgescope::Options{}.out("run.rstrace"));
//   session.track(model, optimizer);
//   for (...) {
//     { ridgescope::PhaseGuard g(session, ridgescope::Phase::ZeroGrad); optimizer.zero_grad(); }
//     { ridgescope::PhaseGuard g(session, ridgescope::Phase::Forward); loss = ...; }
//     { ridgescope::PhaseGuard g(session, ridgescope::Phase::Backward); loss.backward(); }
//     { ridgescope::PhaseGuard g(session, ridgescope::Phase::OptimizerStep); optimizer.step(); }
//   }
//   session.report().write_json("run.json");
//
// This header needs libtorch (it is the only public header that includes torch); the core
// headers it builds on do not. Parameters and buffers are tagged with their hierarchical names,
// gradients at the end of every Backward phase, optimizer state (from optimizer.state()) at the
// end of every OptimizerStep phase, which also counts a step. Activations are inferred from
// lifetimes (allocated in Forward, live at its end, freed in Backward): libtorch has no
// saved-tensor hook that C++ can install (docs/cpp.md says where this differs from Python).
//
// Errors: misuse throws at the call (a second Session while one runs, track() twice, a module
// without parameters, a PhaseGuard on a stopped Session); an internal error while recording
// stops recording (error() says why) and never reaches the training loop. Creating no Session
// changes nothing: the library installs no hook at load time.
//
// Thread-safety: one Session per process at a time, used from the training thread. Allocations
// and frees on any thread are recorded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "ridgescope/analysis.h"
#include "ridgescope/category.h"
#include "ridgescope/report.h"

namespace ridgescope {

// The built-in phases (docs/phases.md). Names of your own go through the string overloads.
enum class Phase { Forward, Backward, OptimizerStep, ZeroGrad, Checkpoint, Eval, Data };

// "forward", "backward", "optimizer_step", "zero_grad", "checkpoint", "eval", "data".
std::string_view phase_name(Phase phase) noexcept;

class Options {
 public:
  // The trace file to write (default "ridgescope.rstrace" in the working directory).
  Options& out(std::string path) {
    out_ = std::move(path);
    return *this;
  }
  const std::string& out() const noexcept { return out_; }

  // A simulated device capacity in bytes for CPU runs (0, the default: none). An allocation
  // past it records the failure in the trace and throws c10::OutOfMemoryError, as a device
  // out of memory would.
  Options& capacity(std::uint64_t bytes) {
    capacity_ = bytes;
    return *this;
  }
  std::uint64_t capacity() const noexcept { return capacity_; }

  // Samples device memory with NVML every interval (ms) when the driver is present; where it
  // is absent the report's driver_view says why (default: off).
  Options& driver_view(bool on, std::uint32_t interval_ms = 100) {
    driver_view_ = on;
    driver_view_interval_ms_ = interval_ms;
    return *this;
  }
  bool driver_view() const noexcept { return driver_view_; }
  std::uint32_t driver_view_interval_ms() const noexcept { return driver_view_interval_ms_; }

  // Keeps the trace bounded for long runs (docs/long-runs.md): a summary of every step, and the
  // events of the last `steps` steps, the highest-peak step and the steps around OOMs, marks and
  // warnings only. 0 (the default) keeps every step's events.
  Options& keep_steps(std::uint64_t steps) {
    keep_steps_ = steps;
    return *this;
  }
  std::uint64_t keep_steps() const noexcept { return keep_steps_; }
  // Itemises device memory allocated outside PyTorch (NCCL, cuBLAS, any library's cudaMalloc
  // or cuMem* calls) with CUPTI when CUDA is tracked (docs/gpu.md, "Memory outside PyTorch";
  // default: on). CUPTI takes one subscriber: turn it off to profile with Nsight or Kineto.
  Options& cupti(bool on) {
    cupti_ = on;
    return *this;
  }
  bool cupti() const noexcept { return cupti_; }

  // Reads the process's resident set when tracking starts and at every phase end, for the
  // report's host_memory layers (docs/forensics.md; default: on).
  Options& host_memory(bool on) {
    host_memory_ = on;
    return *this;
  }
  bool host_memory() const noexcept { return host_memory_; }

 private:
  std::string out_ = "ridgescope.rstrace";
  std::uint64_t capacity_ = 0;
  bool driver_view_ = false;
  std::uint32_t driver_view_interval_ms_ = 100;
  std::uint64_t keep_steps_ = 0;
  bool cupti_ = true;
  bool host_memory_ = true;
};

class Session {
 public:
  // Starts tracking: creates the trace and installs the CPU allocator source. Throws
  // std::runtime_error when another session runs or the path cannot be written.
  explicit Session(Options options = {});
  ~Session();  // stops, if still running
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Names the model's parameters and buffers, adopts their storages (and any existing
  // gradients and optimizer state) and describes the model and optimizer in the trace. Call it
  // once, before training. Throws std::logic_error when called twice and
  // std::invalid_argument for a module without parameters.
  void track(torch::nn::Module& model, torch::optim::Optimizer& optimizer);
  void track(torch::nn::Module& model);

  // Tags a tensor's block with a category and a label, e.g. the batch as Category::Input.
  void tag(const at::Tensor& tensor, Category category, const std::string& label);

  // Phase markers; prefer PhaseGuard. Phases nest; names of your own are welcome.
  void begin_phase(std::string_view name);
  void end_phase(std::string_view name);
  // Counts a training step (an OptimizerStep phase does this by itself).
  void mark_step();

  // Stops recording and closes the trace; safe to call twice.
  void stop();
  // Stops (if needed) and analyses the trace.
  Report report(const AnalysisOptions& options = {});

  const std::string& path() const noexcept;
  bool active() const noexcept;
  std::string error() const;  // why recording stopped early, "" when it did not

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  friend class PhaseGuard;
};

// Marks a phase for the guard's lifetime. A guard that outlives its Session ends nothing and
// says so once on stderr; creating one on a stopped Session throws std::logic_error.
class PhaseGuard {
 public:
  PhaseGuard(Session& session, Phase phase);
  PhaseGuard(Session& session, std::string name);
  ~PhaseGuard();
  PhaseGuard(const PhaseGuard&) = delete;
  PhaseGuard& operator=(const PhaseGuard&) = delete;

 private:
  std::shared_ptr<Session::Impl> impl_;
  std::string name_;
};

}  // namespace ridgescope
