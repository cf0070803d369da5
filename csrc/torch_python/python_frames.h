// python_frames.h — the allocating thread's Python frames, read without the GIL, for allocation
// sites (site_capture.h, docs/sites.md). Compiled into the Python module only: the C++ library
// has no Python.
//
// Why no GIL is needed. torch releases the GIL around every operator it runs for Python code
// (its generated bindings hold a gil_scoped_release while the op runs), so an allocation made
// for `y = x @ w` happens on a thread that does not hold it; taking the GIL there would block
// the allocation on any other Python thread, or deadlock against a thread that holds the GIL
// and waits for the allocator. The walker never takes it. It reads only the calling thread's
// own frame chain (PyThreadState of this thread, found with PyGILState_GetThisThreadState),
// which no other thread changes: while this thread is inside a C call, its frames cannot be
// pushed or popped, and the fields read — each frame's code object, instruction pointer,
// `previous` link and owner — belong to this thread alone. From the code object it reads
// immutable fields (file name, qualified name, first line, line table). It calls no Python
// function that allocates, changes a reference count, or runs Python code. The line number
// comes from the line table through _PyCode_CheckLineNumber, a pure function of the table.
// What it reads is cached per thread by code object (validated by the code object's immutable
// fields, so an address reused by a new code object is never taken for the old one) and by
// (code object, instruction).
//
// The layout of CPython's internal frame struct differs per minor version (3.10: frame
// objects; 3.11, 3.12, 3.13: _PyInterpreterFrame, mirrored here per version). Before use,
// configure() compares a walk of the current thread (made with the GIL held) with the same
// walk through the public API (PyEval_GetFrame, PyFrame_GetBack, PyFrame_GetCode,
// PyFrame_GetLineNumber); if they differ, or the Python version is not one of these (3.14, a
// free-threaded build), the walker stays off and allocations get autograd-node sites only.
//
// Thread-safety: configure() with the GIL held, from the session's thread; the walk from any
// thread, concurrently.
#pragma once

#include <string>
#include <vector>

namespace ridgescope::sources {

// Sets which files are library code (skipped when looking for the user's frame): the core's rule
// (csrc/core/util/library_files.h) with this machine's directories, files under
// `library_roots` (torch, ridgescope, Inductor's cache) and under `stdlib_roots` except
// third-party packages installed inside them (site-packages, dist-packages). Checks the walker
// against the public API on this thread and installs it (set_python_frame_walker). Returns ""
// when Python frames are read, else why not. Needs the GIL.
std::string configure_python_frames(const std::vector<std::string>& library_roots,
                                    const std::vector<std::string>& stdlib_roots);

}  // namespace ridgescope::sources
