"""Takes the screenshot of docs/html-report.md: opens an HTML report in headless Chromium, zooms
to the step of the peak, shows the peak's composition, and saves a PNG of the top of the page.

    .venv/bin/ridgescope run examples/train_plain.py --steps 3 -o /tmp/plain.rstrace
    .venv/bin/python scripts/html_report_screenshot.py /tmp/plain.html docs/img/html-report.png

Needs Chromium at /usr/bin/chromium and Python's playwright (scripts/setup.sh installs both)."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html", type=Path, help="an HTML report (ridgescope report --format html)")
    ap.add_argument("png", type=Path, help="the screenshot to write")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=860, help="height of the top of the page kept")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args(argv)

    from playwright.sync_api import sync_playwright

    text = args.html.read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="rs-data">(.*?)</script>', text, re.S).group(1))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        page.goto(args.html.resolve().as_uri())
        page.wait_for_selector("body[data-ready='1']")
        page.select_option("#rs-step-select", str(data["peak"]["step"]))
        page.hover("#rs-peak-marker")
        page.wait_for_selector("#rs-peak-tip")
        args.png.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.png), clip={"x": 0, "y": 0, "width": args.width, "height": args.height})
        browser.close()
    print(f"wrote {args.png} ({args.png.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
