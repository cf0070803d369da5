"""The merged multi-rank report as an aggregator over trace files (docs/distributed.md), on
synthetic rank traces (benchmarks/synthetic_trace.py plus the `distributed` metadata a tracked
rank writes): ranks come from the metadata, not the file order; a torn or unreadable trace is
listed and the rest merged; missing and duplicate ranks are named; large jobs get a bounded
text table; the HTML page embeds hostile strings safely."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import ridgescope as rs
from ridgescope.cli import main as cli_main
from ridgescope.distributed import merge_traces

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_merge_ranks  # noqa: E402


def write_job(d: Path, world: int, ranks: list[int] | None = None, straggler: int = -1,
              events: int = 3000) -> list[Path]:
    d.mkdir(exist_ok=True)
    paths = []
    for r in (range(world) if ranks is None else ranks):
        p = d / f"job-{(r * 7919) % 1000:03d}.rstrace"  # file names say nothing of the rank
        bench_merge_ranks.write_rank(p, r, world, events, r == straggler)
        paths.append(p)
    return paths


def test_ranks_come_from_metadata_and_the_straggler_is_named(tmp_path: Path) -> None:
    """Given 8 rank traces whose names do not follow the ranks, one rank training a larger
    model, when the directory is merged, then the table is in rank order, hosts and backend
    come from the metadata, the larger rank is the highest peak, and every row equals that
    rank's own report."""
    paths = write_job(tmp_path / "job", 8, straggler=5)
    s = merge_traces([tmp_path / "job"])["ranks"]
    assert [r["rank"] for r in s["table"]] == list(range(8))
    assert s["world_size"] == 8 and s["backends"] == ["nccl"] and s["hosts"] == ["node0"]
    assert s["highest"]["rank"] == 5 and s["missing_ranks"] == [] and s["problems"] == []
    by_path = {r["path"]: r for r in s["table"]}
    for p in paths:
        peak = rs.load(p).to_dict()["peak"]
        row = by_path[str(p)]
        assert (row["peak_bytes"], row["by_category"]) == (peak["bytes"], peak["by_category"])
    assert s["divergent_phases"][0]["max_rank"] == 5


def test_torn_and_unreadable_traces_are_listed_and_the_rest_merged(tmp_path: Path) -> None:
    """Given 4 rank traces of which one lost its last bytes (a rank killed mid-write) and one
    is not a trace at all, when merged, then the torn one is merged up to its readable prefix
    and flagged truncated with the reader's byte offset, the bad one is listed as unreadable
    and left out (its rank missing), and the other two merge normally."""
    paths = write_job(tmp_path / "job", 4)
    data = paths[1].read_bytes()
    paths[1].write_bytes(data[: len(data) - 100])
    paths[3].write_bytes(b"not a trace at all")
    s = merge_traces(paths)["ranks"]
    assert s["traces"] == 4 and s["merged"] == 3
    kinds = {p["kind"]: p for p in s["problems"]}
    assert set(kinds) == {"truncated", "unreadable"}
    torn = next(r for r in s["table"] if r["path"] == str(paths[1]))
    assert torn["status"] == "truncated" and "offset" in torn["problem"]
    assert kinds["unreadable"]["path"] == str(paths[3])
    assert s["missing_ranks"] == [3]  # the unreadable one
    # the torn trace lost its metadata (written last here): its rank is its position
    assert (torn["rank"], torn["rank_from"]) == (1, "file name or position")


def test_missing_duplicate_and_mismatched_ranks_are_named(tmp_path: Path) -> None:
    """Given ranks 0, 1 and 3 of a world of 4, plus a second trace of rank 1 claiming a world
    of 8, when merged, then rank 2 and ranks 4-7 are missing, rank 1 is a duplicate and the
    world sizes disagree."""
    paths = write_job(tmp_path / "a", 4, ranks=[0, 1, 3])
    paths += write_job(tmp_path / "b", 8, ranks=[1])
    s = merge_traces(paths)["ranks"]
    assert s["world_size"] == 8 and s["missing_ranks"] == [2, 4, 5, 6, 7]
    kinds = sorted(p["kind"] for p in s["problems"])
    assert kinds == ["duplicate_rank", "world_size_mismatch"]


