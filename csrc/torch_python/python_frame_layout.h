// python_frame_layout.h — CPython's internal frame structs, mirrored per minor version as far as
// ridgescope reads them: the frame walker (python_frames.cpp, allocation sites without the GIL)
// and the locals reader (python_locals.cpp, with the GIL). Internal to csrc/torch; include it
// after <Python.h>. Each mirror is checked against the public API before it is used
// (configure_python_frames, python_locals_status), so a layout this build gets wrong is turned
// off, not read.
// Thread-safety: declarations only.
#pragma once

#include <Python.h>
#include <frameobject.h>

#include <cstdint>

// Which frame layout this build reads (it is built against one Python's headers).
#if defined(Py_GIL_DISABLED) || PY_VERSION_HEX >= 0x030E0000 || PY_VERSION_HEX < 0x030A0000
#define RS_PYFRAMES 0
#elif PY_VERSION_HEX >= 0x030D0000
#define RS_PYFRAMES 313
#elif PY_VERSION_HEX >= 0x030C0000
#define RS_PYFRAMES 312
#elif PY_VERSION_HEX >= 0x030B0000
#define RS_PYFRAMES 311
#else
#define RS_PYFRAMES 310
#endif

namespace ridgescope::sources::pyframe {

#if RS_PYFRAMES >= 311
// A code unit (_Py_CODEUNIT: two bytes, internal to CPython in 3.13) and the first one of a code
// object (_PyCode_CODE).
using CodeUnit = std::uint16_t;
inline const CodeUnit* code_start(PyCodeObject* code) { return reinterpret_cast<const CodeUnit*>(code->co_code_adaptive); }

// CPython's _PyInterpreterFrame (Include/internal/pycore_frame.h of each version) up to its
// locals: `localsplus` holds co_nlocalsplus slots (arguments, locals, cells, free variables:
// code->co_localsplusnames and co_localspluskinds), then the evaluation stack.
#if RS_PYFRAMES == 311
struct InterpreterFrame {
  PyObject* f_func;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyCodeObject* f_code;
  PyFrameObject* frame_obj;
  InterpreterFrame* previous;
  CodeUnit* prev_instr;
  int stacktop;
  bool is_entry;
  char owner;
  PyObject* localsplus[1];
};
inline PyCodeObject* code_of(const InterpreterFrame* f) { return f->f_code; }
inline const CodeUnit* instruction_of(const InterpreterFrame* f) { return f->prev_instr; }
#elif RS_PYFRAMES == 312
struct InterpreterFrame {
  PyCodeObject* f_code;
  InterpreterFrame* previous;
  PyObject* f_funcobj;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyFrameObject* frame_obj;
  CodeUnit* prev_instr;
  int stacktop;
  std::uint16_t return_offset;
  char owner;
  PyObject* localsplus[1];
};
inline PyCodeObject* code_of(const InterpreterFrame* f) { return f->f_code; }
inline const CodeUnit* instruction_of(const InterpreterFrame* f) { return f->prev_instr; }
#else  // 3.13
struct InterpreterFrame {
  PyObject* f_executable;
  InterpreterFrame* previous;
  PyObject* f_funcobj;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyFrameObject* frame_obj;
  CodeUnit* instr_ptr;
  int stacktop;
  std::uint16_t return_offset;
  char owner;
  PyObject* localsplus[1];
};
inline PyCodeObject* code_of(const InterpreterFrame* f) {
  return f->f_executable != nullptr && PyCode_Check(f->f_executable) ? reinterpret_cast<PyCodeObject*>(f->f_executable)
                                                                    : nullptr;
}
inline const CodeUnit* instruction_of(const InterpreterFrame* f) { return f->instr_ptr; }
#endif
// The head of a frame object (struct _frame), the same in 3.11, 3.12 and 3.13: where its
// interpreter frame is (the live frame while it runs, its own copy after).
struct FrameObjectHead {
  PyObject_HEAD
  PyFrameObject* f_back;
  InterpreterFrame* f_frame;
};

constexpr char kOwnedByGenerator = 1;
constexpr char kOwnedByCStack = 3;  // 3.12+: the interpreter's entry frames

inline const InterpreterFrame* top_frame(PyThreadState* ts) {
#if RS_PYFRAMES >= 313
  return reinterpret_cast<const InterpreterFrame*>(ts->current_frame);
#else
  return ts->cframe != nullptr ? reinterpret_cast<const InterpreterFrame*>(ts->cframe->current_frame) : nullptr;
#endif
}

// _PyFrame_IsIncomplete of each version: frames the public API never shows.
inline bool incomplete(const InterpreterFrame* f) {
#if RS_PYFRAMES >= 312
  if (f->owner == kOwnedByCStack) return true;
#endif
  PyCodeObject* code = code_of(f);
  if (code == nullptr) return true;
  return f->owner != kOwnedByGenerator && instruction_of(f) < code_start(code) + code->_co_firsttraceable;
}
#endif  // RS_PYFRAMES >= 311

}  // namespace ridgescope::sources::pyframe
