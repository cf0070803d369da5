// site_capture.cpp — where an allocation is being made (site_capture.h, docs/sites.md).
#include "site_capture.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <typeinfo>

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/profiler/unwind/unwind.h>

#include "byte_codec.h"
#include "page_arena.h"
#include "json_writer.h"
#include "module_context.h"

namespace ridgescope::sources {
namespace {

std::atomic<PythonFrameWalker*> g_walker{nullptr};
std::atomic<std::uint64_t> g_next_generation{1};

}  // namespace

// Per-thread caches of what this thread already interned in the current session (ids are
// per trace: a cache filled for another session is dropped).
struct SiteCapture::ThreadCache {
  std::uint64_t generation = 0;
  // One-entry caches in front of the maps: consecutive allocations usually share them (several
  // blocks in one op, one backward node's outputs).
  std::uint32_t last_site_frame = 0, last_site_stack = 0;
  const void* last_node = nullptr;
  std::uint64_t last_node_seq = 0;
  std::uint32_t last_node_frame = 0;
  std::vector<std::uint32_t> last_frames;
  std::uint32_t last_frames_site = 0, last_frames_stack = 0;
  // The session's maps, in memory of their own (page_arena.h): they fill during the first steps
  // and would otherwise sit between the user's tensors in the C heap for the whole session.
  detail::PageArena arena;  // declared before the maps: outlives them
  detail::ArenaHashMap<std::uint32_t, std::uint32_t> site_stacks{&arena};  // frame id -> one-frame stack
  detail::ArenaHashMap<std::pair<const std::type_info*, std::uint32_t>, std::uint32_t> node_frames{&arena};
  detail::ArenaHashMap<const std::type_info*, std::uint32_t> node_names{&arena};  // -> string id
  detail::ArenaHashMap<std::string_view, std::uint32_t> stacks{&arena};  // encoded site and frames -> stack id
  detail::ArenaHashMap<void*, std::uint32_t> native{&arena};  // instruction pointer -> frame id (0: skip)
  std::vector<std::uint32_t> frames, python;
  std::string key;