def test_cli_inputs_and_large_job_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Given 48 rank traces, when `ridgescope report DIR` runs, then the text lists the 10
    highest and 5 lowest ranks and says the JSON lists every rank; the JSON lists all 48; a
    directory without traces, `--format snapshot` of several traces, and the options that
    belong to one trace's report (--tensorboard, --device, --rules, --top-blocks) are clear
    errors, not silently ignored."""
    write_job(tmp_path / "job", 48, straggler=40, events=1500)
    assert cli_main(["report", str(tmp_path / "job")]) == 0
    text = capsys.readouterr().out
    assert "Highest peak: rank 40" in text and "33 more rank(s)" in text
    assert cli_main(["report", str(tmp_path / "job"), "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ranks"]["table"]) == 48
    (tmp_path / "empty").mkdir()
    assert cli_main(["report", str(tmp_path / "empty")]) == 1
    assert "no .rstrace files" in capsys.readouterr().err
    assert cli_main(["report", str(tmp_path / "job"), "--format", "snapshot", "-o", "x"]) == 1
    assert "name one trace" in capsys.readouterr().err
    for option in (["--tensorboard", str(tmp_path / "tb")], ["--device", "cuda:1"],
                   ["--rules", str(tmp_path / "rules.toml")], ["--top-blocks", "5"]):
        assert cli_main(["report", str(tmp_path / "job"), *option]) == 1
        assert f"{option[0]} applies to the report of one trace" in capsys.readouterr().err
    assert not (tmp_path / "tb").exists()


def test_html_page_embeds_hostile_strings_as_data(tmp_path: Path) -> None:
    """Given a rank whose host name is markup (a hostile or broken launcher), when the HTML
    page is written, then the markup appears only escaped inside the embedded JSON."""
    paths = write_job(tmp_path / "job", 2)
    s = merge_traces(paths)
    s["ranks"]["table"][0]["host"] = "</script><script>alert(1)</script>"
    from ridgescope._reporters._ranks_html import render_ranks_html
    page = render_ranks_html(s)
    assert "<script>alert(1)" not in page and "\\u003c/script\\u003e" in page
    assert page.count("<script") == 2  # the data element and the page's own script


CHROMIUM = os.environ.get("RIDGESCOPE_CHROMIUM", "/usr/bin/chromium")


def test_html_page_shows_ranks_side_by_side_offline(tmp_path: Path) -> None:
    """Given the merged page of 8 ranks (rank 5 the straggler) opened from file:// in Chromium,
    then nothing but the file is requested and nothing goes wrong, the table has a row per rank,
    the two panels show the highest and the lowest rank, and clicking rank 3's row puts it
    beside the previous one."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("needs Python's playwright (scripts/setup.sh installs it)")
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"needs Chromium at {CHROMIUM}")
    write_job(tmp_path / "job", 8, straggler=5)
    html = tmp_path / "job.html"
    assert cli_main(["report", str(tmp_path / "job"), "--format", "html", "-o", str(html)]) == 0
    lowest = merge_traces([tmp_path / "job"])["ranks"]["highest"]["lowest_rank"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            requests: list[str] = []
            errors: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(html.resolve().as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=15000)
            assert requests == [html.resolve().as_uri()] and errors == []
            assert page.locator("#rs-ranks-table tr[data-rank]").count() == 8
            panels = page.eval_on_selector_all(".rs-rank-panel", "els => els.map(e => e.dataset.rank)")
            assert panels == ["5", str(lowest)]
            page.click("#rs-ranks-table tr[data-rank='3']")
            panels = page.eval_on_selector_all(".rs-rank-panel", "els => els.map(e => e.dataset.rank)")
            assert panels == ["3", "5"]
            assert page.locator(".rs-rank-panel polyline").count() == 2
        finally:
            browser.close()
