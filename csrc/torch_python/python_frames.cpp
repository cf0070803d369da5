// python_frames.cpp — the allocating thread's Python frames without the GIL (python_frames.h).
#include <Python.h>
#include <frameobject.h>

#include "python_frames.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "library_files.h"
#include "site_capture.h"

#include "python_frame_layout.h"

namespace ridgescope::sources {
namespace {

using namespace pyframe;  // NOLINT: the mirrored layout (python_frame_layout.h)

// One frame of the walk: the frame itself, its code object and the index of its current
// instruction. (frame, code, lasti) identify a frame's position for the path cache.
struct RawFrame {
  const void* frame = nullptr;
  PyCodeObject* code = nullptr;
  int lasti = 0;  // in code units; -1 before the first instruction
  bool operator==(const RawFrame& o) const { return frame == o.frame && code == o.code && lasti == o.lasti; }
};

// Calls fn(RawFrame) innermost first until it returns false.
template <class Fn>
bool walk_raw(PyThreadState* ts, Fn&& fn) {
#if RS_PYFRAMES == 0
  (void)ts;
  (void)fn;
  return false;
#elif RS_PYFRAMES == 310
  for (PyFrameObject* f = ts->frame; f != nullptr; f = f->f_back) {
    if (f->f_code == nullptr) continue;
    if (!fn(RawFrame{f, f->f_code, f->f_lasti})) break;
  }
  return true;
#else
  for (const InterpreterFrame* f = top_frame(ts); f != nullptr; f = f->previous) {
    if (incomplete(f)) continue;
    PyCodeObject* code = code_of(f);
    if (!fn(RawFrame{f, code, static_cast<int>(instruction_of(f) - code_start(code))})) break;
  }
  return true;
#endif
}

// The line of an instruction, from the code object's line table only (PyCode_Addr2Line without
// 3.11's lazily built _co_linearray, which another thread may be writing).
int line_of(PyCodeObject* code, int lasti) {
#if RS_PYFRAMES == 0
  (void)code;
  (void)lasti;
  return 0;
#else
  if (lasti < 0) return code->co_firstlineno;
  PyObject* table = code->co_linetable;
  if (table == nullptr || !PyBytes_Check(table)) return 0;
  PyCodeAddressRange bounds;
  using Byte = std::remove_cv_t<std::remove_pointer_t<decltype(bounds.opaque.lo_next)>>;
  bounds.opaque.lo_next = reinterpret_cast<const Byte*>(PyBytes_AS_STRING(table));
  bounds.opaque.limit = bounds.opaque.lo_next + PyBytes_GET_SIZE(table);
  bounds.ar_start = -1;
  bounds.ar_end = 0;
  bounds.opaque.computed_line = code->co_firstlineno;
  bounds.ar_line = -1;
  const int line = _PyCode_CheckLineNumber(lasti * 2, &bounds);  // bytes: two per code unit
  return line < 0 ? 0 : line;
#endif
}

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// A str's text as UTF-8, read from its canonical representation (no UTF-8 cache is made).
bool utf8_of(PyObject* s, std::string* out) {
  out->clear();
  if (s == nullptr || !PyUnicode_Check(s)) return false;
#if PY_VERSION_HEX < 0x030C0000
  if (!PyUnicode_IS_READY(s)) return false;
#endif
  const int kind = PyUnicode_KIND(s);
  const void* data = PyUnicode_DATA(s);
  const Py_ssize_t n = PyUnicode_GET_LENGTH(s);
  if (kind == PyUnicode_1BYTE_KIND && PyUnicode_IS_ASCII(s)) {
    out->assign(static_cast<const char*>(data), static_cast<std::size_t>(n));
    return true;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    const Py_UCS4 c = PyUnicode_READ(kind, data, i);
    if (c < 0x80) {
      out->push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (c >> 6)));
      out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (c >> 12)));
      out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (c >> 18)));
      out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return true;
}

PyObject* function_name_of(PyCodeObject* code) {
#if PY_VERSION_HEX >= 0x030B0000
  return code->co_qualname != nullptr ? code->co_qualname : code->co_name;
#else
  return code->co_name;
#endif
}

