// site_capture.h — where an allocation is being made, read on the allocating thread inside the
// sources' hot path (docs/sites.md), as a trace stack (ridgescope/stack.h):
//
//   * the innermost frame of the user's Python code (skipping torch, ridgescope and the
//     standard library), read from the allocating thread's own frame chain by the Python
//     frame walker (csrc/torch_python/python_frames.cpp, installed by the Python module; a C++
//     trainer has none). It never takes the GIL: see python_frames.h for why reading the
//     thread's own frames is safe while it is inside a C call;
//   * during backward, where no Python code runs inside the autograd engine, the autograd node
//     being evaluated (torch::autograd::get_current_node) and the module whose forward created
//     it ("MmBackward0 of layers.3.mlp.fc1"), found from the node's sequence number and the
//     sequence numbers at each module call's start and end (ModuleRanges);
//   * with stacks="python" the whole Python stack, and with stacks="all" the native frames
//     too (torch::unwind::unwind, symbolised once per address with dladdr).
//
// Every stack and frame is interned in the session's Recorder (one record per distinct frame
// and stack) and cached per thread, so a site already seen costs a few hash lookups.
//
// Hot path: capture() takes no GIL, calls no Python function and no torch function besides
// reading autograd's thread-local current node and never throws. The sources call it under
// their own leaf mutex (which serialises it with session start and stop), before recording.
// Thread-safety: capture() from any thread; the module-range calls from the threads that run
// module hooks; construction, activation and destruction from the session's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "page_arena.h"
#include "ridgescope/recorder.h"

namespace ridgescope::sources {

// What an allocation's stack holds (rs.track(stacks=...)).
enum class StackMode : std::uint8_t {
  Off = 0,     // no site is recorded
  Site = 1,    // the default: one frame, the site
  Python = 2,  // the whole Python stack (and the autograd node in backward)
  All = 3,     // native frames too
};
// "none", "site", "python", "all" (false when the name is none of these).
bool parse_stack_mode(const std::string& name, StackMode* out) noexcept;
const char* stack_mode_name(StackMode mode) noexcept;

// What the Python frame walker found on the calling thread.
struct PythonWalk {
  std::uint32_t site = 0;       // frame id of the innermost user frame, 0 when none was met
  std::uint32_t innermost = 0;  // frame id of the innermost frame (library code), when no site
  bool reached_engine = false;  // the autograd engine's entry came before any user frame
  std::uint32_t site_index = 0;  // full walks: the site's position in `frames`
};

// Reads the calling thread's Python frames without the GIL (python_frames.cpp). Interface so
// that the C++ library, which has no Python, builds without it.
class PythonFrameWalker {
 public:
  virtual ~PythonFrameWalker() = default;
  // Walks innermost first. With `frames` null it stops at the first user frame (and, when
  // `stop_at_engine`, at the autograd engine's entry) and interns only that frame; otherwise it
  // appends every frame's id to *frames. `generation` identifies the session: ids cached for
  // another session are never reused. Returns false when this thread has no Python frames it
  // can read.
  virtual bool walk(Recorder& recorder, std::uint64_t generation, PythonWalk* out,
                    std::vector<std::uint32_t>* frames, bool stop_at_engine) noexcept = 0;
};
// Installs the walker the Python module provides (once, at import; never removed).
void set_python_frame_walker(PythonFrameWalker* walker) noexcept;
PythonFrameWalker* python_frame_walker() noexcept;

// Which module's forward created each autograd node: the sequence numbers autograd gives the
// nodes created on a thread (at::sequence_number) at the start and end of every module call on
// that thread. Bounded: at each training step the calls that began before the step before are
// forgotten (their graphs have run; a long run's memory stays flat), and past kMaxCalls per
// thread the oldest are (their nodes then have no module). A thread's calls are kept in a ring
// that only grows (doubling) until it holds two steps' calls, in a PageArena: nothing here is in
// the C heap, and a steady run allocates nothing after its first steps.
class ModuleRanges {
 public:
  static constexpr std::size_t kMaxCalls = 1u << 17;  // a power of two (the ring's largest size)
  void enter(std::uint32_t module_id) noexcept;  // the module's name (trace string id)
  void exit() noexcept;
  // A training step ended: forgets the calls that began before the previous step ended, and
  // that have ended.
  void on_step() noexcept;
  // The innermost module whose call on forward thread `thread_id` spanned sequence number
  // `seq`; 0 when none is known.
  std::uint32_t module_of(std::uint64_t thread_id, std::uint64_t seq) const noexcept;
  // The calls the ring of forward thread `thread_id` has room for (0: none seen); it changes
  // only when the ring grows.
  std::size_t capacity(std::uint64_t thread_id) const noexcept;

