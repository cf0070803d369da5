"""Byte formatting has one rule (csrc/core/util/format_bytes.h): C++ prints it in the reports'
texts, Python calls it (``_C.format_bytes``, through ``ridgescope._format.format_bytes``), and
the HTML pages carry one JavaScript copy (``_reporters/_html_assets/common.js``) shared by the
single-run page and the ranks page. These tests hold the copy to the rule: the same table of
values rendered by C++ and by the page's script gives the same strings.

The script runs in Node when it is installed, else in the Chromium the HTML tests drive
(scripts/setup.sh --tests installs it and Python's playwright)."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from importlib import resources

import pytest

from ridgescope import _C
from ridgescope._format import format_bytes
from ridgescope._reporters._html import RANKS_SCRIPTS, REPORT_SCRIPTS

CHROMIUM = os.environ.get("RIDGESCOPE_CHROMIUM", "/usr/bin/chromium")
KiB, MiB, GiB, TiB, PiB = (1 << (10 * i) for i in range(1, 6))

# Each unit's edges, the decimal places' edges (10 and 100 of a unit, 1023.99... rounding up to
# "1024"), values whose decimal is an exact tie (1.125 KiB, 10.25 KiB: printf rounds ties to
# even, JavaScript's toFixed would round them up), powers of ten, and the top of uint64.
TABLE = [0, 1, 1023, 1024, 1025, 1152, 1408, 1536, 10 * KiB - 1, 10 * KiB, 10496, 100 * KiB - 1,
         100 * KiB, 1048575, MiB, 10**6, 10**9, 10**12, GiB, 3 * GiB // 2, 5 * TiB, PiB,
         1023 * PiB, 1 << 60, 1 << 63, (1 << 64) - 1]


def _sample() -> list[int]:
    """The table and 3,000 values spread over every magnitude (a fixed seed: the same values on
    every run), a third of them exact ties of their last decimal."""
    rng = random.Random(22)
    values = list(TABLE)
    for _ in range(3000):
        if rng.random() < 0.34:
            # A tie in the last decimal, exactly: odd eighths of a unit below 10 (x.xx5), odd
            # quarters from 10 to 100 (xx.x5), odd halves from 100 to 1024 (xxx.5).
            unit = 1 << (10 * rng.randrange(1, 6))
            low, high, parts = rng.choice(((1, 10, 8), (10, 100, 4), (100, 1024, 2)))
            values.append((2 * rng.randrange(low * parts // 2, high * parts // 2) + 1) * unit // parts)
        else:
            values.append(rng.randrange(0, 1 << rng.randrange(1, 64)))
    return values


def _common_js() -> str:
    return resources.files("ridgescope._reporters").joinpath("_html_assets", "common.js").read_text()


def _render_in_javascript(values: list[int]) -> list[str]:
    """fmtBytes of common.js over ``values`` (sent as JSON numbers, as a page receives them)."""
    program = ("(function () {\n'use strict';\n" + _common_js() +
               "\nreturn JSON.stringify(VALUES.map(fmtBytes));\n})()")
    data = json.dumps(values)
    node = shutil.which("node")
    if node:
        script = f"const VALUES = {data};\nconsole.log({program});\n"
        out = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None or shutil.which(CHROMIUM) is None:
        pytest.skip("needs node, or Python's playwright and chromium (scripts/setup.sh --tests)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            return json.loads(page.evaluate(f"(() => {{ const VALUES = {data}; return {program}; }})()"))
        finally:
            browser.close()


def test_the_pages_script_prints_every_value_as_cpp_does():
    """Given the table (unit edges, decimal edges, exact ties, uint64's top) and 3,000 sampled
    values, when C++ (_C.format_bytes) and the pages' fmtBytes render them, then every string
    is the same."""
    values = _sample()
    cpp = [_C.format_bytes(v) for v in values]
    js = _render_in_javascript(values)
    differ = [(v, c, j) for v, c, j in zip(values, cpp, js) if c != j]
    assert not differ, f"{len(differ)} of {len(values)} differ, e.g. (value, C++, JS): {differ[:5]}"


def test_the_rule_as_cpp_decides_it():
    """The rule itself, value by value (what both sides print). The decimals are chosen from
    the value before it is rounded: 10 KiB - 1 byte is "10.00 KiB", 100 KiB - 1 "100.0 KiB"."""
    assert [_C.format_bytes(v) for v in TABLE] == [
        "0 B", "1 B", "1023 B", "1.00 KiB", "1.00 KiB", "1.12 KiB", "1.38 KiB", "1.50 KiB",
        "10.00 KiB", "10.0 KiB", "10.2 KiB", "100.0 KiB", "100 KiB", "1024 KiB", "1.00 MiB",
        "977 KiB", "954 MiB", "931 GiB", "1.00 GiB", "1.50 GiB", "5.00 TiB", "1.00 PiB",
        "1023 PiB", "1024 PiB", "8192 PiB", "16384 PiB"]


def test_python_formats_through_cpp_and_signs_a_negative_count():
    """Python's format_bytes is C++'s; a negative count (a difference) is its magnitude with a
    minus sign, in Python and in the pages alike."""
    for v in TABLE:
        assert format_bytes(v) == _C.format_bytes(v)
    assert format_bytes(-1536) == "-1.50 KiB"
    assert _render_in_javascript([-1536, -5]) == ["-1.50 KiB", "-5 B"]


def test_both_pages_carry_the_one_copy():
    """Both pages' scripts start with common.js, and no other asset defines a byte formatter."""
    assert REPORT_SCRIPTS[0] == RANKS_SCRIPTS[0] == "common.js"
    assets = resources.files("ridgescope._reporters").joinpath("_html_assets")
    defining = sorted(f.name for f in assets.iterdir()
                      if f.name.endswith(".js") and "function fmtBytes" in f.read_text())
    assert defining == ["common.js"]