// The directories of library code on this machine; set by configure(), read by every walk.
using Roots = detail::CodeRoots;
std::mutex g_roots_mutex;
std::shared_ptr<const Roots> g_roots = std::make_shared<Roots>();
std::atomic<std::uint64_t> g_roots_version{1};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class CodeClass : std::uint8_t { User, Library, Engine };

// The core's one rule decides library code (library_files.h); the engine's entry is this
// walker's own stop.
CodeClass classify(const Roots& roots, const std::string& file, const std::string& name) {
  if (!detail::is_library_file(file, &roots)) return CodeClass::User;
  // torch's autograd engine entry: below it, C++ autograd runs (see site_capture.h).
  if (name == "_engine_run_backward" && ends_with(file, "autograd/graph.py")) return CodeClass::Engine;
  return CodeClass::Library;
}

// What one thread knows about code objects it met in this session.
struct CodeInfo {
  // The code object's immutable fields, to tell it from a new code object at the same address.
  PyObject* filename = nullptr;
  PyObject* name = nullptr;
  PyObject* linetable = nullptr;
  int firstlineno = 0;
  CodeClass cls = CodeClass::User;
  std::uint32_t file_id = 0, function_id = 0;  // trace string ids
  std::uint32_t serial = 0;                    // for the line cache's keys
};

struct ThreadFrames {
  std::uint64_t generation = 0, roots_version = 0;
  std::shared_ptr<const Roots> roots;
  // The session's caches, in memory of their own (page_arena.h): they fill during the user's
  // first steps and would otherwise stay between their tensors in the C heap.
  detail::PageArena arena;  // declared before the maps: outlives them
  detail::ArenaHashMap<const void*, CodeInfo> code{&arena};
  detail::ArenaHashMap<std::uint64_t, std::uint32_t> lines{&arena};  // (serial << 32 | lasti) -> frame id
  std::uint32_t next_serial = 1;
  std::string file, name;  // scratch
  // The last walk: the frames it read (innermost first, up to where it stopped) and what it
  // found. An allocation made from the same frames at the same instructions (several blocks in
  // one op, a loop) gets the same answer by comparing frames, without a lookup.
  struct Last {
    bool valid = false;
    int mode = 0;  // 1: site, stopping at the engine; 2: site, past it; 3: every frame
    std::vector<RawFrame> path;
    PythonWalk result;
    std::vector<std::uint32_t> frames;
    // Whether the answer depends on the innermost frame's instruction: true unless the site
    // was found in an outer frame. When false, an allocation from another line of the same
    // innermost frame (an optimizer's per-parameter loop in library code) gets the same answer.
    bool innermost_line_matters = true;
  } last;
  std::vector<RawFrame> path;  // scratch
};
thread_local ThreadFrames t_frames;

class Walker final : public PythonFrameWalker {
 public:
  bool walk(Recorder& recorder, std::uint64_t generation, PythonWalk* out, std::vector<std::uint32_t>* frames,
            bool stop_at_engine) noexcept override {
    try {
      if (!Py_IsInitialized() || finalizing()) return false;  // thread states may be going away
      PyThreadState* ts = PyGILState_GetThisThreadState();  // this thread's own state (no GIL)
      if (ts == nullptr) return false;
      ThreadFrames& t = state(generation);
      const int mode = frames != nullptr ? 3 : stop_at_engine ? 1 : 2;
      if (t.last.valid && t.last.mode == mode &&
          same_path(ts, t.last.path, mode == 3, t.last.innermost_line_matters)) {
        *out = t.last.result;
        if (frames != nullptr) frames->insert(frames->end(), t.last.frames.begin(), t.last.frames.end());
        return true;
      }
      return walk_again(recorder, t, ts, out, frames, stop_at_engine, mode);
    } catch (...) {
      return false;
    }
  }

