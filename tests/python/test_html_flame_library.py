"""Specification of the flame graph's library frames (docs/sites.md, "Library frames"), in a real
headless Chromium: on a torch snapshot recorded with stacks="all" (the Wedsonlin file of
../shared/snapshots: each stack has some 75 frames, most of them CPython's, libc's and torch's
C++ between the user's lines), the icicle folds library frames away by default, so the user's
frames follow each other level by level; its checkbox shows every frame again; the totals stay
the peak either way. The frames' `library` flags and texts come from the report (the core's one
rule and one formatter), never from the page.

Needs Debian's `chromium` and Python's playwright (scripts/setup.sh installs both)."""
from __future__ import annotations

import shutil

import pytest

import ridgescope as rs
from test_html_flame import CHROMIUM, nodes, sync_playwright
from test_snapshot_corpus import CORPUS

WEDSONLIN = CORPUS / "Wedsonlin__assignment2-systems__results__medium_1024_training_memory_snapshot.pickle"

pytestmark = [
    pytest.mark.skipif(sync_playwright is None or shutil.which(CHROMIUM) is None,
                       reason=f"needs Python's playwright and Chromium at {CHROMIUM}"),
    pytest.mark.skipif(not WEDSONLIN.exists(), reason=f"the real-GPU snapshot is not here ({WEDSONLIN})")]


@pytest.fixture(scope="module")
def snapshot_page(tmp_path_factory):
    report = rs.load(WEDSONLIN)
    html = tmp_path_factory.mktemp("flame-library") / "wedsonlin.html"
    report.to_html(html)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1600, "height": 900})
        errors = []
        pg.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(html.resolve().as_uri())
        pg.wait_for_selector("body[data-ready='1']", timeout=30000)
        yield report.to_dict(), pg, errors, browser
        browser.close()


def user_path(d: dict, stack: dict) -> list[str]:
    """A stack's frames as the folded icicle draws them, outermost first: the site and every
    frame the report does not mark library code."""
    frames = d["frames"]
    return [frames[f]["text"] for j, f in reversed(list(enumerate(stack["frames"])))
            if j == stack["site"] or not frames[f]["library"]]


def test_the_interpreters_and_libcs_frames_are_library_frames_in_the_report(snapshot_page):
    d, _, _, _ = snapshot_page
    by_text = {f["text"]: f for f in d["frames"]}
    for name in ("_PyEval_EvalFrameDefault", "_PyObject_MakeTpCall", "__libc_start_main", "_start",
                 "at::_ops::exp::call"):
        assert by_text[name]["library"] and by_text[name]["kind"] == "native", name
    module_call = [f for f in d["frames"] if f["function"] == "_call_impl"]
    assert module_call and all(f["library"] for f in module_call)  # torch/nn/modules/module.py
    softmax = [f for f in d["frames"] if f["text"] == "nn_utils.py:6 in softmax"]
    assert len(softmax) == 1 and not softmax[0]["library"]
    assert softmax[0]["location"].endswith("/cs336_basics/nn_utils.py:6 in softmax")


def test_by_default_the_flame_graph_folds_library_frames_away(snapshot_page):
    """Given the page, then no drawn frame is a library frame, the largest stack's user frames
    are drawn one level after another from the top (not thirty levels of CPython apart), and the
    icicle still adds up to the peak."""
    d, pg, errors, _ = snapshot_page
    assert errors == []
    peak = d["peak"]["bytes"]
    assert int(pg.get_attribute("#rs-flame", "data-total-bytes")) == peak
    assert int(pg.get_attribute("#rs-flame", "data-children-bytes")) == peak
    drawn = nodes(pg)
    library = {f["text"] for f in d["frames"] if f["library"]}
    assert not [n["label"] for n in drawn if n["depth"] > 0 and n["label"] in library]
    largest = max((s for s in d["peak"]["stacks"] if s["frames"]), key=lambda s: s["bytes"])
    path = user_path(d, largest)
    assert path[-1] == "nn_utils.py:6 in softmax" and 5 <= len(path) <= 10
    at = {(n["depth"], n["label"]) for n in drawn}
    for depth, label in enumerate(path, 1):
        assert (depth, label) in at, (depth, label)
    assert max(n["depth"] for n in drawn) <= max(len(user_path(d, s)) for s in d["peak"]["stacks"]) + 1
    info = pg.text_content("#rs-flame-info")
    assert "library frame(s) of these stacks are folded away" in info


def test_the_checkbox_shows_every_frame_and_hides_them_again(snapshot_page):
    d, pg, errors, _ = snapshot_page
    folded_depth = max(n["depth"] for n in nodes(pg))
    pg.check("#rs-flame-library")
    shown = nodes(pg)
    labels = {n["label"] for n in shown}
    assert "_PyEval_EvalFrameDefault" in labels and "__libc_start_main" in labels
    assert max(n["depth"] for n in shown) > folded_depth + 30
    assert int(pg.get_attribute("#rs-flame", "data-total-bytes")) == d["peak"]["bytes"]
    pg.uncheck("#rs-flame-library")
    assert max(n["depth"] for n in nodes(pg)) == folded_depth
    assert errors == []


def test_the_page_can_open_with_library_frames_shown(snapshot_page, tmp_path):
    """report.to_html(library_frames=True) (ridgescope report --format html --library-frames)
    opens the page with the checkbox ticked."""
    d, _, _, browser = snapshot_page
    html = tmp_path / "shown.html"
    rs.Report(d).to_html(html, library_frames=True)
    pg = browser.new_page(viewport={"width": 1600, "height": 900})
    pg.goto(html.resolve().as_uri())
    pg.wait_for_selector("body[data-ready='1']", timeout=30000)
    assert pg.is_checked("#rs-flame-library")
    assert "_PyEval_EvalFrameDefault" in {n["label"] for n in nodes(pg)}
    pg.close()
