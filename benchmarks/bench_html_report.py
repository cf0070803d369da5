"""Time and size of the HTML report of a long trace (issue 5's budget: a trace of 10^6 events
becomes an HTML report of at most 5 MB in at most 10 s on the 2-core reference machine).

Writes a synthetic trace of --events events (benchmarks/synthetic_trace.py: a 24-layer
training run, identical steps), then times what `ridgescope report TRACE --format html -o
OUT` does, in stages: the native analysis (both passes, with the HTML report's timeline
columns), rendering the page, writing it. Each stage is measured --repetitions times; the
median is reported. Prints ONE JSON object on stdout; progress goes to stderr.

    .venv/bin/python benchmarks/bench_html_report.py                  # 10^6 events
    .venv/bin/python benchmarks/bench_html_report.py --events 10000000 --repetitions 1
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from synthetic_trace import write_trace  # noqa: E402

BUDGET_BYTES = 5 * 1000 * 1000
BUDGET_S = 10.0


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="events in the trace (default 10^6)")
    ap.add_argument("--repetitions", type=int, default=3, help="timed repetitions (default 3)")
    ap.add_argument("--keep", type=Path, default=None, help="also copy the HTML report here")
    args = ap.parse_args(argv)

    import torch
    import ridgescope
    from ridgescope._reporters._html import HTML_TIMELINE_COLUMNS, render_html
    from ridgescope._report import Report

    with tempfile.TemporaryDirectory(prefix="rs-bench-html-") as tmp:
        trace = Path(tmp) / "synthetic.rstrace"
        out = Path(tmp) / "report.html"
        print(f"writing a synthetic trace of {args.events:,} events", file=sys.stderr)
        t = time.perf_counter()
        info = write_trace(trace, args.events)
        write_s = time.perf_counter() - t

        stages: dict[str, list[float]] = {"analyse": [], "render": [], "write": [], "total": []}
        html = ""
        for rep in range(args.repetitions):
            print(f"repetition {rep + 1}/{args.repetitions}", file=sys.stderr)
            t0 = time.perf_counter()
            report = Report.from_trace(trace, timeline_columns=HTML_TIMELINE_COLUMNS)
            t1 = time.perf_counter()
            html = render_html(report.to_dict())
            t2 = time.perf_counter()
            out.write_text(html, encoding="utf-8")
            t3 = time.perf_counter()
            for k, v in (("analyse", t1 - t0), ("render", t2 - t1), ("write", t3 - t2), ("total", t3 - t0)):
                stages[k].append(v)
        size = out.stat().st_size
        data = report.to_dict()

        # The command line end to end, once (a fresh process: imports included).
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ridgescope.cli", "report", str(trace), "--format", "html",
                        "-o", str(out)], check=True, stderr=subprocess.DEVNULL)
        cli_s = time.perf_counter() - t
        if args.keep:
            args.keep.write_bytes(out.read_bytes())

        result = {
            "schema_version": 1,
            "benchmark": "html_report",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "ridgescope": ridgescope.__version__},
            "trace": {"events": info["events"], "steps": info["steps"], "file_bytes": trace.stat().st_size,
                      "write_s": round(write_s, 3)},
            "timeline_columns": HTML_TIMELINE_COLUMNS,
            "timeline_listed_columns": len(data["timeline"]["index"]),
            "repetitions": args.repetitions,
            "median_s": {k: round(statistics.median(v), 3) for k, v in stages.items()},
            "cli_end_to_end_s": round(cli_s, 3),
            "html_bytes": size,
            "peak_bytes": data["peak"]["bytes"],
            "peak_in_timeline": max(data["timeline"]["max_bytes"]) == data["peak"]["bytes"],
            "budget": {"max_bytes": BUDGET_BYTES, "max_s": BUDGET_S,
                       "within": size <= BUDGET_BYTES and cli_s <= BUDGET_S},
        }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