 private:
  // The walk when the last one does not answer: every frame read again. Out of line, so that
  // the path above, taken by nearly every allocation right after the user's kernels have
  // evicted its code, is a few instruction lines rather than this whole function.
  [[gnu::noinline]] static bool walk_again(Recorder& recorder, ThreadFrames& t, PyThreadState* ts, PythonWalk* out,
                                          std::vector<std::uint32_t>* frames, bool stop_at_engine, int mode) {
    t.last.valid = false;
    std::vector<RawFrame>& path = t.path;
    path.clear();
    const std::size_t first_frame = frames != nullptr ? frames->size() : 0;
    bool any = false;
    std::uint32_t index = 0;
    RawFrame innermost;
    CodeInfo innermost_info;  // a copy: the cache may rehash during the walk
    bool have_innermost = false;
    std::size_t site_depth = 0;  // the site's position in `path` (walks that stop at it)
    const bool readable = walk_raw(ts, [&](const RawFrame& f) {
      path.push_back(f);
      const CodeInfo* found = code_info(t, recorder, f.code);
      if (found == nullptr) return true;  // unreadable names: skip the frame
      const CodeInfo info = *found;
      const bool first = !any;
      any = true;
      const bool engine = info.cls == CodeClass::Engine && out->site == 0;
      if (engine) out->reached_engine = true;
      if (frames != nullptr) {
        const std::uint32_t id = frame_id(t, recorder, info, f);
        if (info.cls == CodeClass::User && out->site == 0) {
          out->site = id;
          out->site_index = index;
        }
        frames->push_back(id);
        ++index;
        return true;
      }
      if (info.cls == CodeClass::User) {
        out->site = frame_id(t, recorder, info, f);
        site_depth = path.size() - 1;
        return false;  // found: the rest of the stack is not needed
      }
      if (engine && stop_at_engine) return false;  // the caller asks autograd for its node
      if (first) {
        innermost = f;
        innermost_info = info;
        have_innermost = true;
      }
      return true;
    });
    if (!readable || !any) return false;
    if (frames == nullptr && out->site == 0 && have_innermost) {
      out->innermost = frame_id(t, recorder, innermost_info, innermost);
    }
    // The innermost frame's line decides the answer when it is the site, or the frame named
    // for want of one, or when every frame's id is listed.
    t.last.innermost_line_matters = frames != nullptr || out->site == 0 || site_depth == 0;
    t.last.path.swap(path);
    t.last.result = *out;
    t.last.mode = mode;
    if (frames != nullptr) t.last.frames.assign(frames->begin() + static_cast<std::ptrdiff_t>(first_frame), frames->end());
    t.last.valid = true;
    return true;
  }

  // Whether this thread's frames start with `path` (and, when `whole`, are exactly `path`).
  // Unless `innermost_line`, the innermost frame may be at another instruction of the same code.
  static bool same_path(PyThreadState* ts, const std::vector<RawFrame>& path, bool whole, bool innermost_line) {
#if RS_PYFRAMES >= 311
    // Called for nearly every allocation, so a frame that is where the last walk saw it (the
    // same frame, code and instruction: a complete frame then, so a complete frame now) is
    // compared without reading its code object, which is seldom in the cache (whether a frame
    // is complete is read from its code). Only a frame that differs is asked, and skipped if it
    // is incomplete, as walk_raw() skips it.
    std::size_t i = 0;
    for (const InterpreterFrame* f = top_frame(ts); f != nullptr; f = f->previous) {
      if (i < path.size() && f == path[i].frame) {
        PyCodeObject* code = code_of(f);
        if (code != nullptr && code == path[i].code &&
            static_cast<int>(instruction_of(f) - code_start(code)) == path[i].lasti) {
          ++i;
          continue;
        }
      }
      if (incomplete(f)) continue;
      if (i == path.size()) return !whole;  // a frame more than last time
      if (i == 0 && !innermost_line && f == path[0].frame && code_of(f) == path[0].code) {
        ++i;  // the innermost frame, at another instruction of the same code
        continue;
      }
      return false;
    }
    return i == path.size();
#else
    std::size_t i = 0;
    bool same = true;
    walk_raw(ts, [&](const RawFrame& f) {
      if (i == path.size()) {
        if (whole) same = false;  // a frame more than last time
        return false;
      }
      const bool equal = i == 0 && !innermost_line ? f.frame == path[0].frame && f.code == path[0].code
                                                    : f == path[i];
      if (!equal) {
        same = false;
        return false;
      }
      ++i;
      return true;
    });
    return same && i == path.size();
#endif
  }

  static ThreadFrames& state(std::uint64_t generation) {
    ThreadFrames& t = t_frames;
    const std::uint64_t version = g_roots_version.load(std::memory_order_acquire);
    if (t.generation != generation || t.roots_version != version) reset(t, generation, version);
    return t;
  }

