// python_locals.cpp — a running frame's locals without f_locals' snapshot (python_locals.h).
#include "python_locals.h"

#include <algorithm>

#include "python_frame_layout.h"

namespace ridgescope::sources {
namespace {

#if RS_PYFRAMES == 311 || RS_PYFRAMES == 312
// co_localspluskinds (Include/internal/pycore_code.h): a cell or free variable's slot holds the
// cell once the frame has started (MAKE_CELL, COPY_FREE_VARS run before the first line).
constexpr unsigned char kFastCell = 0x40;
constexpr unsigned char kFastFree = 0x80;
#endif

}  // namespace

PyObject* frame_locals(PyObject* frame) {
  if (frame == nullptr || !PyFrame_Check(frame)) {
    PyErr_SetString(PyExc_TypeError, "frame_locals: expected a frame object");
    return nullptr;
  }
#if RS_PYFRAMES == 311 || RS_PYFRAMES == 312
  const auto* head = reinterpret_cast<const pyframe::FrameObjectHead*>(frame);
  const pyframe::InterpreterFrame* f = head->f_frame;
  PyCodeObject* code = f != nullptr ? pyframe::code_of(f) : nullptr;
  if (code == nullptr) return PyList_New(0);
  PyObject* names = code->co_localsplusnames;
  PyObject* kinds = code->co_localspluskinds;
  if (names == nullptr || !PyTuple_Check(names) || kinds == nullptr || !PyBytes_Check(kinds)) return PyList_New(0);
  const Py_ssize_t n = std::min<Py_ssize_t>(code->co_nlocalsplus, PyTuple_GET_SIZE(names));
  const auto* kind = reinterpret_cast<const unsigned char*>(PyBytes_AS_STRING(kinds));
  const Py_ssize_t nkinds = PyBytes_GET_SIZE(kinds);
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* value = f->localsplus[i];
    if (value == nullptr) continue;  // not bound (yet, or any more)
    if (i < nkinds && (kind[i] & (kFastCell | kFastFree)) && PyCell_Check(value)) {
      value = PyCell_GET(value);
      if (value == nullptr) continue;
    }
    PyObject* pair = PyTuple_Pack(2, PyTuple_GET_ITEM(names, i), value);
    if (pair == nullptr || PyList_Append(out, pair) < 0) {
      Py_XDECREF(pair);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(pair);
  }
  return out;
#else
  Py_RETURN_NONE;
#endif
}

std::string frame_locals_status() {
#if RS_PYFRAMES == 311 || RS_PYFRAMES == 312
  return "";
#else
  return std::string("frame locals are read by the C++ reader on Python 3.11 and 3.12 only, not ") + PY_VERSION;
#endif
}

}  // namespace ridgescope::sources
