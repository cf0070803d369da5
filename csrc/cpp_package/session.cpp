// session.cpp — the libtorch session API (include/ridgescope/session.h) over TrackingSession.
#include "ridgescope/session.h"

#include <cstdio>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include "json_writer.h"
#include "ridgescope/phase.h"
#include "tracking_session.h"

namespace ridgescope {

using detail::JsonWriter;
using sources::TrackingSession;

namespace {

PhaseKind phase_kind(Phase phase) noexcept {
  switch (phase) {
    case Phase::Forward: return PhaseKind::Forward;
    case Phase::Backward: return PhaseKind::Backward;
    case Phase::OptimizerStep: return PhaseKind::OptimizerStep;
    case Phase::ZeroGrad: return PhaseKind::ZeroGrad;
    case Phase::Checkpoint: return PhaseKind::Checkpoint;
    case Phase::Eval: return PhaseKind::Eval;
    case Phase::Data: return PhaseKind::Data;
  }
  return PhaseKind::Other;
}

}  // namespace

std::string_view phase_name(Phase phase) noexcept {
  const std::string_view name = builtin_phase_name(phase_kind(phase));
  return name.empty() ? std::string_view("unknown") : name;
}

namespace {

// One optimizer state tensor: its key ("exp_avg") and the tensor.
using StateTensors = std::vector<std::pair<const char*, at::Tensor>>;

// What an optimizer keeps per parameter, for the optimizers libtorch ships.
struct OptimizerKind {
  std::string type;
  int states_per_parameter = -1;  // -1: unknown
  std::vector<std::string> state_keys;
};

OptimizerKind describe(torch::optim::Optimizer& opt) {
  const auto& defaults = opt.defaults();
  auto adam = [](const char* type, bool amsgrad) {
    return amsgrad ? OptimizerKind{type, 3, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}}
                   : OptimizerKind{type, 2, {"exp_avg", "exp_avg_sq"}};
  };
  if (auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&defaults)) return adam("Adam", o->amsgrad());
  if (auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&defaults)) return adam("AdamW", o->amsgrad());
  if (auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&defaults)) {
    return o->momentum() != 0 ? OptimizerKind{"SGD", 1, {"momentum_buffer"}} : OptimizerKind{"SGD", 0, {}};
  }
  if (auto* o = dynamic_cast<const torch::optim::RMSpropOptions*>(&defaults)) {
    OptimizerKind k{"RMSprop", 1, {"square_avg"}};
    if (o->momentum() != 0) k.state_keys.push_back("momentum_buffer");
    if (o->centered()) k.state_keys.push_back("grad_avg");
    k.states_per_parameter = static_cast<int>(k.state_keys.size());
    return k;
  }
  if (dynamic_cast<const torch::optim::AdagradOptions*>(&defaults)) return {"Adagrad", 1, {"sum"}};
  return {"Optimizer", -1, {}};
}

StateTensors state_tensors(const torch::optim::OptimizerParamState& state) {
  StateTensors out;
  auto add = [&out](const char* key, const at::Tensor& t) {
    if (t.defined()) out.emplace_back(key, t);
  };
  auto add_moments = [&add](const auto& s) {  // Adam and AdamW keep the same three
    add("exp_avg", s.exp_avg());
    add("exp_avg_sq", s.exp_avg_sq());
    add("max_exp_avg_sq", s.max_exp_avg_sq());
  };
  if (auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    add_moments(*s);
  } else if (auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    add_moments(*s);
  } else if (auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    add("momentum_buffer", s->momentum_buffer());
  } else if (auto* s = dynamic_cast<const torch::optim::RMSpropParamState*>(&state)) {
    add("square_avg", s->square_avg());
    add("momentum_buffer", s->momentum_buffer());
    add("grad_avg", s->grad_avg());
  } else if (auto* s = dynamic_cast<const torch::optim::AdagradParamState*>(&state)) {
    add("sum", s->sum());
  }
  return out;
}

std::uint64_t tensor_bytes(const at::Tensor& t) {
  return static_cast<std::uint64_t>(t.numel()) * static_cast<std::uint64_t>(t.element_size());
}

}  // namespace

struct Session::Impl {
  std::unique_ptr<TrackingSession> native;
  torch::optim::Optimizer* optimizer = nullptr;
  bool tracked = false;
  std::uint64_t steps = 0;
  std::unordered_map<const void*, std::string> names;  // TensorImpl* -> parameter name
  std::map<std::pair<const void*, std::string>, const void*> tagged_state;  // -> block tagged
  bool warned_outlived = false;
  std::uint64_t capacity = 0;  // simulated device capacity, bytes (0: none)
  bool cupti = true;           // itemise memory outside PyTorch when CUDA is tracked