  // A new session, or new library roots: the thread's caches start again (out of line: once a
  // session per thread).
  [[gnu::noinline]] static void reset(ThreadFrames& t, std::uint64_t generation, std::uint64_t version) {
    detail::empty_and_release(t.arena, t.code, t.lines);
    t.last.valid = false;
    t.generation = generation;
    t.roots_version = version;
    std::lock_guard<std::mutex> lock(g_roots_mutex);
    t.roots = g_roots;
  }

  static const CodeInfo* code_info(ThreadFrames& t, Recorder& recorder, PyCodeObject* code) {
    auto it = t.code.find(code);
    if (it != t.code.end()) {
      const CodeInfo& c = it->second;
      if (c.filename == code->co_filename && c.name == function_name_of(code) &&
          c.linetable == code->co_linetable && c.firstlineno == code->co_firstlineno) {
        return &c;
      }
    }
    CodeInfo c;
    c.filename = code->co_filename;
    c.name = function_name_of(code);
    c.linetable = code->co_linetable;
    c.firstlineno = code->co_firstlineno;
    if (!utf8_of(c.filename, &t.file) || !utf8_of(c.name, &t.name)) return nullptr;
    std::string plain_name;
    utf8_of(code->co_name, &plain_name);
    c.cls = classify(*t.roots, t.file, plain_name);
    c.file_id = recorder.intern(t.file);
    c.function_id = recorder.intern(t.name);
    c.serial = t.next_serial++;
    auto [slot, inserted] = t.code.insert_or_assign(code, c);
    (void)inserted;
    return &slot->second;
  }

  static std::uint32_t frame_id(ThreadFrames& t, Recorder& recorder, const CodeInfo& info, const RawFrame& f) {
    const std::uint64_t key = (static_cast<std::uint64_t>(info.serial) << 32) | static_cast<std::uint32_t>(f.lasti);
    auto it = t.lines.find(key);
    if (it != t.lines.end()) return it->second;
    FrameRecord r;
    r.kind = FrameKind::Python;
    r.file_id = info.file_id;
    r.function_id = info.function_id;
    r.line = static_cast<std::uint64_t>(line_of(f.code, f.lasti));
    const std::uint32_t id = recorder.intern_frame(r);
    t.lines.emplace(key, id);
    return id;
  }

};

// The same walk through the public API (GIL held): (code object, line) innermost first.
std::vector<std::pair<const void*, int>> public_walk() {
  std::vector<std::pair<const void*, int>> out;
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(f);
    out.emplace_back(code, PyFrame_GetLineNumber(f));
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  return out;
}

}  // namespace

std::string configure_python_frames(const std::vector<std::string>& library_roots,
                                    const std::vector<std::string>& stdlib_roots) {
#if RS_PYFRAMES == 0
  (void)library_roots;
  (void)stdlib_roots;
  return std::string("Python frames are not read on Python ") + PY_VERSION +
         " (3.10 to 3.13 with the GIL are supported)";
#else
  {
    auto roots = std::make_shared<Roots>();
    roots->library = library_roots;
    roots->stdlib = stdlib_roots;
    std::lock_guard<std::mutex> lock(g_roots_mutex);
    g_roots = std::move(roots);
    g_roots_version.fetch_add(1, std::memory_order_acq_rel);
  }
  static Walker walker;
  if (python_frame_walker() == &walker) return "";
  // The mirrored frame layout must agree with the public API before the walker is trusted.
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr || ts != PyThreadState_Get()) return "the calling thread's Python state is not its own";
  std::vector<std::pair<const void*, int>> ours;
  walk_raw(ts, [&](const RawFrame& f) {
    ours.emplace_back(f.code, line_of(f.code, f.lasti));
    return true;
  });
  const auto expected = public_walk();
  if (ours.empty() || ours.size() != expected.size()) {
    return "the Python frame walker disagrees with the interpreter on this thread's stack (" +
           std::to_string(ours.size()) + " frames against " + std::to_string(expected.size()) + ")";
  }
  for (std::size_t i = 0; i < ours.size(); ++i) {
    if (ours[i] != expected[i]) {
      return "the Python frame walker disagrees with the interpreter at frame " + std::to_string(i);
    }
  }
  set_python_frame_walker(&walker);
  return "";
#endif
}

}  // namespace ridgescope::sources
