"""What users read, pinned: the text report and the report JSON of a fixed trace
(tests/data/golden_run.*, written by tests/python/golden.py; its docstring describes the run).
A change to what ridgescope prints for that trace fails here until the files are regenerated:

    .venv/bin/python tests/python/golden.py --update

and the diff of tests/data/golden_run.txt (and .json) is then part of the change, for review."""
from __future__ import annotations

import golden

HOW = "regenerate with `.venv/bin/python tests/python/golden.py --update` and review the diff"


def test_the_committed_trace_is_what_the_generator_writes(tmp_path):
    """Given the generator, when it writes the trace again, then the bytes are the committed
    ones (the trace is a fixed input: no clock, no torch op, no machine in it)."""
    trace = tmp_path / golden.TRACE.name
    golden.write_trace(trace)
    assert trace.read_bytes() == golden.TRACE.read_bytes(), f"the golden trace changed: {HOW}"


def test_the_text_report_of_the_golden_trace_is_the_committed_text():
    """Given the committed trace, when ridgescope reads it, then Report.summary() prints
    tests/data/golden_run.txt to the byte."""
    text, _ = golden.render(golden.TRACE)
    assert text == golden.TEXT.read_text(), f"the text report changed: {HOW}\n" + "\n".join(golden.differences())


def test_the_report_json_of_the_golden_trace_is_the_committed_json():
    _, data = golden.render(golden.TRACE)
    assert data == golden.JSON.read_text(), f"the report JSON changed: {HOW}"
