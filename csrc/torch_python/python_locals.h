// python_locals.h — the local variables of a running Python frame, read without the snapshot
// that `frame.f_locals` makes. Compiled into the Python module only (python/ridgescope/
// _model_frames.py finds second models by the variables that hold them, docs/categories.md).
//
// Why not `frame.f_locals`. On Python 3.11 and 3.12, reading f_locals of a function's frame
// copies its fast locals into a dict that the frame keeps until it returns (or the next
// f_locals): every tensor the function held at that instant would stay alive after the
// function dropped it (`del x`, rebinding `loss` on the next iteration), which would change the
// memory of the run being measured. This reader copies the references into a list the caller
// drops after looking, and leaves the frame as it was. On Python 3.13 `f_locals` is a
// write-through view without a snapshot (PEP 667), so the caller uses it there.
//
// Thread-safety: with the GIL held (the caller is Python).
#pragma once

#include <Python.h>

#include <string>

namespace ridgescope::sources {

// A new list of (name, value) tuples: the bound arguments, locals and cell/free variables of
// `frame` (a frame object of a running frame), unbound ones left out; cells are read through.
// Returns None when this build does not read locals (Python other than 3.11/3.12), and sets
// a Python error (returns nullptr) when `frame` is not a frame object.
PyObject* frame_locals(PyObject* frame);

// "" when frame_locals reads this interpreter's frames, else why not (a Python version whose
// layout is not mirrored).
std::string frame_locals_status();

}  // namespace ridgescope::sources