  // A new session: every map empty, their memory given back.
  void reset() { detail::empty_and_release(arena, site_stacks, node_frames, node_names, stacks, native); }
};

namespace {
thread_local SiteCapture::ThreadCache t_cache;
}  // namespace

SiteCapture::ThreadCache& SiteCapture::cache() noexcept {
  ThreadCache& c = t_cache;
  if (c.generation != generation_) {
    c.reset();
    c.last_site_frame = c.last_site_stack = 0;
    c.last_node = nullptr;
    c.last_frames.clear();
    c.last_frames_stack = 0;
    c.generation = generation_;
  }
  return c;
}

namespace {

std::string demangle(const char* name) {
  if (name == nullptr) return {};
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && out != nullptr ? std::string(out) : std::string(name);
  std::free(out);
  return s;
}

// "torch::autograd::generated::MmBackward0" -> "MmBackward0".
std::string node_type_name(const std::type_info& type) {
  std::string s = demangle(type.name());
  for (const char* prefix : {"torch::autograd::generated::", "torch::autograd::"}) {
    const std::string p(prefix);
    if (s.compare(0, p.size(), p) == 0) {
      s.erase(0, p.size());
      break;
    }
  }
  return s;
}

// The module of this library (its own frames are left out of native stacks).
const void* own_library_base() {
  static const void* base = [] {
    Dl_info info{};
    return dladdr(reinterpret_cast<const void*>(&own_library_base), &info) != 0 ? info.dli_fbase : nullptr;
  }();
  return base;
}

thread_local std::vector<std::uint64_t> t_open_calls;  // ModuleRanges: this thread's open calls
thread_local std::uint64_t t_open_calls_of = 0;         // the session generation they belong to

// This thread's open calls in this session (module_context.h's generation): a session that
// stopped inside a module call leaves open calls the next one must not nest in.
std::vector<std::uint64_t>& open_calls() noexcept {
  const std::uint64_t generation = module_context_generation();
  if (t_open_calls_of != generation) {
    t_open_calls.clear();
    t_open_calls_of = generation;
  }
  return t_open_calls;
}

}  // namespace

bool parse_stack_mode(const std::string& name, StackMode* out) noexcept {
  if (name == "none") *out = StackMode::Off;
  else if (name == "site") *out = StackMode::Site;
  else if (name == "python") *out = StackMode::Python;
  else if (name == "all") *out = StackMode::All;
  else return false;
  return true;
}

const char* stack_mode_name(StackMode mode) noexcept {
  switch (mode) {
    case StackMode::Off: return "none";
    case StackMode::Site: return "site";
    case StackMode::Python: return "python";
    case StackMode::All: return "all";
  }
  return "none";
}

void set_python_frame_walker(PythonFrameWalker* walker) noexcept { g_walker.store(walker); }
PythonFrameWalker* python_frame_walker() noexcept { return g_walker.load(std::memory_order_acquire); }

// ------------------------------------------------------------------------------ ModuleRanges
void ModuleRanges::CallRing::push_back(const Call& c) {
  if (count_ == capacity_) {
    const std::size_t grown = capacity_ == 0 ? 64 : capacity_ * 2;  // a power of two
    auto* slots = static_cast<Call*>(arena_->allocate(grown * sizeof(Call), alignof(Call)));
    for (std::size_t i = 0; i < count_; ++i) slots[i] = (*this)[i];  // the old slots stay in the arena
    slots_ = slots;
    capacity_ = grown;
    head_ = 0;
  }
  slots_[(head_ + count_) & (capacity_ - 1)] = c;
  ++count_;
}

void ModuleRanges::enter(std::uint32_t module_id) noexcept {
  try {
    const std::uint64_t thread = at::RecordFunction::currentThreadId();
    const std::uint64_t seq = at::sequence_number::peek();
    std::uint64_t index = 0;
    std::vector<std::uint64_t>& open = open_calls();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Thread& t = threads_.try_emplace(thread, Thread{0, CallRing(&arena_), 0}).first->second;
      Call c;
      c.begin = seq;
      c.module_id = module_id;
      c.parent = open.empty() ? UINT64_MAX : open.back();
      if (t.calls.size() == kMaxCalls) {  // the bound: the oldest call is forgotten
        t.calls.pop_front();
        ++t.base;
      }
      t.calls.push_back(c);
      index = t.base + t.calls.size() - 1;
    }
    open.push_back(index);
  } catch (...) {
    // Out of memory: this call's nodes get no module.
  }
}

void ModuleRanges::exit() noexcept {
  std::vector<std::uint64_t>& open = open_calls();
  if (open.empty()) return;
  const std::uint64_t index = open.back();
  open.pop_back();
  const std::uint64_t thread = at::RecordFunction::currentThreadId();
  const std::uint64_t seq = at::sequence_number::peek();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = threads_.find(thread);
  if (it == threads_.end() || index < it->second.base) return;
  const std::uint64_t i = index - it->second.base;
  if (i < it->second.calls.size()) it->second.calls[i].end = seq;
}

void ModuleRanges::on_step() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, t] : threads_) {
    // Calls that began before the previous step ended: the step between ran their backward.
    while (!t.calls.empty() && t.base < t.step_mark && t.calls.front().end != UINT64_MAX) {
      t.calls.pop_front();
      ++t.base;
    }
    t.step_mark = t.base + t.calls.size();
  }
}

std::uint32_t ModuleRanges::module_of(std::uint64_t thread_id, std::uint64_t seq) const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = threads_.find(thread_id);
  if (it == threads_.end() || it->second.calls.empty()) return 0;
  const Thread& t = it->second;
  // The last call that began at or before seq (binary search over the ring, in order of begin);
  // if it ended before seq, one of its enclosing calls is the innermost that spans it (calls on
  // one thread nest).
  std::size_t lo = 0, hi = t.calls.size();  // the first call with begin > seq is in [lo, hi]
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (seq < t.calls[mid].begin) hi = mid;
    else lo = mid + 1;
  }
  if (lo == 0) return 0;
  std::uint64_t index = t.base + (lo - 1);
  while (index != UINT64_MAX && index >= t.base) {
    const Call& c = t.calls[index - t.base];
    if (seq < c.end) return c.module_id;
    if (c.parent != UINT64_MAX && c.parent >= index) return 0;  // calls nest: never reached
    index = c.parent;
  }
  return 0;
}

