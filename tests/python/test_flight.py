"""Specification of the flight recorder (docs/long-runs.md): ``keep_steps`` bounds a trace to a
summary of every step and the events of the steps that matter, and what it keeps is what a full
trace of the same run says.

The same-run comparisons record one run in full (its summaries written by the recording side)
and re-record that trace through the flight recorder (``_C.compact_trace``, the same sink the
live recording uses), so both summarise the very same events."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ridgescope as rs
from ridgescope import _C
from ridgescope._flight import ENV, parse_keep_steps, resolve_keep_steps
from ridgescope._saved_hooks import NEW_SHAPES_MARK

from inprocess_cli import ridgescope
from run_once import once

ROOT = Path(__file__).resolve().parents[2]

# A small MLP trained for STEPS steps; step PEAK_STEP takes a batch 16 times larger (the highest
# peak, far from the end), step MARK_STEP is marked. Steps are counted at each optimizer step:
# the mark, made after the optimizer step of loop iteration MARK_STEP - 1, falls in MARK_STEP.
STEPS, PEAK_STEP, MARK_STEP = 600, 200, 400
SCRIPT = f"""
import sys
import torch
import ridgescope as rs

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
small = (torch.randn(16, 32), torch.randint(0, 8, (16,)))
large = (torch.randn(256, 32), torch.randint(0, 8, (256,)))
for step in range({STEPS}):
    x, y = large if step == {PEAK_STEP} else small
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if step == {MARK_STEP} - 1:
        rs.mark("eval")
"""


def run_script(tmp_path: Path, keep_steps: str, name: str) -> Path:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{name}.rstrace"
    done = subprocess.run([sys.executable, "-m", "ridgescope", "run", "--keep-steps", keep_steps, "-o", str(out),
                           str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _full_and_bounded(tmp: Path) -> tuple[Path, Path]:
    full = run_script(tmp, "all", "full")
    bounded = tmp / "bounded.rstrace"
    _C.compact_trace(str(full), str(bounded), 10, 64 * 1024)  # rewritten many times on the way
    return full, bounded


@pytest.fixture(scope="module")
def full_and_bounded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path, Path]:
    """The full run and its bounded re-recording, once for both pytest workers
    (tests/python/run_once.py)."""
    full, bounded = once(tmp_path_factory, "flight", _full_and_bounded)[1]
    return rs.load(full).to_dict(), rs.load(bounded).to_dict(), full, bounded


def glance_rows(report: dict) -> str:
    g = report["at_a_glance"]
    return json.dumps({"columns": g["columns"], "rows": g["rows"], "marks": g["marks"]})


def test_keep_steps_values_and_where_they_come_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given keep_steps as a count or 'all', then it reads as that count or 0 (all); anything
    else is a clear error. Then an explicit value wins over $RIDGESCOPE_KEEP_STEPS, which wins
    over the entry point's default."""
    assert [parse_keep_steps(v) for v in (1, 20, "20", " All ", "all")] == [1, 20, 20, 0, 0]
    for bad in (0, -3, "ten", "", True, 2.5):
        with pytest.raises(ValueError, match="positive number of steps or 'all'"):
            parse_keep_steps(bad)  # type: ignore[arg-type]
    monkeypatch.delenv(ENV, raising=False)
    assert (resolve_keep_steps(None, 20), resolve_keep_steps(None, "all"), resolve_keep_steps(5, 20)) == (20, 0, 5)
    monkeypatch.setenv(ENV, "7")
    assert (resolve_keep_steps(None, 20), resolve_keep_steps(None, "all"), resolve_keep_steps("all", 20)) == (7, 7, 0)
    monkeypatch.setenv(ENV, "lots")
    with pytest.raises(ValueError, match=ENV):
        resolve_keep_steps(None, 20)
    with pytest.raises(ValueError, match="ridgescope.track: keep_steps"):
        rs.track(keep_steps=0)


def test_the_summaries_of_every_step_equal_those_of_the_full_trace(full_and_bounded) -> None:
    """Given a run recorded in full and the same events kept bounded (keep_steps 10), then every
    step has a summary in both and the per-step rows are the same, byte for byte."""
    full, bounded, full_path, bounded_path = full_and_bounded
    assert full["at_a_glance"]["recorded"] and bounded["at_a_glance"]["recorded"]
    assert bounded["at_a_glance"]["keep_steps"] == 10 and full["at_a_glance"]["keep_steps"] is None
    assert full["at_a_glance"]["steps"] >= STEPS
    assert glance_rows(bounded) == glance_rows(full)
    # and the bounded trace is several times smaller: it grows by a step's summary (~200 B) where
    # the full one grows by the step's events (~2.5 KB here, host readings included)
    assert bounded_path.stat().st_size * 8 < full_path.stat().st_size


