"""Generates docs/cli.md from the argument parser, so the page cannot drift from the program:

    .venv/bin/python -m ridgescope.cli._docgen > docs/cli.md

tests/python/test_cli_docs.py fails when docs/cli.md differs from this output. The text comes
from each subcommand's description and each option's help; the usage lines are rendered here
(not by argparse, whose formatting changes between Python versions), so the page is the same on
every supported Python."""
from __future__ import annotations

import argparse
import sys

from . import build_parser

INTRO = """\
# Command line

<!-- Generated from the argument parser by `python -m ridgescope.cli._docgen > docs/cli.md`;
     do not edit by hand (tests/python/test_cli_docs.py checks it). -->

```
ridgescope [--version] COMMAND ...
```

`python -m ridgescope.cli` is the same program. Every subcommand takes `-h`/`--help`.
"""

ERRORS = """\
## Errors and exit status

Errors in the input (a missing file, a file that is not a trace, an unsupported version) print
one line, `ridgescope COMMAND: error: ...`, and exit with status 1, with no traceback; usage
errors exit with 2. A trace whose tail is torn or corrupt is reported up to the readable
prefix, with a warning on standard error naming the byte offset. Progress bars (long report
generation) appear on standard error only when it is a terminal.
"""


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices is not None:
        return "{" + "|".join(str(c) for c in action.choices) + "}"
    return action.dest.upper()


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(
        action, (argparse._StoreConstAction, argparse._StoreTrueAction, argparse._StoreFalseAction,
                 argparse._CountAction, argparse._HelpAction, argparse._VersionAction))


def _usage_item(action: argparse.Action) -> str:
    if not action.option_strings:  # positional
        name = _metavar(action)
        if action.nargs == argparse.REMAINDER:
            return f"[{name}...]"
        if action.nargs in ("*",):
            return f"[{name}...]"
        if action.nargs == "+":
            return f"{name}..."
        if action.nargs == "?":
            return f"[{name}]"
        return name
    flag = action.option_strings[0]
    item = f"{flag} {_metavar(action)}" if _takes_value(action) else flag
    if action.nargs in ("*", "+") or isinstance(action, argparse._AppendAction):
        item += " ..."
    return item if action.required else f"[{item}]"


def _option_cell(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{_metavar(action)}`".replace("|", "\\|")  # a table cell: escape the pipe
    value = f" {_metavar(action)}" if _takes_value(action) else ""
    return ", ".join(f"`{flag}{value}`" for flag in action.option_strings).replace("|", "\\|")


def _help_cell(action: argparse.Action) -> str:
    text = (action.help or "") % {"default": action.default, "prog": "ridgescope"}
    if action.required and action.option_strings:
        text += " (required)"
    return " ".join(text.split()).replace("|", "\\|")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            return {name: (helps.get(name, ""), sub) for name, sub in action.choices.items()}
    return {}


def generate() -> str:
    parser = build_parser()
    commands = _subcommands(parser)
    out = [INTRO]
    out.append("| command | what it does |\n|---|---|")
    for name, (help_text, _) in sorted(commands.items()):
        out.append(f"| [`ridgescope {name}`](#ridgescope-{name}) | {' '.join(help_text.split())} |")
    out.append("")
    for name, (help_text, sub) in sorted(commands.items()):
        actions = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        usage = " ".join(["ridgescope", name] + [_usage_item(a) for a in actions if a.option_strings]
                         + [_usage_item(a) for a in actions if not a.option_strings])
        out.append(f"## ridgescope {name}\n")
        out.append(" ".join((sub.description or help_text or "").split()) + "\n")
        out.append(f"```\n{usage}\n```\n")
        if actions:
            out.append("| argument | meaning |\n|---|---|")
            for a in [a for a in actions if not a.option_strings] + [a for a in actions if a.option_strings]:
                out.append(f"| {_option_cell(a)} | {_help_cell(a)} |")
            out.append("")
    out.append(ERRORS)
    return "\n".join(out)


def main() -> int:
    sys.stdout.write(generate())
    return 0


if __name__ == "__main__":
    sys.exit(main())
