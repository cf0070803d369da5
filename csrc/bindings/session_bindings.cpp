// session_bindings.cpp — ridgescope._C.Session (the tracking session of csrc/torch), its
// saved-tensor hooks as plain C functions, the allocator sources' probes and the Python frame
// readers. Conversions only. The one part (with distributed_bindings.cpp) that parses torch's
// Python headers: the tensor casters and THPVariable.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ridgescope/flight.h"
#include "bindings.h"
#include "cpu_allocator_source.h"
#include "cuda_allocator_source.h"
#include "cupti_source.h"
#include "host_memory_source.h"
#include "python_frames.h"
#include "python_locals.h"
#include "site_capture.h"
#include "tracking_session.h"

namespace py = pybind11;
using ridgescope::sources::TrackingSession;
using ridgescope_bindings::to_category;

namespace {

// The saved-tensor hooks as plain CPython functions (METH_O): torch calls them for every tensor
// saved for backward (pack) and every use of one in backward (unpack); a pybind11 method's
// dispatch costs more than the work. The pack hook's self is a capsule holding the session,
// which also keeps the Python session object alive as long as torch holds the hook.
constexpr const char* kSessionCapsule = "ridgescope.TrackingSession";

PyObject* pack_saved(PyObject* capsule, PyObject* tensor) {
  auto* session = static_cast<TrackingSession*>(PyCapsule_GetPointer(capsule, kSessionCapsule));
  if (session == nullptr) return nullptr;
  try {
    if (THPVariable_Check(tensor)) session->on_saved_tensor(THPVariable_Unpack(tensor));
  } catch (...) {
    PyErr_Clear();  // not a tensor we can read: saved as it is, untagged
  }
  Py_INCREF(tensor);
  return tensor;
}

PyObject* unpack_saved(PyObject*, PyObject* packed) {
  Py_INCREF(packed);
  return packed;
}

PyMethodDef kPackSaved = {"pack_saved", pack_saved, METH_O, "ridgescope's saved-tensor pack hook"};
PyMethodDef kUnpackSaved = {"unpack_saved", unpack_saved, METH_O, "the identity: ridgescope's unpack hook"};

// A trace string id passed from Python (a non-negative int); false with the error set.
bool string_id(PyObject* value, std::uint32_t* id) {
  const unsigned long v = PyLong_AsUnsignedLong(value);
  if (v == static_cast<unsigned long>(-1) && PyErr_Occurred()) return false;
  *id = static_cast<std::uint32_t>(v);
  return true;
}

// The module calls' calls into the session, for the same reason: they run for every module
// call (python/ridgescope/_module_calls.py, docs/performance.md).
// enter_module(activation_label, context): two non-negative ints (string ids).
PyObject* enter_module_fast(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs) {
  auto* session = static_cast<TrackingSession*>(PyCapsule_GetPointer(capsule, kSessionCapsule));
  if (session == nullptr) return nullptr;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "enter_module(activation_label, context) takes two ints");
    return nullptr;
  }
  std::uint32_t label = 0, context = 0;
  if (!string_id(args[0], &label) || !string_id(args[1], &context)) return nullptr;
  session->enter_module(label, context);
  Py_RETURN_NONE;
}

PyObject* exit_module_fast(PyObject* capsule, PyObject*) {
  auto* session = static_cast<TrackingSession*>(PyCapsule_GetPointer(capsule, kSessionCapsule));
  if (session == nullptr) return nullptr;
  session->exit_module();
  Py_RETURN_NONE;
}

PyMethodDef kEnterModule = {"enter_module", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(enter_module_fast)),
                            METH_FASTCALL, "enter_module(activation_label, context): a module call begins"};
PyMethodDef kExitModule = {"exit_module", exit_module_fast, METH_NOARGS, "the innermost module call ended"};

// The phase boundaries' calls, for the same reason: a boundary is one call, not three
// pybind11 calls (the allocator sample, the marker, the degraded flag), at the moments of the
// step when ridgescope's code is coldest in the cache (docs/performance.md).
// phase_begin(name_id): samples the allocator, then opens the phase.
PyObject* phase_begin_fast(PyObject* capsule, PyObject* name) {
  auto* session = static_cast<TrackingSession*>(PyCapsule_GetPointer(capsule, kSessionCapsule));
  if (session == nullptr) return nullptr;
  std::uint32_t id = 0;
  if (!string_id(name, &id)) return nullptr;
  session->sample_allocator();
  session->phase_begin(id);
  Py_RETURN_NONE;
}