def test_the_highest_peak_far_from_the_end_is_kept_and_analysed_as_in_the_full_trace(full_and_bounded) -> None:
    """Given the highest peak in step 200 of 600, then the bounded trace keeps the first two steps
    (the saved-tensor hook's), steps 199-201 (the peak, whose new batch shape brings the hook back
    and marks the step), the marked step with its neighbours and the last ten steps, and its peak
    (bytes, step, phase, composition, blocks, labels, sites) is the full trace's."""
    full, bounded, _, _ = full_and_bounded
    g = bounded["at_a_glance"]
    windows = [(w["first_step"], w["last_step"], w["reasons"]) for w in g["windows"]]
    assert windows[0] == (0, 1, ["first_steps"])  # the saved-tensor hook's steps
    # The peak step's batch is new: the hook runs again in it and marks it (_saved_hooks.py).
    assert windows[1] == (PEAK_STEP - 1, PEAK_STEP + 1, ["highest_peak", "mark"])
    assert windows[2] == (MARK_STEP - 1, MARK_STEP + 1, ["mark"])
    assert windows[3][1] - windows[3][0] + 1 >= 10 and windows[3][2] == ["last_steps"]
    assert g["max_peak_step"] == full["peak"]["step"] == bounded["peak"]["step"] == PEAK_STEP
    assert g["marks"] == [[PEAK_STEP, NEW_SHAPES_MARK], [MARK_STEP, "eval"]]
    for key in ("bytes", "reserved_bytes", "phase", "phase_stack", "by_category", "inferred_by_category",
                "by_label", "by_site"):
        assert bounded["peak"][key] == full["peak"][key], key
    strip = lambda blocks: [{k: v for k, v in b.items() if k != "address"} for b in blocks]  # noqa: E731
    assert strip(bounded["peak"]["top_blocks"]) == strip(full["peak"]["top_blocks"])
    # And the kept steps' statistics, phase by phase, are the full trace's.
    by_step = {s["step"]: s for s in full["steps"]}
    for s in bounded["steps"]:
        f = by_step[s["step"]]
        assert (s["peak_bytes"], s["peak_by_category"], s["end_by_category"]) == \
               (f["peak_bytes"], f["peak_by_category"], f["end_by_category"])
        assert [(p["phase"], p["peak_bytes"], p["peak_by_category"]) for p in s["phases"]] == \
               [(p["phase"], p["peak_bytes"], p["peak_by_category"]) for p in f["phases"]]


def test_the_report_opens_with_the_run_at_a_glance(full_and_bounded) -> None:
    """Then the text report of the bounded trace opens with the run at a glance: every step
    summarised, the peak step and the mark among the steps that stand out, the kept windows;
    and the JSON costs under 200 bytes per summarised step."""
    _, bounded, _, bounded_path = full_and_bounded
    text = rs.load(bounded_path).summary()
    glance = text[text.index("The run at a glance"):text.index("Peak:")]
    assert f"highest {_C.format_bytes(bounded['at_a_glance']['max_peak_bytes'])} in step {PEAK_STEP}" in glance
    assert f"step {PEAK_STEP} " in glance and "marked 'eval'" in glance
    assert f"{PEAK_STEP - 1}-{PEAK_STEP + 1} (highest peak, marked)" in glance
    rows = json.dumps(bounded["at_a_glance"]["rows"], separators=(",", ":"))
    assert len(rows) / bounded["at_a_glance"]["steps"] < 200


def test_a_live_bounded_run_keeps_every_summary_and_the_peak_step(tmp_path: Path) -> None:
    """Given `ridgescope run --keep-steps 5` on the same script, then its trace is bounded: a
    summary of every step, the events of the first two steps (the saved-tensor hook's), of the
    peak step and its neighbours (its new batch shape marks it), of the mark's steps and of the
    last five; the peak is in step 200."""
    report = rs.load(run_script(tmp_path, "5", "live")).to_dict()
    g = report["at_a_glance"]
    assert g["keep_steps"] == 5 and g["steps"] >= STEPS
    assert [s["step"] for s in report["steps"]][:8] == [0, 1, PEAK_STEP - 1, PEAK_STEP, PEAK_STEP + 1,
                                                        MARK_STEP - 1, MARK_STEP, MARK_STEP + 1]
    assert g["windows"][0]["first_step"] == 0 and g["windows"][0]["reasons"] == ["first_steps"]
    assert report["peak"]["step"] == PEAK_STEP and g["max_peak_step"] == PEAK_STEP
    assert len(report["timeline"]["gaps"]["from_ns"]) == 3


def test_the_json_report_keeps_each_steps_row_on_one_line(full_and_bounded) -> None:
    """Then the JSON text of the bounded report (`ridgescope report --format json`) reads back
    as the report itself, indented, except each per-step row of the run at a glance, which is
    one compact line."""
    _, bounded, _, _ = full_and_bounded
    text = rs.Report(bounded).to_json()
    assert json.loads(text) == bounded
    lines = {line.strip().rstrip(",") for line in text.splitlines()}
    rows = bounded["at_a_glance"]["rows"]
    assert len(rows) >= STEPS
    assert all(json.dumps(r, separators=(",", ":")) in lines for r in rows)
    assert '  "at_a_glance": {' in text.splitlines()


def test_ridgescope_compact_makes_a_full_trace_bounded_and_refuses_bad_input(full_and_bounded, tmp_path: Path) -> None:
    """Given the full trace, when `ridgescope compact -o OUT --keep-steps 10` re-records it, then
    OUT keeps the same windows and per-step rows as the bounded trace; a bad count, a missing
    trace or OUT the input itself fail with one line naming the problem."""
    full, bounded, full_path, _ = full_and_bounded
    out = tmp_path / "compacted.rstrace"

    def compact(*args: str) -> subprocess.CompletedProcess:
        return ridgescope("compact", *args)

    done = compact(str(full_path), "-o", str(out), "--keep-steps", "10")
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}: " in done.stderr and " steps summarised, " in done.stderr
    r = rs.load(out).to_dict()
    assert glance_rows(r) == glance_rows(full)
    assert r["at_a_glance"]["windows"] == bounded["at_a_glance"]["windows"]
    for args, message in (((str(full_path), "-o", str(out), "--keep-steps", "ten"), "--keep-steps"),
                          ((str(tmp_path / "none.rstrace"), "-o", str(out)), "no such trace"),
                          ((str(full_path), "-o", str(full_path)), "another file than the full one")):
        bad = compact(*args)
        assert bad.returncode == 1 and bad.stderr.startswith("ridgescope compact: error:") and message in bad.stderr, \
            bad.stderr
