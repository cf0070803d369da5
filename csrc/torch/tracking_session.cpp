#include "tracking_session.h"

#include <stdexcept>
#include <vector>

#include "cpu_allocator_source.h"
#include "cuda_allocator_source.h"
#include "cupti_source.h"
#include "host_memory_source.h"
#include "module_context.h"
#include "nvml_source.h"
#include "json_writer.h"

namespace ridgescope::sources {
namespace {

bool storage_block(const at::Tensor& tensor, Device* device, std::uint64_t* addr) {
  if (!tensor.defined() || !tensor.has_storage()) return false;
  const c10::Device d = tensor.device();
  if (d.is_cpu()) {
    *device = Device{DeviceType::CPU, -1};
  } else if (d.is_cuda()) {
    *device = Device{DeviceType::CUDA, static_cast<std::int16_t>(d.index())};
  } else {
    return false;  // meta, fake and other devices have no allocator block we observe
  }
  const void* base = tensor.storage().data_ptr().get();
  if (base == nullptr) return false;
  *addr = reinterpret_cast<std::uint64_t>(base);
  return true;
}

// The allocator source's serial for the block at `addr` (0: no source numbers it).
std::uint64_t block_serial(const Device& device, std::uint64_t addr) noexcept {
  try {
    if (device.type == DeviceType::CPU) return cpu_block_serial(addr);
    if (device.type == DeviceType::CUDA) return cuda_block_serial(device.index, addr);
  } catch (...) {
  }
  return 0;
}

// With idle_writer, a session's writer takes only CPU time the training threads leave
// (recorder.h): on a machine whose cores torch's threads fill, a writer at the normal class can
// preempt one of them mid-op. Not the default: docs/performance.md measured no change in the
// median step ("The writer at the idle class, again").
RecorderOptions session_recorder_options(bool idle_writer) {
  RecorderOptions options;
  options.idle_writer = idle_writer;
  return options;
}

}  // namespace

TrackingSession::TrackingSession(const std::string& path, std::uint64_t capacity_bytes, StackMode stacks,
                                 FlightOptions flight, bool host_memory, bool idle_writer)
    : keep_steps_(flight.keep_steps), recorder_(make_flight_sink(path, flight), session_recorder_options(idle_writer)),
      sites_(std::make_unique<SiteCapture>(&recorder_, stacks)) {
  recorder_.metadata("flight", flight_metadata(flight));
  recorder_.metadata("sites", sites_->describe());
  sample_name_id_ = recorder_.intern("allocator_live_bytes");
  reserved_sample_id_ = recorder_.intern("allocator_reserved_bytes");
  outside_label_id_ = recorder_.intern("activation saved outside the model (loss or functional code)");
  if (host_memory) host_ = std::make_unique<HostMemorySampler>(&recorder_);
  new_module_contexts();  // no thread is inside a module of this session yet
  if (!install_cpu_allocator_source(&recorder_, capacity_bytes, sites_.get())) {
    recorder_.close();
    throw std::runtime_error(
        "ridgescope: a tracking session is already running in this process; sessions do not "
        "nest. Stop the running one (leave its `with rs.track(...)` block) first.");
  }
  active_ = true;
  if (host_) host_->record_now(true);  // the resident set when tracking starts
}

TrackingSession::~TrackingSession() { stop(); }

std::string TrackingSession::start_driver_view(std::uint32_t interval_ms) noexcept {
  if (!active_ || nvml_) return nvml_ ? "" : "the session is stopped";
  std::string why_not;
  try {
    nvml_ = NvmlSampler::start(&recorder_, interval_ms, &why_not);
  } catch (const std::exception& ex) {
    why_not = std::string("NVML sampler failed to start: ") + ex.what();
  }
  try {
    detail::JsonWriter w;
    w.begin_object().field("available", nvml_ != nullptr);
    if (nvml_) w.field("interval_ms", interval_ms); else w.field("reason", why_not);
    w.end_object();
    recorder_.metadata("driver_view", w.take());
  } catch (...) {
  }
  return why_not;
}

void TrackingSession::stop() noexcept {
  if (active_ && !degraded_) {  // the session's end; NVML read here, since its sampler stops
    if (host_) host_->record_now(true);
    if (cupti_started_) record_cupti_samples();
    if (nvml_) nvml_->read_now(NvmlSampler::Reason::Boundary);
  }
  nvml_.reset();  // joins the sampler thread before the recorder closes
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    watched_.clear();  // the session holds no tensor after it stops
  }
  if (!active_.exchange(false)) return;
  if (!degraded_) sample_allocator_unchecked();
  if (cupti_started_.exchange(false)) stop_cupti_source();
  if (cuda_started_.exchange(false)) stop_cuda_allocator_source();
  uninstall_cpu_allocator_source();
  recorder_.close();
  check_recorder();
}