std::size_t ModuleRanges::capacity(std::uint64_t thread_id) const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = threads_.find(thread_id);
  return it == threads_.end() ? 0 : it->second.calls.capacity();
}

// ------------------------------------------------------------------------------ SiteCapture
SiteCapture::SiteCapture(Recorder* recorder, StackMode mode)
    : recorder_(recorder), mode_(mode), generation_(g_next_generation.fetch_add(1)) {
  if (mode_ == StackMode::Off) return;
  const std::uint32_t before = recorder_->intern_frame(
      FrameText{FrameKind::Untracked, {}, 0, "allocated before tracking started", {}});
  pre_existing_ = recorder_->intern_stack(&before, 1, 0);
  no_python_frame_ = recorder_->intern_frame(
      FrameText{FrameKind::Untracked, {}, 0, "no Python frame and no autograd node on this thread", {}});
  no_python_ = recorder_->intern_stack(&no_python_frame_, 1, 0);
}

SiteCapture::~SiteCapture() = default;

std::string SiteCapture::describe() const {
  try {
    detail::JsonWriter w;
    w.begin_object().field("mode", stack_mode_name(mode_));
    w.field("python_frames", python_frame_walker() != nullptr);
    w.end_object();
    return w.take();
  } catch (...) {
    return "{}";
  }
}

std::uint32_t SiteCapture::site_stack(ThreadCache& c, std::uint32_t frame) noexcept {
  if (frame == c.last_site_frame && c.last_site_stack != 0) return c.last_site_stack;
  auto it = c.site_stacks.find(frame);
  std::uint32_t stack = 0;
  if (it != c.site_stacks.end()) {
    stack = it->second;
  } else {
    stack = recorder_->intern_stack(&frame, 1, 0);
    c.site_stacks.emplace(frame, stack);
  }
  c.last_site_frame = frame;
  c.last_site_stack = stack;
  return stack;
}

std::uint32_t SiteCapture::current_node_frame(ThreadCache& c) noexcept {
  // The node autograd is evaluating on this thread (a thread-local of the engine).
  const auto node = torch::autograd::get_current_node();
  if (!node) return 0;
  const torch::autograd::Node* n = node.get();
  if (n == c.last_node && n->sequence_nr() == c.last_node_seq) return c.last_node_frame;
  const std::uint32_t module = modules_.module_of(n->thread_id(), n->sequence_nr());
  // The node's type names it (its name() is not called: a Python node's needs the GIL).
  const std::type_info& type = typeid(*n);
  c.last_node = n;
  c.last_node_seq = n->sequence_nr();
  auto it = c.node_frames.find(std::make_pair(&type, module));
  if (it != c.node_frames.end()) return c.last_node_frame = it->second;
  auto name = c.node_names.find(&type);
  if (name == c.node_names.end()) {
    name = c.node_names.emplace(&type, recorder_->intern(node_type_name(type))).first;
  }
  FrameRecord f;
  f.kind = FrameKind::Autograd;
  f.function_id = name->second;
  f.module_id = module;
  const std::uint32_t id = recorder_->intern_frame(f);
  c.node_frames.emplace(std::make_pair(&type, module), id);
  return c.last_node_frame = id;
}

