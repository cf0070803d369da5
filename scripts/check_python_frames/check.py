"""Checks csrc/torch_python/python_frames.cpp on the Python running this script (docs/sites.md): the
walker's frames, read with the GIL released, equal traceback.extract_stack() taken just before,
through a generator, recursion and a method (qualified names from 3.11 on), and a site-only walk
gives the innermost frame. Run by scripts/check_python_frames.sh; exit status 0 when they agree.
Usage: python check.py DIR_WITH_THE_BUILT_HARNESS"""
import os
import sys
import sysconfig
import tempfile
import traceback
import weakref

sys.path.insert(0, sys.argv[1])
import pyframes_check as pc  # noqa: E402

problem = pc.configure([os.path.join(os.path.dirname(os.__file__), "not-a-library-dir") + os.sep],
                       [sysconfig.get_paths()["stdlib"] + os.sep])
assert problem == "", f"the walker refused this Python: {problem}"
path = tempfile.mktemp(suffix=".rstrace")


def gen():
    yield inner(1)


def inner(k):
    if k:
        return inner(k - 1)
    expected = [(f.filename, f.lineno, f.name) for f in reversed(traceback.extract_stack())]; frames, _, ok = pc.walk(path, 1)  # noqa: E702,E501
    site_line = sys._getframe().f_lineno + 1
    site = pc.walk(path, 0)[0]
    return expected, frames, ok, site, site_line


class C:
    def method(self):
        return next(gen())


expected, frames, ok, site, site_line = C().method()
os.remove(path)
got = [(f, line, name) for _, f, line, name in frames]
assert ok, "the walker read no frame"
assert [(g[0], g[1]) for g in got] == [(e[0], e[1]) for e in expected], (got, expected)
assert all(g[2] == e[2] or g[2].endswith("." + e[2]) for g, e in zip(got, expected)), (got, expected)
if sys.version_info >= (3, 11):
    assert "C.method" in [g[2] for g in got], got
assert site == [("python", __file__, site_line, "inner")], site
print(f"python {sys.version.split()[0]}: {len(got)} frames read without the GIL, equal to the "
      "interpreter's; the site-only walk gives the innermost frame")


# The locals reader (python_locals.h): on 3.11 and 3.12 it reads a running frame's locals in place,
# and what it read is not kept by the frame (a local dropped after the read is freed at once);
# elsewhere it reads none (3.13's f_locals keeps no snapshot; 3.10 is not mirrored).
def locals_probe(alpha, beta):
    gamma = [alpha]

    def nested():
        return gamma
    unbound = 1
    del unbound

    class Held:
        pass
    held = Held()
    alive = weakref.ref(held)
    pairs = pc.frame_locals(sys._getframe())
    if pairs is None:
        return None, alive
    read = dict(pairs)
    right = (read["alpha"] is alpha and read["beta"] is beta and read["gamma"][0] is alpha
             and read["nested"] is nested and read["held"] is held and "unbound" not in read)
    del pairs, read
    del held
    return right, alive


right, alive = locals_probe(object(), object())
if sys.version_info[:2] in ((3, 11), (3, 12)):
    assert right is True, "the locals reader read the frame wrong"
    assert alive() is None, "the frame kept a local alive after the locals were read"
    print(f"python {sys.version.split()[0]}: frame locals read in place, none kept alive")
else:
    assert right is None, "the locals reader should read no frame on this Python"
    print(f"python {sys.version.split()[0]}: the locals reader reads none (as designed)")