  bool active() const { return native && native->active(); }
  void track(torch::nn::Module& model, torch::optim::Optimizer* optimizer);

  std::string name_of(const at::Tensor& p) const {
    auto it = names.find(p.unsafeGetTensorImpl());
    return it == names.end() ? std::string("parameter") : it->second;
  }

  // Calls fn(param, key, tensor) for every state tensor of the optimizer.
  template <typename Fn>
  void for_each_state_tensor(Fn&& fn) const {
    if (optimizer == nullptr) return;
    const auto& state = optimizer->state();
    for (const auto& group : optimizer->param_groups()) {
      for (const auto& p : group.params()) {
        auto it = state.find(p.unsafeGetTensorImpl());
        if (it == state.end() || !it->second) continue;
        for (const auto& [key, t] : state_tensors(*it->second)) fn(p, key, t);
      }
    }
  }

  // Tags (adopt: registers) the optimizer's state tensors whose block changed since the last
  // scan.
  void tag_optimizer_state(bool adopt = false) {
    for_each_state_tensor([&](const at::Tensor& p, const char* key, const at::Tensor& t) {
      const void* block = t.has_storage() ? t.storage().data_ptr().get() : nullptr;
      auto& last = tagged_state[{p.unsafeGetTensorImpl(), key}];
      if (block == nullptr || block == last) return;
      last = block;
      const std::uint32_t label = native->intern(std::string(key) + " of " + name_of(p));
      if (adopt) native->register_tensor(t, Category::OptimizerState, label);
      else native->tag_tensor(t, Category::OptimizerState, label, false);
    });
  }

  void end(const std::string& name) {
    const PhaseKind kind = parse_phase_kind(name);
    if (kind == PhaseKind::Backward) native->tag_gradients();
    if (kind == PhaseKind::OptimizerStep) {
      native->tag_gradients();
      tag_optimizer_state();
    }
    native->phase_end(native->intern(name));
    native->sample_allocator();
    if (kind == PhaseKind::OptimizerStep) native->step(steps++);
  }
};

Session::Session(Options options) : impl_(std::make_shared<Impl>()) {
  FlightOptions flight;
  flight.keep_steps = options.keep_steps();
  impl_->native = std::make_unique<TrackingSession>(options.out(), options.capacity(), sources::StackMode::Site, flight,
                                                    options.host_memory());
  impl_->capacity = options.capacity();
  impl_->cupti = options.cupti();
  if (options.driver_view()) impl_->native->start_driver_view(options.driver_view_interval_ms());
}

Session::~Session() { stop(); }

void Session::track(torch::nn::Module& model) { impl_->track(model, nullptr); }

void Session::track(torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  impl_->track(model, &optimizer);
}