void SiteCapture::native_frames(ThreadCache& c, std::vector<std::uint32_t>* out) noexcept {
  std::vector<void*> ips;
  try {
    ips = torch::unwind::unwind();
  } catch (...) {
    return;  // no unwinder on this platform: no native frames
  }
  for (void* ip : ips) {
    auto it = c.native.find(ip);
    if (it == c.native.end()) {
      std::uint32_t id = 0;
      Dl_info info{};
      std::string symbol;
      std::string file;
      if (dladdr(ip, &info) != 0) {
        if (info.dli_fbase != own_library_base()) {  // ridgescope's own frames are left out
          file = info.dli_fname != nullptr ? info.dli_fname : "";
          symbol = demangle(info.dli_sname);
          if (symbol.empty()) {
            char buf[48];
            std::snprintf(buf, sizeof buf, "+0x%zx", static_cast<std::size_t>(
                static_cast<const char*>(ip) - static_cast<const char*>(info.dli_fbase)));
            symbol = buf;
          }
        }
      } else {
        char buf[48];
        std::snprintf(buf, sizeof buf, "%p", ip);
        symbol = buf;
      }
      const bool unwinder = symbol.find("torch::unwind::") != std::string::npos;
      // The Python interpreter's frames stand for the Python frames that follow.
      const bool interpreter = symbol.find("_PyEval_EvalFrame") != std::string::npos;
      if (!symbol.empty() && !unwinder) {
        id = interpreter ? UINT32_MAX
                         : recorder_->intern_frame(FrameText{FrameKind::Native, file, 0, symbol, {}});
      }
      it = c.native.emplace(ip, id).first;
    }
    if (it->second == UINT32_MAX) return;  // the interpreter: Python frames from here on
    if (it->second != 0) out->push_back(it->second);
  }
}

std::uint32_t SiteCapture::capture() noexcept {
  if (mode_ == StackMode::Off) return 0;
  try {
    PythonFrameWalker* walker = python_frame_walker();
    ThreadCache& c = cache();
    if (mode_ == StackMode::Site) {
      PythonWalk w;
      bool python = walker != nullptr && walker->walk(*recorder_, generation_, &w, nullptr, /*stop_at_engine=*/true);
      // Inside the autograd engine with no Python code running in it: the node that is running.
      if (!python || w.site == 0 || w.reached_engine) {
        if (const std::uint32_t node = current_node_frame(c)) return site_stack(c, node);
        if (python && w.reached_engine) {  // the engine, outside any node: the caller's line
          w = PythonWalk{};
          python = walker->walk(*recorder_, generation_, &w, nullptr, /*stop_at_engine=*/false);
        }
      }
      if (python && w.site != 0) return site_stack(c, w.site);
      if (python && w.innermost != 0) return site_stack(c, w.innermost);
      return no_python_;
    }
    return capture_frames(walker, c);
  } catch (...) {
    return 0;  // out of memory in a cache: this allocation has no site
  }
}

[[gnu::noinline]] std::uint32_t SiteCapture::capture_frames(PythonFrameWalker* walker, ThreadCache& c) {
  std::vector<std::uint32_t>& frames = c.frames;
  std::vector<std::uint32_t>& python_frames = c.python;
  frames.clear();
  python_frames.clear();
  if (mode_ == StackMode::All) native_frames(c, &frames);
  const std::uint32_t native = static_cast<std::uint32_t>(frames.size());
  PythonWalk w;
  const bool python = walker != nullptr && walker->walk(*recorder_, generation_, &w, &python_frames, false);
  std::uint32_t site = native;  // the innermost non-native frame, unless a better one is known
  const std::uint32_t node = (!python || w.site == 0 || w.reached_engine) ? current_node_frame(c) : 0;
  if (node != 0) {
    frames.push_back(node);
  } else if (python && w.site != 0) {
    site = native + w.site_index;
  }
  frames.insert(frames.end(), python_frames.begin(), python_frames.end());
  if (frames.empty()) return no_python_;
  if (site >= frames.size()) site = 0;
  if (c.last_frames_stack != 0 && site == c.last_frames_site && frames == c.last_frames) return c.last_frames_stack;
  std::string& key = c.key;
  key.clear();
  detail::put_varint(key, site);
  for (std::uint32_t f : frames) detail::put_varint(key, f);
  auto it = c.stacks.find(key);
  std::uint32_t stack = 0;
  if (it != c.stacks.end()) {
    stack = it->second;
  } else {
    stack = recorder_->intern_stack(frames.data(), frames.size(), site);
    c.stacks.emplace(c.arena.copy(key), stack);
  }
  c.last_frames = frames;
  c.last_frames_site = site;
  c.last_frames_stack = stack;
  return stack;
}

}  // namespace ridgescope::sources
