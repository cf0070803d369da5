"""Specification of the pytest plugin (python/pytest_ridgescope.py), run the way a user runs it:
pytest on a sample test file (through ``pytester``), the plugin found through its ``pytest11``
entry point, not named anywhere.

Scenario: a sample test file runs a small MLP's forward and backward under
``@pytest.mark.ridgescope(...)``: with a generous limit it passes; with a tight one it fails, and
the message names the category, its bytes (equal to the trace's report) and the limit, then the
composition at the peak and the largest blocks."""
from __future__ import annotations

import re
import textwrap

import pytest

import ridgescope as rs

pytest_plugins = ["pytester"]

SAMPLE = textwrap.dedent('''
    import pytest
    import torch


    def one_step():
        torch.manual_seed(0)
        layers = [m for _ in range(4) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())]
        model = torch.nn.Sequential(*layers)
        model(torch.randn(2048, 64)).square().mean().backward()  # 512 KiB per saved activation


    @pytest.mark.ridgescope(peak="64MiB", activation="32MiB", unknown="1%")
    def test_generous():
        one_step()


    @pytest.mark.ridgescope(peak="64MiB", activation="256KiB")
    def test_tight():
        one_step()
''')


def test_the_marker_passes_under_a_generous_limit_and_fails_under_a_tight_one(pytester):
    """Given the sample file, then the generous test passes and the tight one fails with the
    category, its bytes and the limit, the composition at the peak and the largest blocks."""
    pytester.makepyfile(test_sample=SAMPLE)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    match = re.search(r"activation at the peak: \S+ \S+ \(([\d,]+) bytes\) exceeds the limit of "
                      r"256 KiB \(262,144 bytes\)", out)
    assert match, out
    trace = re.search(r"Trace: (\S+\.rstrace)", out).group(1)
    peak = rs.load(trace).peak
    # the bytes named are the report's own
    assert int(match.group(1).replace(",", "")) == peak["by_category"]["activation"] > 262144
    assert "Peak: " in out and f"({peak['bytes']:,} bytes) live in step 0, during" in out
    for category, value in peak["by_category"].items():
        if value:
            assert re.search(rf"\n\s+{category}\s+.*\({value:,} bytes\)", out), category
    assert "Largest blocks live at the peak:" in out
    assert re.search(r"512 KiB  activation\s+activation saved in 1 ", out)  # with their names
    result.stdout.fnmatch_lines(["*FAILED test_sample.py::test_tight*"])


def test_the_fixture_is_the_tests_session(pytester):
    """Given a test that takes ``ridgescope_session``, then its body runs tracked and the
    report is exact (parameter bytes as torch counts them)."""
    pytester.makepyfile(test_fixture=textwrap.dedent('''
        import torch

        def test_exact(ridgescope_session):
            assert ridgescope_session.active
            model = torch.nn.Linear(128, 64)
            model(torch.randn(8, 128)).sum().backward()
            report = ridgescope_session.report()
            expected = sum(p.numel() * p.element_size() for p in model.parameters())
            assert report.to_dict()["model"]["parameter_bytes"] == expected
            assert report.to_dict()["totals"]["final_by_category"]["gradient"] == expected

        def test_untracked_without_it():
            import ridgescope as rs
            assert rs.active_session() is None
    '''))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_a_bad_limit_is_an_error_that_names_it(pytester):
    """Given a limit on a category that does not exist, or a malformed size, then the test
    errors in set-up naming the problem, and its body never runs."""
    pytester.makepyfile(test_bad=textwrap.dedent('''
        import pytest

        @pytest.mark.ridgescope(activations="1MiB")
        def test_unknown_key():
            raise AssertionError("never runs")

        @pytest.mark.ridgescope(peak="lots")
        def test_bad_size():
            raise AssertionError("never runs")
    '''))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*unknown limit 'activations'; use peak or a category*",
                                 "*peak: not a size: 'lots'*"])
    assert "never runs" not in result.stdout.str()


def test_it_works_under_pytest_xdist(pytester):
    """Given the sample file run by two xdist workers, then the outcomes are the same."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_sample=SAMPLE)
    result = pytester.runpytest("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*activation at the peak: * bytes) exceeds the limit of 256 KiB*"])