void TrackingSession::check_recorder() noexcept {
  if (recorder_.failed()) degrade(recorder_.error());
}

std::uint32_t TrackingSession::intern(const std::string& text) noexcept {
  return recorder_.intern(text);
}

void TrackingSession::metadata(const std::string& key, const std::string& json) noexcept {
  recorder_.metadata(key, json);
}

void TrackingSession::marker(EventKind kind, std::uint32_t name_id, std::uint64_t value) noexcept {
  Event e;
  e.kind = kind;
  e.string_id = name_id;
  e.value = value;
  recorder_.record(e);
  check_recorder();
}

// The ledgers' readings belong to the phase they stand for: the driver's is asked for at both
// boundaries (after the begin marker, before the end marker: the sampler's thread takes it),
// the host's, which the training thread takes itself, at the end only (before the marker).
void TrackingSession::phase_begin(std::uint32_t name_id) noexcept {
  marker(EventKind::PhaseBegin, name_id, 0);
  if (active_ && nvml_) nvml_->request_boundary();
}

void TrackingSession::phase_end(std::uint32_t name_id) noexcept {
  if (active_) record_ledger_readings();
  marker(EventKind::PhaseEnd, name_id, 0);
}

void TrackingSession::step(std::uint64_t step) noexcept {
  marker(EventKind::Step, 0, step);
  if (sites_->mode() != StackMode::Off) sites_->modules().on_step();  // bounded over a long run
}

void TrackingSession::mark(std::uint32_t name_id) noexcept { marker(EventKind::Mark, name_id, 0); }

void TrackingSession::sample_allocator() noexcept {
  if (active_) sample_allocator_unchecked();
}

void TrackingSession::sample_allocator_unchecked() noexcept {
  record_cpu_live_sample(sample_name_id_);
  if (cuda_started_) record_cuda_samples(sample_name_id_, reserved_sample_id_);
}

void TrackingSession::record_ledger_readings() noexcept {
  if (host_) host_->record_now();
  if (cupti_started_) record_cupti_samples();
  if (nvml_) nvml_->request_boundary();  // taken at once by the sampler's thread
}

void TrackingSession::set_host_memory(bool on) noexcept {
  try {
    if (!on) {
      host_.reset();
    } else if (!host_) {
      host_ = std::make_unique<HostMemorySampler>(&recorder_);
    }
  } catch (...) {
  }
}

std::string TrackingSession::start_cupti() noexcept {
  if (!active_) return "the session is stopped";
  if (cupti_started_) return "";
  const std::string why_not = start_cupti_source(&recorder_, sites_.get());
  if (why_not.empty()) cupti_started_ = true;
  check_recorder();
  return why_not;
}

std::string TrackingSession::start_cuda() noexcept {
  if (!active_) return "the session is stopped";
  if (cuda_started_) return "";
  std::string why_not = start_cuda_allocator_source(&recorder_, sites_.get());
  // Started also when only polling (an unsupported backend): stop() must switch it off.
  cuda_started_ = true;
  check_recorder();
  return why_not;
}

void TrackingSession::tag_tensor(const at::Tensor& tensor, Category category,
                                 std::uint32_t label_id, bool weak) noexcept {
  if (!active_) return;
  try {
    if (fault_tag_.exchange(false)) throw std::runtime_error("injected fault in tag_tensor");
    Event e;
    if (!storage_block(tensor, &e.device, &e.addr)) return;
    e.kind = EventKind::Tag;
    e.category = category;
    e.flags = weak ? kTagWeak : 0;
    e.string_id = label_id;
    recorder_.record(e);
  } catch (const std::exception& ex) {
    degrade(std::string("internal error while tagging a tensor: ") + ex.what());
  } catch (...) {
    degrade("internal error while tagging a tensor");
  }
}