// phase_end(name_id): closes the phase, then samples the allocator. Returns whether the session
// is degraded (its `degraded` property).
PyObject* phase_end_fast(PyObject* capsule, PyObject* name) {
  auto* session = static_cast<TrackingSession*>(PyCapsule_GetPointer(capsule, kSessionCapsule));
  if (session == nullptr) return nullptr;
  std::uint32_t id = 0;
  if (!string_id(name, &id)) return nullptr;
  session->phase_end(id);
  session->sample_allocator();
  return PyBool_FromLong(session->degraded() ? 1 : 0);
}

PyMethodDef kPhaseBegin = {"phase_begin", phase_begin_fast, METH_O,
                           "phase_begin(name_id): samples the allocator and opens the phase"};
PyMethodDef kPhaseEnd = {"phase_end", phase_end_fast, METH_O,
                         "phase_end(name_id) -> degraded: closes the phase and samples the allocator"};

// Instrumentation.module_call's nested case, in C. Every module call of the process comes
// through Module.__call__'s wrapper while a session tracks (_module_calls.py), and nearly all of
// them are nested calls that only push and pop the module context: in Python that path was
// about 90 bytecodes a call, the largest part of the interpreter's share of a tracked step
// (docs/performance.md). Anything else (the outermost call, a recomputation, a failed session,
// an internal error) goes to the Python method, which does all of it.
// self: the tuple (session capsule, Instrumentation, its threading.local, its module labels).
struct ModuleCallNames {
  PyObject* calls;
  PyObject* failed;
  PyObject* recomputing;
  PyObject* module_call;
  PyObject* module_exit;
  PyObject* module_info;
  PyObject* internal_error;
};

const ModuleCallNames* module_call_names() {
  static const ModuleCallNames* names = [] {
    auto* n = new ModuleCallNames{PyUnicode_InternFromString("calls"), PyUnicode_InternFromString("failed"),
                                  PyUnicode_InternFromString("_recomputing"),
                                  PyUnicode_InternFromString("module_call"),
                                  PyUnicode_InternFromString("_module_exit"),
                                  PyUnicode_InternFromString("_module_info"),
                                  PyUnicode_InternFromString("internal_error")};
    return n;
  }();
  return names;
}

// call(module, *args, **kwargs)
PyObject* call_module(PyObject* call, PyObject* module, PyObject* args, PyObject* kwargs) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  PyObject* small[8];
  PyObject** stack = small;
  if (n + 1 > 8) {
    stack = static_cast<PyObject**>(PyMem_Malloc(static_cast<std::size_t>(n + 1) * sizeof(PyObject*)));
    if (stack == nullptr) return PyErr_NoMemory();
  }
  stack[0] = module;
  for (Py_ssize_t i = 0; i < n; ++i) stack[i + 1] = PyTuple_GET_ITEM(args, i);
  PyObject* out = PyObject_VectorcallDict(call, stack, static_cast<std::size_t>(n + 1),
                                          PyDict_GET_SIZE(kwargs) != 0 ? kwargs : nullptr);
  if (stack != small) PyMem_Free(stack);
  return out;
}

// 1 or 0 for the attribute's truth, 1 when it cannot be read (the Python path then decides).
int flag(PyObject* obj, PyObject* name) {
  PyObject* v = PyObject_GetAttr(obj, name);
  if (v == nullptr) {
    PyErr_Clear();
    return 1;
  }
  const int truth = PyObject_IsTrue(v);
  Py_DECREF(v);
  if (truth < 0) PyErr_Clear();
  return truth != 0;
}

// As Python's `except Exception as exc: self.internal_error(exc)` (the one message format is
// there): false (the error left set) for an exception that is not an Exception
// (KeyboardInterrupt, SystemExit).
bool report_internal_error(PyObject* instr) {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return false;
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  PyObject* done = value != nullptr ? PyObject_CallMethodOneArg(instr, module_call_names()->internal_error, value)
                                    : nullptr;
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  if (done == nullptr) PyErr_Clear();
  Py_XDECREF(done);
  return true;
}

