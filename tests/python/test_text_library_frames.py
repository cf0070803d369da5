"""Specification of library frames in the text report (docs/sites.md, "Library frames"): the
report's `frames[].library` flag, decided by the core's one rule, is what the text folds by, so a
standard-library frame is skipped as a site and left out of the callers alike (before issue 23 the
capture skipped it as a site but the text report printed it as the user's caller); and
`ridgescope report --group-by stack --library-frames` prints every frame, library ones marked.

The truth is the snapshot the test builds: which file each frame is in."""
from __future__ import annotations


import pytest

import ridgescope as rs
from snapshot_builder import SnapshotBuilder
from inprocess_cli import ridgescope

STDLIB = "/usr/lib/python3.11/contextlib.py"
# innermost first: torch's functional, a `with` block of the standard library, the model, the
# interpreter's runpy, the training loop
STACK = (("torch/nn/functional.py", "linear"), (STDLIB, "__enter__"), ("/home/me/model.py", "forward"),
         ("/usr/lib/python3.11/runpy.py", "_run_code"), ("/home/me/train.py", "main"))


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    b = SnapshotBuilder()
    b.begin("forward")
    b.alloc(40960, STACK)
    b.end("forward")
    path = tmp_path_factory.mktemp("library-frames") / "snap.pickle"
    b.write(path)
    return path


def test_the_report_marks_the_standard_library_and_torch_as_library(snapshot):
    d = rs.load(snapshot).to_dict()
    by_file = {f["file"]: f for f in d["frames"]}
    assert by_file[STDLIB]["library"] and by_file["/usr/lib/python3.11/runpy.py"]["library"]
    assert by_file["/usr/lib/python3.11/site-packages/torch/nn/functional.py"]["library"]
    assert not by_file["/home/me/model.py"]["library"] and not by_file["/home/me/train.py"]["library"]
    assert by_file["/home/me/model.py"]["text"] == "model.py:12 in forward"
    assert by_file["/home/me/model.py"]["location"] == "/home/me/model.py:12 in forward"
    # the site is the innermost frame that is not library code: past torch and the stdlib
    (stack,) = [s for s in d["peak"]["stacks"] if s["frames"]]
    assert d["frames"][stack["frames"][stack["site"]]]["file"] == "/home/me/model.py"


def test_the_stack_listing_folds_library_frames_and_prints_them_on_request(snapshot):
    report = rs.load(snapshot)
    folded = report.grouped("stack")
    assert "at /home/me/model.py:12 in forward  <- site" in folded
    assert "from /home/me/train.py:14 in main" in folded
    assert "contextlib" not in folded and "runpy" not in folded and "functional.py" not in folded
    assert "(3 more frame(s) folded, library code included: --library-frames prints every one" in folded
    shown = report.grouped("stack", library_frames=True)
    listed = [line.strip() for line in shown.splitlines() if line.strip().startswith(("at ", "from "))]
    assert listed == [
        "at /usr/lib/python3.11/site-packages/torch/nn/functional.py:10 in linear  [library]",
        f"from {STDLIB}:11 in __enter__  [library]",
        "from /home/me/model.py:12 in forward  <- site",
        "from /usr/lib/python3.11/runpy.py:13 in _run_code  [library]",
        "from /home/me/train.py:14 in main"]


def test_the_command_line_flag(snapshot):
    def cli(*args):
        return ridgescope("report", str(snapshot), *args)
    done = cli("--group-by", "stack", "--library-frames")
    assert done.returncode == 0, done.stderr
    assert f"from {STDLIB}:11 in __enter__  [library]" in done.stdout
    done = cli("--library-frames")
    assert done.returncode != 0 and "--library-frames goes with --group-by stack" in done.stderr
    assert "Traceback" not in done.stderr