 private:
  struct Call {
    std::uint64_t begin = 0, end = UINT64_MAX;  // sequence numbers [begin, end); end open
    std::uint64_t parent = UINT64_MAX;          // absolute index of the enclosing call
    std::uint32_t module_id = 0;
  };
  // The calls of one thread in order of start (and so of begin), oldest first: a ring whose
  // size is a power of two, its slots in the ModuleRanges' arena.
  class CallRing {
   public:
    explicit CallRing(detail::PageArena* arena) noexcept : arena_(arena) {}
    std::size_t size() const noexcept { return count_; }
    bool empty() const noexcept { return count_ == 0; }
    std::size_t capacity() const noexcept { return capacity_; }
    Call& operator[](std::size_t i) noexcept { return slots_[(head_ + i) & (capacity_ - 1)]; }
    const Call& operator[](std::size_t i) const noexcept { return slots_[(head_ + i) & (capacity_ - 1)]; }
    Call& front() noexcept { return (*this)[0]; }
    void push_back(const Call& c);  // grows (doubling, up to kMaxCalls) when full; may throw
    void pop_front() noexcept {
      head_ = (head_ + 1) & (capacity_ - 1);
      --count_;
    }

   private:
    detail::PageArena* arena_;
    Call* slots_ = nullptr;
    std::size_t capacity_ = 0, head_ = 0, count_ = 0;
  };
  struct Thread {
    std::uint64_t base = 0;  // absolute index of calls.front()
    CallRing calls;
    std::uint64_t step_mark = 0;  // absolute index of the first call after the last step end
  };
  static_assert((kMaxCalls & (kMaxCalls - 1)) == 0 && kMaxCalls >= 64, "the ring's sizes are powers of two");
  mutable std::mutex mutex_;  // leaf lock
  // Where the rings and the map live: memory of their own, not the C heap (page_arena.h).
  detail::PageArena arena_;  // declared before the map: outlives it
  detail::ArenaHashMap<std::uint64_t, Thread> threads_{&arena_};
};

class SiteCapture {
 public:
  SiteCapture(Recorder* recorder, StackMode mode);
  ~SiteCapture();
  SiteCapture(const SiteCapture&) = delete;
  SiteCapture& operator=(const SiteCapture&) = delete;

  StackMode mode() const noexcept { return mode_; }
  // The stack of an allocation being made now on this thread; 0 when the mode is Off.
  std::uint32_t capture() noexcept;
  // The stack of a block that existed before tracking began (adopted storages, the CUDA
  // allocator's blocks at start); 0 when the mode is Off.
  std::uint32_t pre_existing() const noexcept { return pre_existing_; }
  ModuleRanges& modules() noexcept { return modules_; }
  // What the capture could use, as JSON (written as `sites` metadata at start).
  std::string describe() const;

  struct ThreadCache;  // what a thread already interned in this session (site_capture.cpp)

 private:
  ThreadCache& cache() noexcept;  // this thread's, reset for a new session: one TLS access
  std::uint32_t site_stack(ThreadCache& c, std::uint32_t frame) noexcept;
  std::uint32_t current_node_frame(ThreadCache& c) noexcept;
  // capture() in the modes that list every frame (Python, All): out of line, so that the site
  // mode's path (the default, one per allocation) stays a few instruction lines.
  std::uint32_t capture_frames(PythonFrameWalker* walker, ThreadCache& c);
  void native_frames(ThreadCache& c, std::vector<std::uint32_t>* out) noexcept;

  Recorder* recorder_;
  const StackMode mode_;
  const std::uint64_t generation_;
  std::uint32_t pre_existing_ = 0;
  std::uint32_t no_python_ = 0;  // the marker frame's one-frame stack
  std::uint32_t no_python_frame_ = 0;
  ModuleRanges modules_;
};

}  // namespace ridgescope::sources
