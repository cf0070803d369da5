"""Field trials: small training scripts written the way each library's own examples write them,
run unmodified under ``ridgescope run`` (scripts/, one per kind of script that holds more than
one model).

Scenario, for each script: it runs once untracked and once under ``ridgescope run``, in this
process (importing diffusers, transformers and PEFT once keeps the suite within its budget).
Truth: the script writes, from the modules themselves, the bytes of each model's parameter and
buffer storages (scripts/field_truth.py), under the name the code gives the model.
Then: the losses it prints are the same, bit for bit (a float's repr is exact); the report
lists exactly those models under those names, each with its parameter and buffer bytes
measured at the peak equal to the truth, its frozen parameters labelled ``(frozen)`` and its
``trainable`` flag right; and ``unknown`` is under 1 % of the peak."""
from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
from pathlib import Path

import pytest

import ridgescope as rs
from ridgescope.cli import main as cli_main

SCRIPTS = Path(__file__).resolve().parent / "scripts"

# script -> the Python packages it needs beyond torch
TRIALS = {
    "ddpm_ema.py": ("diffusers", "accelerate"),
    "dpo_reference.py": ("transformers",),
    "distill_teacher.py": (),
    "text_to_image_lora.py": ("diffusers", "transformers", "peft"),
}


@contextlib.contextmanager
def script_environment(script: Path):
    """What running `python script.py` gives a script: argv, its folder on sys.path."""
    argv, path = sys.argv, list(sys.path)
    sys.argv = [str(script)]
    sys.path.insert(0, str(script.parent))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = argv, path


def run_plain(script: Path) -> str:
    out = io.StringIO()
    with script_environment(script), contextlib.redirect_stdout(out):
        runpy.run_path(str(script), run_name="__main__")
    return out.getvalue()


def run_tracked(script: Path, trace: Path) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["run", "-o", str(trace), str(script)])
    assert code == 0, err.getvalue()
    assert "ridgescope stopped recording" not in err.getvalue(), err.getvalue()
    return out.getvalue()


@pytest.fixture(scope="module", params=sorted(TRIALS))
def trial(request, tmp_path_factory):
    name = request.param
    for package in TRIALS[name]:
        pytest.importorskip(package)
    script = SCRIPTS / name
    tmp = tmp_path_factory.mktemp(Path(name).stem)
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("RIDGESCOPE_FIELD_TRUTH", str(tmp / "truth_plain.json"))
        plain = run_plain(script)
        mp.setenv("RIDGESCOPE_FIELD_TRUTH", str(tmp / "truth.json"))
        tracked = run_tracked(script, tmp / "run.rstrace")
    finally:
        mp.undo()
    truth = json.loads((tmp / "truth.json").read_text())
    report = rs.load(tmp / "run.rstrace", top_blocks=100_000).to_dict()  # every block
    return name, plain, tracked, truth, report


def losses(stdout: str) -> list[str]:
    """The script's loss lines (printed with repr: every bit). Other output can differ between
    the two in-process runs for reasons outside the script: a library imported by the first run
    (DeepSpeed, through accelerate, when installed) logs its start-up only once per process."""
    return [line for line in stdout.splitlines() if "loss" in line]


def test_losses_are_bitwise_identical_to_the_untracked_run(trial):
    name, plain, tracked, *_ = trial
    assert len(losses(plain)) >= 3
    assert losses(tracked) == losses(plain)


def test_every_model_is_listed_by_its_name_with_its_exact_bytes(trial):
    name, _, _, truth, report = trial
    models = {m["name"]: m for m in report["model"]["models"]}
    assert sorted(models) == sorted(truth), f"{name}: listed {sorted(models)}"
    for model_name, t in truth.items():
        m = models[model_name]
        assert m["at_peak"]["parameter_bytes"] == t["parameter_bytes"], (name, model_name)
        assert m["at_peak"]["buffer_bytes"] == t["buffer_bytes"], (name, model_name)
        assert m["parameter_bytes"] == t["parameter_bytes"], (name, model_name)
        assert m["parameters"] == t["parameters"], (name, model_name)
        assert m["trainable"] is t["trainable"], (name, model_name)
    parameter_truth = sum(t["parameter_bytes"] for t in truth.values())
    assert report["peak"]["by_category"]["parameter"] == parameter_truth


def test_each_parameter_block_is_labelled_with_its_model_and_says_whether_it_is_frozen(trial):
    """Every `parameter` block live at the peak belongs, by its label, to one listed model (the
    one whose `label_prefix` it starts with, else the tracked model); summed per model, they are
    the truth; a frozen model's labels end with " (frozen)"."""
    name, _, _, truth, report = trial
    models = report["model"]["models"]
    by_model = {m["name"]: [] for m in models}
    for b in report["peak"]["top_blocks"]:
        if b["category"] != "parameter":
            continue
        owners = [m for m in models if m["label_prefix"] and b["label"].startswith(m["label_prefix"])]
        owner = owners[0] if owners else next(m for m in models if not m["label_prefix"])
        by_model[owner["name"]].append(b)
    for model_name, t in truth.items():
        blocks = by_model[model_name]
        assert sum(b["bytes"] for b in blocks) == t["parameter_bytes"], (name, model_name)
        if not t["trainable"]:
            assert all(b["label"].endswith(" (frozen)") for b in blocks), (name, model_name)


def test_unknown_is_under_one_percent_of_the_peak(trial):
    name, _, _, _, report = trial
    peak = report["peak"]
    assert peak["by_category"]["unknown"] < 0.01 * peak["bytes"], (name, peak["by_category"])