// module_call(call, module, args, kwargs), as Instrumentation.module_call.
PyObject* module_call_fast(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  const ModuleCallNames& names = *module_call_names();
  if (nargs != 4 || !PyTuple_Check(self) || PyTuple_GET_SIZE(self) != 4) {
    PyErr_SetString(PyExc_TypeError, "module_call(call, module, args, kwargs) takes four arguments");
    return nullptr;
  }
  PyObject* instr = PyTuple_GET_ITEM(self, 1);
  PyObject *call = a[0], *module = a[1], *args = a[2], *kwargs = a[3];
  auto* session = static_cast<TrackingSession*>(PyCapsule_GetPointer(PyTuple_GET_ITEM(self, 0), kSessionCapsule));
  if (session == nullptr) return nullptr;
  PyObject* calls = nullptr;
  if (PyTuple_CheckExact(args) && PyDict_CheckExact(kwargs) && !flag(instr, names.failed)) {
    calls = PyObject_GetAttr(PyTuple_GET_ITEM(self, 2), names.calls);
    if (calls == nullptr) PyErr_Clear();
  }
  if (calls == nullptr || !PyList_CheckExact(calls) || PyList_GET_SIZE(calls) == 0) {
    // Not a nested call on this thread, or not one this path knows: the Python method's.
    Py_XDECREF(calls);
    PyObject* stack[] = {instr, call, module, args, kwargs};
    return PyObject_VectorcallMethod(names.module_call, stack, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  }
  // A module inside another one: its labels (made once per module), then its context.
  PyObject* key = PyLong_FromVoidPtr(module);  // id(module)
  PyObject* info = key != nullptr ? PyDict_GetItemWithError(PyTuple_GET_ITEM(self, 3), key) : nullptr;
  Py_XINCREF(info);
  Py_XDECREF(key);
  if (info == nullptr && !PyErr_Occurred()) info = PyObject_CallMethodOneArg(instr, names.module_info, module);
  std::uint32_t label = 0, context = 0;
  if (info == nullptr || !PyTuple_Check(info) || PyTuple_GET_SIZE(info) < 4 ||
      !string_id(PyTuple_GET_ITEM(info, 0), &label) || !string_id(PyTuple_GET_ITEM(info, 3), &context) ||
      PyList_Append(calls, Py_None) < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a module's labels are not (int, int, str, int)");
    Py_XDECREF(info);
    Py_DECREF(calls);
    if (!report_internal_error(instr)) return nullptr;
    return call_module(call, module, args, kwargs);
  }
  Py_DECREF(info);
  session->enter_module(label, context);
  PyObject* output = call_module(call, module, args, kwargs);
  if (output == nullptr) {  // the module raised: its context closes, the exception goes on
    PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject* stack[] = {instr, module, args, Py_None};
    PyObject* done = PyObject_VectorcallMethod(names.module_exit, stack, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    if (done == nullptr) PyErr_Clear();
    Py_XDECREF(done);
    PyErr_Restore(type, value, traceback);
    Py_DECREF(calls);
    return nullptr;
  }
  // The common case again: nothing opened, nothing to tag.
  const Py_ssize_t n = PyList_GET_SIZE(calls);
  if (n > 1 && PyList_GET_ITEM(calls, n - 1) == Py_None && !flag(instr, names.recomputing) &&
      !flag(instr, names.failed) && PyList_SetSlice(calls, n - 1, n, nullptr) == 0) {
    session->exit_module();
  } else {
    PyErr_Clear();
    PyObject* stack[] = {instr, module, args, output};
    PyObject* done = PyObject_VectorcallMethod(names.module_exit, stack, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    if (done == nullptr) {
      Py_DECREF(output);
      Py_DECREF(calls);
      return nullptr;
    }
    Py_DECREF(done);
  }
  Py_DECREF(calls);
  return output;
}

PyMethodDef kModuleCall = {"module_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(module_call_fast)),
                           METH_FASTCALL, "module_call(call, module, args, kwargs): Instrumentation.module_call"};

void release_session(PyObject* capsule) {
  Py_XDECREF(static_cast<PyObject*>(PyCapsule_GetContext(capsule)));
}

// A capsule holding the session (and a reference to its Python object, released with it).
py::object session_capsule(py::object session) {
  TrackingSession& s = session.cast<TrackingSession&>();
  PyObject* capsule = PyCapsule_New(&s, kSessionCapsule, release_session);
  if (capsule == nullptr) throw py::error_already_set();
  PyCapsule_SetContext(capsule, session.inc_ref().ptr());
  return py::reinterpret_steal<py::object>(capsule);
}

// Two plain C functions over the session's capsule (the second without it when it needs no
// session: the identity unpack hook).
py::tuple c_function_pair(py::object session, PyMethodDef* first, PyMethodDef* second,
                          bool second_takes_session = true) {
  py::object self = session_capsule(session);
  py::object a = py::reinterpret_steal<py::object>(PyCFunction_New(first, self.ptr()));
  py::object b = py::reinterpret_steal<py::object>(
      PyCFunction_New(second, second_takes_session ? self.ptr() : nullptr));
  if (!a || !b) throw py::error_already_set();
  return py::make_tuple(a, b);
}

py::tuple saved_tensor_hooks(py::object session) {
  return c_function_pair(session, &kPackSaved, &kUnpackSaved, /*second_takes_session=*/false);
}

py::tuple module_calls(py::object session) { return c_function_pair(session, &kEnterModule, &kExitModule); }

py::tuple phase_calls(py::object session) { return c_function_pair(session, &kPhaseBegin, &kPhaseEnd); }

// Instrumentation.module_call as a plain C function over the session and what it reads.
py::object module_call_function(py::object session, py::object instrumentation, py::object local, py::dict labels) {
  py::tuple self = py::make_tuple(session_capsule(session), instrumentation, local, labels);
  py::object f = py::reinterpret_steal<py::object>(PyCFunction_New(&kModuleCall, self.ptr()));
  if (!f) throw py::error_already_set();
  return f;
}

}  // namespace

void ridgescope_bindings::bind_session(py::module_& m) {
  py::list stack_modes;
  for (auto mode : {ridgescope::sources::StackMode::Site, ridgescope::sources::StackMode::Python,
                    ridgescope::sources::StackMode::All, ridgescope::sources::StackMode::Off}) {
    stack_modes.append(ridgescope::sources::stack_mode_name(mode));
  }
  m.attr("STACK_MODES") = py::tuple(stack_modes);  // rs.track(stacks=...), the default first

  m.def("_cpu_allocator_installed", &ridgescope::sources::cpu_allocator_source_installed,
        "Whether ridgescope's tracking CPU allocator is registered now (for tests).");
  m.def("_cuda_source_compiled", &ridgescope::sources::cuda_source_compiled,
        "Whether this build has the CUDA caching-allocator source (torch had CUDA at build time).");
  m.def("_cupti_source_compiled", &ridgescope::sources::cupti_source_compiled,
        "Whether this build has the CUPTI source (CUPTI's headers were found at build time).");
  m.def(
      "_resident_part",
      [](const std::vector<std::pair<std::uint64_t, std::uint64_t>>& blocks) {
        std::pmr::vector<unsigned char> pages;
        return ridgescope::sources::resident_part(blocks, pages);
      },
      py::arg("blocks"),
      "The bytes of (address, bytes) ranges whose pages are resident (mincore; the host source's rule).");
  m.def("_cuda_workspace_tags_compiled", &ridgescope::sources::cuda_workspace_tags_compiled,
        "Whether this build reads torch's cuBLAS workspace maps (workspace blocks are tagged).");
  m.def("_cuda_allocator_backend", &ridgescope::sources::cuda_allocator_backend,
        "The CUDA allocator backend ('native', 'cudaMallocAsync'), or '' without CUDA.");
  m.def("_cuda_source_stats", &ridgescope::sources::cuda_source_stats_json,
        "The CUDA source's counters as JSON text (for tests and the GPU check).");
  m.def("_cpu_live_bytes", &ridgescope::sources::cpu_live_bytes,
        "The CPU source's own count of live bytes in the running session (for tests).");

  m.def("configure_python_frames", &ridgescope::sources::configure_python_frames,
        py::arg("library_roots"), py::arg("stdlib_roots"),
        "Set which files are library code for allocation sites and install the Python frame "
        "walker after checking it on this thread; returns '' or why Python frames are not read.");

  m.def("frame_locals",
        [](py::object frame) -> py::object {
          PyObject* out = ridgescope::sources::frame_locals(frame.ptr());
          if (out == nullptr) throw py::error_already_set();
          return py::reinterpret_steal<py::object>(out);
        },
        py::arg("frame"),
        "The (name, value) pairs of a running frame's locals, without the snapshot f_locals "
        "keeps (python_locals.h); None where this build does not read them.");
  m.def("frame_locals_status", &ridgescope::sources::frame_locals_status,
        "'' when frame_locals reads this interpreter's frames, else why not.");

  py::class_<TrackingSession>(m, "Session")
      .def(py::init([](const std::string& path, std::uint64_t capacity, const std::string& stacks,
                       std::uint64_t keep_steps, bool host_memory, bool idle_writer,
                       std::uint64_t keep_first_steps) {
             ridgescope::sources::StackMode mode;
             if (!ridgescope::sources::parse_stack_mode(stacks, &mode)) {
               throw py::value_error("stacks must be 'site', 'python', 'all' or 'none', got '" + stacks + "'");
             }
             ridgescope::FlightOptions flight;
             flight.keep_steps = keep_steps;
             flight.keep_first_steps = keep_first_steps;
             return std::make_unique<TrackingSession>(path, capacity, mode, flight, host_memory, idle_writer);
           }),
           py::arg("path"), py::arg("capacity") = 0, py::arg("stacks") = "site", py::arg("keep_steps") = 0,
           py::arg("host_memory") = true, py::arg("idle_writer") = false, py::arg("keep_first_steps") = 0)
      .def_property_readonly("keep_steps", &TrackingSession::keep_steps)
      .def("mark", &TrackingSession::mark)
      .def("stop", &TrackingSession::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("active", &TrackingSession::active)
      .def_property_readonly("degraded", &TrackingSession::degraded)
      .def_property_readonly("error", &TrackingSession::error)
      .def_property_readonly("path", &TrackingSession::path)
      .def("start_driver_view", &TrackingSession::start_driver_view, py::arg("interval_ms") = 100)
      .def("start_cuda", &TrackingSession::start_cuda, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("cuda_started", &TrackingSession::cuda_started)
      .def("start_cupti", &TrackingSession::start_cupti, py::call_guard<py::gil_scoped_release>())
      .def("set_host_memory", &TrackingSession::set_host_memory, py::arg("on"))
      .def("flush", &TrackingSession::flush, py::call_guard<py::gil_scoped_release>())
      .def("intern", &TrackingSession::intern)
      .def("metadata", &TrackingSession::metadata)
      .def("phase_begin", &TrackingSession::phase_begin)
      .def("phase_end", &TrackingSession::phase_end)
      .def("step", &TrackingSession::step)
      .def("sample_allocator", &TrackingSession::sample_allocator)
      .def("tag",
           [](TrackingSession& s, const at::Tensor& t, const std::string& category,
              std::uint32_t label, bool weak) { s.tag_tensor(t, to_category(category), label, weak); },
           py::arg("tensor"), py::arg("category"), py::arg("label") = 0, py::arg("weak") = false)
      .def("register",
           [](TrackingSession& s, const at::Tensor& t, const std::string& category,
              std::uint32_t label, bool weak) { return s.register_tensor(t, to_category(category), label, weak); },
           py::arg("tensor"), py::arg("category"), py::arg("label") = 0, py::arg("weak") = false)
      .def("pack_saved",
           [](TrackingSession& s, const at::Tensor& t) { return s.on_saved_tensor(t); })
      .def("saved_tensor_hooks", &saved_tensor_hooks,
           "(pack, unpack): the saved-tensor hooks as plain C functions (pack tags activations)")
      .def("module_calls", &module_calls,
           "(enter_module, exit_module) as plain C functions, for the module calls")
      .def("module_call_function", &module_call_function, py::arg("instrumentation"), py::arg("local"),
           py::arg("labels"),
           "Instrumentation.module_call(call, module, args, kwargs) as a plain C function: the "
           "nested call in C, anything else through the Python method")
      .def("phase_calls", &phase_calls,
           "(phase_begin, phase_end) as plain C functions sampling the allocator; phase_end "
           "returns `degraded`")
      .def("watch_parameters", &TrackingSession::watch_parameters)
      .def("tag_gradients", &TrackingSession::tag_gradients)
      .def("enter_module", &TrackingSession::enter_module, py::arg("activation_label"),
           py::arg("context") = 0)
      .def("exit_module", &TrackingSession::exit_module)
      .def("degrade", &TrackingSession::degrade)
      .def("inject_fault", &TrackingSession::inject_fault)
      .def("stats", [](const TrackingSession& s) {
        const auto st = s.stats();
        py::dict d;
        d["events"] = st.events;
        d["dropped_events"] = st.dropped_events;
        d["bytes_written"] = st.bytes_written;
        d["chunks_written"] = st.chunks_written;
        d["file_bytes"] = st.file_bytes;
        d["buffer_bytes_peak"] = st.buffer_bytes_peak;
        d["buffer_bytes"] = st.buffer_bytes;
        return d;
      });
}