void Session::Impl::track(torch::nn::Module& model, torch::optim::Optimizer* optimizer) {
  Impl& s = *this;
  if (!s.active()) throw std::logic_error("ridgescope::Session::track: the session is stopped");
  if (s.tracked) {
    throw std::logic_error("ridgescope::Session::track: this session already tracks a model; "
                           "call track() once, with the model and its optimizer");
  }
  const auto params = model.named_parameters(/*recurse=*/true);
  if (params.size() == 0) {
    throw std::invalid_argument("ridgescope::Session::track: the module '" + model.name() +
                                "' has no parameters; track the model that owns them");
  }
  s.tracked = true;
  s.optimizer = optimizer;
  TrackingSession& n = *s.native;
  // A model on a GPU: track the CUDA caching allocator too (docs/gpu.md), before the
  // parameters are tagged, so that their blocks (adopted from the allocator) are live first.
  for (const auto& item : params) {
    if (item.value().is_cuda()) {
      n.start_cuda();  // "" or why not; the reason is in the trace's cuda_source metadata
      if (s.cupti) n.start_cupti();  // "" or why not; in the trace's cupti_source metadata
      break;
    }
  }

  // Describe the run (the analysis turns this into the report's model and optimizer header).
  std::uint64_t count = 0, trainable = 0, bytes = 0, trainable_bytes = 0, trainable_tensors = 0;
  std::map<std::string, std::uint64_t> dtypes;
  std::vector<at::Tensor> watched;
  std::vector<std::uint32_t> grad_labels;
  for (const auto& item : params) {
    const at::Tensor& p = item.value();
    s.names.emplace(p.unsafeGetTensorImpl(), item.key());
    count += static_cast<std::uint64_t>(p.numel());
    bytes += tensor_bytes(p);
    ++dtypes[std::string(c10::getDtypeNames(p.scalar_type()).first)];  // "float32", as Python
    if (p.requires_grad()) {
      trainable += static_cast<std::uint64_t>(p.numel());
      trainable_bytes += tensor_bytes(p);
      ++trainable_tensors;
      watched.push_back(p);
      grad_labels.push_back(n.intern("grad of " + item.key()));
    }
  }
  const auto buffers = model.named_buffers(/*recurse=*/true);
  std::uint64_t buffer_bytes = 0;
  for (const auto& b : buffers) buffer_bytes += tensor_bytes(b.value());

  JsonWriter w;
  w.begin_object();
  w.field("ridgescope_version", RIDGESCOPE_VERSION).field("torch_version", TORCH_VERSION);
  w.key("argv").begin_array().end_array();
  if (capacity != 0) w.field("device_capacity_bytes", capacity);
  w.key("model").begin_object();
  w.field("class", model.name()).field("parameters", count);
  w.field("parameter_tensors", static_cast<std::uint64_t>(params.size()));
  w.field("trainable_parameters", trainable).field("trainable_parameter_tensors", trainable_tensors);
  w.field("parameter_bytes", bytes).field("trainable_parameter_bytes", trainable_bytes);
  w.key("dtypes").begin_object();
  for (const auto& [k, v] : dtypes) w.field(k, v);
  w.end_object();
  w.field("buffers", static_cast<std::uint64_t>(buffers.size())).field("buffer_bytes", buffer_bytes);
  w.end_object();
  if (optimizer != nullptr) {
    const OptimizerKind kind = describe(*optimizer);
    w.key("optimizer").begin_object();
    w.field("type", kind.type);
    w.key("states_per_parameter");
    if (kind.states_per_parameter >= 0) w.value(kind.states_per_parameter); else w.null();
    w.key("state_keys").begin_array();
    for (const auto& k : kind.state_keys) w.value(k);
    w.end_array();
    w.key("hyperparameters").begin_object();
    if (!optimizer->param_groups().empty()) w.field("lr", optimizer->param_groups()[0].options().get_lr());
    w.end_object();
    w.field("param_groups", static_cast<std::uint64_t>(optimizer->param_groups().size()));
    w.end_object();
  }
  w.end_object();
  n.metadata("run", w.take());

  // Adopt what exists already, so the ledger starts right.
  for (const auto& item : params) {
    n.register_tensor(item.value(), Category::Parameter, n.intern(item.key()));
    const at::Tensor& g = item.value().grad();
    if (g.defined()) n.register_tensor(g, Category::Gradient, n.intern("grad of " + item.key()));
  }
  for (const auto& b : buffers) n.register_tensor(b.value(), Category::Buffer, n.intern(b.key()));
  s.tag_optimizer_state(/*adopt=*/true);
  n.watch_parameters(std::move(watched), std::move(grad_labels));
}

void Session::tag(const at::Tensor& tensor, Category category, const std::string& label) {
  if (!impl_->active()) return;
  impl_->native->tag_tensor(tensor, category, impl_->native->intern(label), false);
}

void Session::begin_phase(std::string_view name) {
  if (!impl_->active()) return;
  impl_->native->sample_allocator();
  impl_->native->phase_begin(impl_->native->intern(std::string(name)));
}

void Session::end_phase(std::string_view name) {
  if (!impl_->active()) return;
  impl_->end(std::string(name));
}

void Session::mark_step() {
  if (impl_->active()) impl_->native->step(impl_->steps++);
}

void Session::stop() {
  if (impl_ && impl_->native) {
    impl_->native->stop();
    impl_->optimizer = nullptr;
  }
}

Report Session::report(const AnalysisOptions& options) {
  stop();
  return analyze_trace(path(), options);
}

const std::string& Session::path() const noexcept { return impl_->native->path(); }
bool Session::active() const noexcept { return impl_->active(); }
std::string Session::error() const { return impl_->native->error(); }

PhaseGuard::PhaseGuard(Session& session, Phase phase) : PhaseGuard(session, std::string(phase_name(phase))) {}

PhaseGuard::PhaseGuard(Session& session, std::string name) : impl_(session.impl_), name_(std::move(name)) {
  if (!impl_->active()) {
    throw std::logic_error("ridgescope::PhaseGuard(" + name_ + "): the session is stopped");
  }
  impl_->native->sample_allocator();
  impl_->native->phase_begin(impl_->native->intern(name_));
}

PhaseGuard::~PhaseGuard() {
  try {
    if (impl_->active()) {
      impl_->end(name_);
    } else if (!impl_->warned_outlived) {
      impl_->warned_outlived = true;
      std::fprintf(stderr,
                   "ridgescope: PhaseGuard(%s) ended after its Session stopped; the phase end "
                   "was not recorded\n",
                   name_.c_str());
    }
  } catch (...) {
    // A destructor never throws into the training loop.
  }
}

}  // namespace ridgescope
