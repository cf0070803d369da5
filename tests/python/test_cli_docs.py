"""docs/cli.md is generated from the argument parser (python/ridgescope/cli/_docgen.py), so it
cannot drift from the program: this test fails when they differ."""
from __future__ import annotations

import runpy
import sys

import pytest

from conftest import ROOT
from ridgescope.cli._docgen import generate

REGENERATE = ".venv/bin/python -m ridgescope.cli._docgen > docs/cli.md"


def test_docs_cli_md_is_what_the_parser_generates():
    on_disk = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert on_disk == generate(), (
        f"docs/cli.md is out of date with the argument parser; regenerate it with `{REGENERATE}` "
        "(from the repository root) and commit the result")


def test_every_subcommand_and_option_is_on_the_page():
    from ridgescope.cli import _COMMANDS, build_parser
    text = generate()
    for name in _COMMANDS:
        assert f"## ridgescope {name}\n" in text
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, parser in sub.choices.items():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in text, f"{name} {flag} is missing from docs/cli.md"


def test_the_generator_runs_as_a_module(capsys, monkeypatch):
    """`python -m ridgescope.cli._docgen` (its `__main__` block, run here by runpy) prints the
    page and exits 0."""
    monkeypatch.setattr(sys, "argv", ["_docgen.py"])
    monkeypatch.delitem(sys.modules, "ridgescope.cli._docgen")  # run afresh, as -m runs it
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("ridgescope.cli._docgen", run_name="__main__", alter_sys=False)
    assert exited.value.code == 0
    assert capsys.readouterr().out == generate()
