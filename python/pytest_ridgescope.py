"""The pytest plugin: memory limits on a test, by category (docs/integrations.md).

Registered through the ``pytest11`` entry point, so installing ridgescope is enough::

    @pytest.mark.ridgescope(peak="64MiB", activation="32MiB", unknown="1%")
    def test_training_step_fits():
        train_one_step(model, optimizer, batch)

The test's call (not its fixtures' set-up) runs under ``rs.track()``; when it passes, its peak
is checked against each limit, and the test fails with a message that names the category, its
bytes and the limit, followed by the composition at the peak and its largest blocks. A limit is
a size (bytes as an int, or a string: ``"64MiB"``, ``"1.5GB"``) or a share of the peak
(``"1%"``); ``peak`` limits the peak's live bytes, a category name (``activation``,
``optimizer_state``, ``unknown``, ...) that category's bytes in the composition at the peak.
One positional argument is the ``peak`` limit.

The ``ridgescope_session`` fixture is the test's ``rs.Session`` (the same one the marker checks
when both are used), tracking while the test's body runs, for finer assertions::

    def test_no_unknown(ridgescope_session):
        train_one_step(model, optimizer, batch)
        report = ridgescope_session.report()   # stops tracking and analyses the trace
        assert report.peak["by_category"]["unknown"] == 0

The trace is written to the test's ``tmp_path`` (``ridgescope.rstrace``). Every process
tracks its own tests, so the plugin works under pytest-xdist unchanged. pytest loads the plugin
in every run of an environment where ridgescope is installed, so it is a module of its own,
outside the ``ridgescope`` package: importing it imports neither ridgescope nor torch, and a
test run that uses neither pays nothing for it (``-p no:ridgescope`` turns it off)."""
from __future__ import annotations

from typing import Any

import pytest

_SESSION = pytest.StashKey[Any]()
_LIMITS = pytest.StashKey[dict]()
MARKER_HELP = ("ridgescope(peak=None, **category_limits): fail the test when its memory peak, "
               "or a category's bytes at that peak, exceed a limit ('64MiB', bytes, or '1%' of "
               "the peak)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)


@pytest.fixture
def ridgescope_session(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """The test's tracking session (``rs.Session``): it tracks while the test's body runs;
    ``ridgescope_session.report()`` stops it and returns the ``rs.Report``."""
    import ridgescope as rs

    session = rs.track(out=tmp_path / "ridgescope.rstrace")
    request.node.stash[_SESSION] = session
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _ridgescope_marker(request: pytest.FixtureRequest) -> None:
    """A test with the marker gets the session, without naming the fixture itself; a bad
    limit is an error of the test's set-up, before anything runs."""
    marker = request.node.get_closest_marker("ridgescope")
    if marker is not None:
        request.node.stash[_LIMITS] = parse_limits(marker.args, marker.kwargs)
        request.getfixturevalue("ridgescope_session")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    session = item.stash.get(_SESSION, None)
    if session is None:
        return (yield)
    limits = item.stash.get(_LIMITS, {})
    session.start()
    try:
        result = yield
    finally:
        session.stop()
    if limits:
        message = check_limits(session.report(), limits)
        if message is not None:
            pytest.fail(message, pytrace=False)
    return result


# --------------------------------------------------------------------------------- limits
def parse_limits(args: tuple, kwargs: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """{"peak" or category: ("bytes", n) or ("share", fraction of the peak)}. Raises
    pytest.UsageError naming a bad key or value."""
    from ridgescope import CATEGORIES
    from ridgescope._format import parse_bytes

    if len(args) > 1 or (args and "peak" in kwargs):
        raise pytest.UsageError("@pytest.mark.ridgescope takes at most one positional argument, "
                                "the peak limit")
    given = dict(kwargs)
    if args:
        given["peak"] = args[0]
    limits: dict[str, tuple[str, float]] = {}
    for key, value in given.items():
        if key != "peak" and key not in CATEGORIES:
            raise pytest.UsageError(f"@pytest.mark.ridgescope: unknown limit {key!r}; use peak or "
                                    f"a category: {', '.join(CATEGORIES)}")
        if isinstance(value, str) and value.strip().endswith("%"):
            try:
                share = float(value.strip()[:-1]) / 100.0
            except ValueError:
                raise pytest.UsageError(f"@pytest.mark.ridgescope: {key}={value!r} is not a "
                                        "percentage") from None
            if key == "peak" or not 0 <= share <= 1:
                raise pytest.UsageError(f"@pytest.mark.ridgescope: {key}={value!r}: a share is "
                                        "of the peak, between 0% and 100%, for a category")
            limits[key] = ("share", share)
            continue
        try:
            limits[key] = ("bytes", parse_bytes(value))
        except ValueError as exc:
            raise pytest.UsageError(f"@pytest.mark.ridgescope: {key}: {exc}") from None
    return limits


def check_limits(report: Any, limits: dict[str, tuple[str, float]]) -> str | None:
    """The failure message when the report's peak exceeds a limit, else None."""
    from ridgescope._format import format_bytes

    data = report.to_dict()
    peak = data["peak"]
    over = []
    for key, (kind, amount) in limits.items():
        measured = peak["bytes"] if key == "peak" else peak["by_category"][key]
        limit = int(amount) if kind == "bytes" else int(amount * peak["bytes"])
        if measured > limit:
            what = "peak" if key == "peak" else f"{key} at the peak"
            bound = (f"{format_bytes(limit)} ({limit:,} bytes)" if kind == "bytes" else
                     f"{amount:.2%} of the peak = {limit:,} bytes")
            over.append(f"  {what}: {format_bytes(measured)} ({measured:,} bytes) exceeds the "
                        f"limit of {bound}")
    if not over:
        return None
    lines = ["ridgescope: memory limit exceeded", *over,
             f"Peak: {format_bytes(peak['bytes'])} ({peak['bytes']:,} bytes) live in step "
             f"{peak['step']}, during {peak['phase']}; by category:"]
    for category, value in sorted(peak["by_category"].items(), key=lambda kv: -kv[1]):
        if value:
            lines.append(f"  {category:<16} {format_bytes(value):>10}  ({value:,} bytes)")
    if peak["top_blocks"]:
        lines.append("Largest blocks live at the peak:")
        for b in peak["top_blocks"][:10]:
            lines.append(f"  {format_bytes(b['bytes']):>10}  {b['category']:<16} {b['label']}  "
                         f"[allocated in {b['phase_allocated']}]")
    lines.append(f"Trace: {data['trace']['path']} (ridgescope report {data['trace']['path']})")
    return "\n".join(lines)
