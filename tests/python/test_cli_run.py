"""Specification of `ridgescope run SCRIPT`: an unmodified script is tracked with the same
figures as `rs.track`, its stdout and exit code are preserved, and a script that raises still
leaves a trace and a report."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ridgescope as rs
from ridgescope.cli import main as cli_main

from run_once import once

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPT = EXAMPLES / "train_plain.py"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ridgescope.cli", "run", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def phases(r, name):
    return [p for s in r["steps"] for p in s["phases"] if p["phase"] == name]


def _three_ways(folder: Path) -> dict[str, dict]:
    """The example (2 steps, exit code 3) run as a plain script, as `ridgescope run SCRIPT` (the
    console script) and as `python -m ridgescope run SCRIPT`, each in a fresh directory."""
    console = Path(sys.executable).with_name("ridgescope")
    if not console.exists():
        console = Path(shutil.which("ridgescope") or "ridgescope")
    args = [str(SCRIPT), "--steps", "2", "--exit-code", "3"]
    results = {}
    for name, cmd in (("plain", [sys.executable, *args]), ("console", [str(console), "run", *args]),
                      ("module", [sys.executable, "-m", "ridgescope", "run", *args])):
        (folder / name).mkdir()
        done = subprocess.run(cmd, cwd=folder / name, capture_output=True, text=True, timeout=300)
        results[name] = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    return results


@pytest.fixture(scope="module")
def three_ways(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    """The three runs, once for both pytest workers (tests/python/run_once.py)."""
    return once(tmp_path_factory, "cli-run", _three_ways)


def test_an_unmodified_script_gets_the_same_bytes_as_rs_track(three_ways, tmp_path):
    folder, _ = three_ways
    cli = rs.load(folder / "module" / "train_plain.rstrace").to_dict()

    sys.path.insert(0, str(EXAMPLES))
    try:
        import train_plain
        model, opt = train_plain.build()
        with rs.track(model=model, optimizer=opt, out=tmp_path / "api.rstrace") as s:
            train_plain.train(model, opt, 2)
        api = s.report().to_dict()
    finally:
        sys.path.remove(str(EXAMPLES))

    p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert cli["model"]["parameters"] == api["model"]["parameters"]
    assert cli["model"]["class"] == "TinyGPT" and cli["optimizer"]["type"] == "AdamW"
    assert cli["peak"]["by_category"]["parameter"] == api["peak"]["by_category"]["parameter"] == p_bytes
    for a, b in zip(phases(cli, "backward"), phases(api, "backward"), strict=True):
        assert a["end_by_category"]["gradient"] == b["end_by_category"]["gradient"] == p_bytes
    for a, b in zip(phases(cli, "optimizer_step"), phases(api, "optimizer_step"), strict=True):
        assert a["end_by_category"]["optimizer_state"] == b["end_by_category"]["optimizer_state"]
    assert cli["consistency"]["mismatches"] == 0


def test_stdout_exit_code_and_trace_are_the_same_under_either_command(three_ways):
    """Given the same script run plain, as `ridgescope run SCRIPT` (the console script) and as
    `python -m ridgescope run SCRIPT`, then both commands give the script's exit code and the
    script's stdout, the same report lines on stderr, and the same trace."""
    folder, runs = three_ways
    plain, console_run, module_run = runs["plain"], runs["console"], runs["module"]
    assert plain["returncode"] == console_run["returncode"] == module_run["returncode"] == 3, \
        module_run["stderr"]
    assert module_run["stdout"] == console_run["stdout"] == plain["stdout"]
    assert "step 1: loss" in plain["stdout"]
    assert module_run["stderr"] == console_run["stderr"] and "ridgescope: peak" in module_run["stderr"]
    assert "ridgescope: trace" in module_run["stderr"]
    assert not list((folder / "plain").iterdir())  # untracked: nothing written
    a = rs.load(folder / "console" / "train_plain.rstrace").to_dict()
    b = rs.load(folder / "module" / "train_plain.rstrace").to_dict()
    assert a["peak"]["bytes"] == b["peak"]["bytes"] and a["peak"]["by_category"] == b["peak"]["by_category"]


def test_a_script_that_raises_still_leaves_a_trace_and_a_report(tmp_path):
    out = run_cli(str(SCRIPT), "--steps", "1", "--fail", cwd=tmp_path)
    assert out.returncode == 1
    assert "RuntimeError: the script failed on purpose" in out.stderr
    r = rs.load(tmp_path / "train_plain.rstrace").to_dict()
    assert len(r["steps"]) == 1 and r["steps"][0]["complete"]
    html = (tmp_path / "train_plain.html").read_text(encoding="utf-8")  # the HTML report too
    embedded = re.search(r'<script type="application/json" id="rs-data">(.*?)</script>', html, re.S)
    assert embedded and json.loads(embedded.group(1))["peak"]["bytes"] == r["peak"]["bytes"]


def test_a_missing_script_is_one_line(tmp_path, capsys):
    assert cli_main(["run", str(tmp_path / "nope.py")]) == 1
    assert capsys.readouterr().err.strip() == f"ridgescope run: error: no such script: {tmp_path / 'nope.py'}"


def test_under_torchrun_each_rank_writes_its_own_trace(tmp_path):
    """Given two ranks launched as torchrun launches them (the same command line, WORLD_SIZE=2
    and RANK set), when both run at once in the same directory, then each writes its own
    trace and HTML report (one shared file would be torn by two writers), and both are whole."""
    import os
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-m", "ridgescope.cli", "run", str(SCRIPT),
                                       "--steps", "2"], cwd=tmp_path, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert not (tmp_path / "train_plain.rstrace").exists()
    for rank in (0, 1):
        r = rs.load(tmp_path / f"train_plain.rank{rank}.rstrace").to_dict()
        assert [s["complete"] for s in r["steps"]] == [True, True]
        assert r["trace"]["truncated"] is False
        assert (tmp_path / f"train_plain.rank{rank}.html").exists()


def test_the_per_rank_name_rules():
    from ridgescope._session import per_rank_path
    one = {"WORLD_SIZE": "1", "RANK": "0"}
    four = {"WORLD_SIZE": "4", "RANK": "3"}
    assert per_rank_path(Path("run.rstrace"), {}) == Path("run.rstrace")
    assert per_rank_path(Path("run.rstrace"), one) == Path("run.rstrace")
    assert per_rank_path(Path("out/run.rstrace"), four) == Path("out/run.rank3.rstrace")
    assert per_rank_path(Path("out/r{rank}.rstrace"), four) == Path("out/r3.rstrace")
    assert per_rank_path(Path("run"), four) == Path("run.rank3.rstrace")
    assert per_rank_path(Path("run.rstrace"), {"WORLD_SIZE": "x", "RANK": "1"}) == Path("run.rstrace")


def test_rs_track_names_the_trace_per_rank_too(tmp_path, monkeypatch):
    """The same rule holds for rs.track(out=...) in a script torchrun launches."""
    import torch
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with rs.track(out=tmp_path / "run.rstrace") as s:
        torch.ones(1024)
    assert s.path == tmp_path / "run.rank1.rstrace" and s.path.exists()
    assert not (tmp_path / "run.rstrace").exists()
