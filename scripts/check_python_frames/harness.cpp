// A standalone check of python_frames.cpp against one Python (scripts/check_python_frames.sh):
// the walker's frames, read with the GIL released, for check.py to compare with the interpreter's.
#include <Python.h>
#include <string>
#include <vector>
#include "python_frames.h"
#include "python_locals.h"
#include "site_capture.h"
#include "ridgescope/trace_reader.h"

namespace rs = ridgescope;
namespace ridgescope::sources {
namespace { std::atomic<PythonFrameWalker*> g_w{nullptr}; }
void set_python_frame_walker(PythonFrameWalker* w) noexcept { g_w.store(w); }
PythonFrameWalker* python_frame_walker() noexcept { return g_w.load(); }
}

static std::vector<std::string> strs(PyObject* list) {
  std::vector<std::string> out;
  for (Py_ssize_t i = 0; i < PyList_Size(list); ++i) out.emplace_back(PyUnicode_AsUTF8(PyList_GetItem(list, i)));
  return out;
}

static PyObject* configure(PyObject*, PyObject* args) {
  PyObject *lib, *std_;
  if (!PyArg_ParseTuple(args, "OO", &lib, &std_)) return nullptr;
  return PyUnicode_FromString(rs::sources::configure_python_frames(strs(lib), strs(std_)).c_str());
}

// walk(path, full): walks with the GIL released; returns [(kind, file, line, function), ...]
// innermost first (full) or [site] and the site index.
static std::uint64_t generation = 100;
static PyObject* walk(PyObject*, PyObject* args) {
  const char* path; int full;
  if (!PyArg_ParseTuple(args, "si", &path, &full)) return nullptr;
  std::vector<std::uint32_t> frames;
  rs::sources::PythonWalk w;
  bool ok = false;
  {
    rs::Recorder rec(path);
    auto* walker = rs::sources::python_frame_walker();
    Py_BEGIN_ALLOW_THREADS
    if (walker) ok = walker->walk(rec, generation++, &w, full ? &frames : nullptr, false);
    Py_END_ALLOW_THREADS
    if (!full) frames.push_back(w.site ? w.site : w.innermost);
    std::uint32_t s = rec.intern_stack(frames.data(), frames.size(), w.site_index);
    (void)s;
    rec.close();
  }
  rs::TraceReader r(path);
  rs::Event e;
  while (r.next(e)) {}
  PyObject* out = PyList_New(0);
  for (auto id : frames) {
    auto f = r.frame(id);
    PyObject* t = Py_BuildValue("(ssis)", std::string(rs::frame_kind_name(f.kind)).c_str(), std::string(r.string(f.file_id)).c_str(),
                                (int)f.line, std::string(r.string(f.function_id)).c_str());
    PyList_Append(out, t);
    Py_DECREF(t);
  }
  return Py_BuildValue("(NiO)", out, (int)w.site_index, ok ? Py_True : Py_False);
}

// frame_locals(frame): the locals reader (python_locals.h), None where it does not read them.
static PyObject* frame_locals(PyObject*, PyObject* frame) { return rs::sources::frame_locals(frame); }

static PyMethodDef methods[] = {{"configure", configure, METH_VARARGS, ""}, {"walk", walk, METH_VARARGS, ""},
                                {"frame_locals", frame_locals, METH_O, ""}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef mod = {PyModuleDef_HEAD_INIT, "pyframes_check", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_pyframes_check() { return PyModule_Create(&mod); }