std::uint64_t TrackingSession::register_tensor(const at::Tensor& tensor, Category category,
                                               std::uint32_t label_id, bool weak) noexcept {
  if (!active_) return 0;
  try {
    if (!tensor.defined() || !tensor.has_storage()) return 0;
    std::uint64_t bytes = 0;
    if (tensor.device().is_cpu()) {
      bytes = register_cpu_storage(tensor.storage().unsafeGetStorageImpl());
    }
    tag_tensor(tensor, category, label_id, weak);
    return bytes;
  } catch (const std::exception& ex) {
    degrade(std::string("internal error while registering a tensor: ") + ex.what());
  } catch (...) {
    degrade("internal error while registering a tensor");
  }
  return 0;
}

void TrackingSession::watch_parameters(std::vector<at::Tensor> parameters,
                                       std::vector<std::uint32_t> gradient_label_ids) noexcept {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  try {
    gradient_label_ids.resize(parameters.size(), 0);
    watched_ = std::move(parameters);
    watched_labels_ = std::move(gradient_label_ids);
    watched_grads_.assign(watched_.size(), TaggedGradient{});
  } catch (...) {
    degrade("out of memory while watching parameters");
  }
}

std::size_t TrackingSession::tag_gradients() noexcept {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  std::size_t tagged = 0;
  if (!active_) return 0;
  for (std::size_t i = 0; i < watched_.size(); ++i) {
    const at::Tensor& grad = watched_[i].grad();
    if (!grad.defined() || !grad.has_storage()) continue;
    Device device;
    std::uint64_t addr = 0;
    if (!storage_block(grad, &device, &addr)) continue;
    TaggedGradient& last = watched_grads_[i];
    const std::uint64_t serial = block_serial(device, addr);
    if (serial != 0) {
      if (last.serial == serial && last.addr == addr && last.device == device) continue;  // tagged, still alive
      last = TaggedGradient{device, addr, serial};
    } else {
      c10::StorageImpl* storage = grad.storage().unsafeGetStorageImpl();
      if (last.serial == 0 && last.storage.lock().get() == storage) continue;
      last = TaggedGradient{device, addr, 0, grad.storage().getWeakStorageImpl()};
    }
    tag_tensor(grad, Category::Gradient, watched_labels_[i], /*weak=*/false);
    ++tagged;
  }
  return tagged;
}

const at::Tensor& TrackingSession::on_saved_tensor(const at::Tensor& tensor) noexcept {
  const ModuleFrame* frame = current_module();
  const std::uint32_t label = frame == nullptr ? outside_label_id_ : frame->activation_label_id;
  tag_tensor(tensor, Category::Activation, label, /*weak=*/true);
  return tensor;
}

void TrackingSession::enter_module(std::uint32_t activation_label_id,
                                   std::uint32_t context_id) noexcept {
  push_module(ModuleFrame{activation_label_id, context_id});
  // The autograd nodes this call creates belong to this module (their backward sites).
  if (sites_->mode() != StackMode::Off) sites_->modules().enter(context_id);
}

void TrackingSession::exit_module() noexcept {
  pop_module();
  if (sites_->mode() != StackMode::Off) sites_->modules().exit();
}

void TrackingSession::degrade(const std::string& reason) noexcept {
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (degraded_.exchange(true)) return;
    try {
      error_ = reason;
    } catch (...) {
    }
  }
  // Stop recording: the trace stays readable up to here.
  if (active_.exchange(false)) {
    if (cupti_started_.exchange(false)) stop_cupti_source();
    if (cuda_started_.exchange(false)) stop_cuda_allocator_source();
    uninstall_cpu_allocator_source();
    recorder_.close();
  }
}

std::string TrackingSession::error() const {
  std::lock_guard<std::mutex> lock(error_mutex_);
  return error_;
}

void TrackingSession::inject_fault(const std::string& kind) {
  if (kind == "tag") {
    fault_tag_ = true;
  } else if (kind == "write") {
    recorder_.inject_write_failure();
  } else {
    throw std::invalid_argument("unknown fault kind '" + kind + "' (expected 'tag' or 'write')");
  }
}

}  // namespace ridgescope::sources
