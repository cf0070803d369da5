"""``--device`` and ``--rules``: the options report, explain and diff share for choosing a
device and adding category rules (docs/snapshot.md)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help="the device to report: cuda:N (or cpu for a trace). Default: the one "
                             "whose live bytes peaked highest; for a snapshot the report then starts "
                             "with one line per device")
    parser.add_argument("--rules", type=Path, default=None, metavar="FILE",
                        help="category rules for a torch memory snapshot (.toml or .json): regular "
                             "expressions over frame names and files, tried before the built-in "
                             "inference (docs/snapshot.md)")


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """The rs.load() options these arguments ask for."""
    options: dict[str, Any] = {}
    if args.device is not None:
        options["device"] = args.device
    if args.rules is not None:
        options["rules"] = args.rules  # read (and checked) by rs.load
    return options
