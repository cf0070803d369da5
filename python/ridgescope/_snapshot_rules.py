"""User category rules for snapshots PyTorch wrote (``ridgescope report snap.pickle --rules
rules.toml``): regular expressions over frame names and files, applied before the built-in
inference (docs/snapshot.md, "Your own rules").

Two shapes, in TOML or JSON:

* the full one, a list of rules tried in order (the first that matches a block's allocation
  stack wins)::

      [[rule]]
      name = "kv cache"          # shown in the reason
      category = "activation"
      frame = "_update_cache"    # regex over frame (function) names; optional
      file = "models/llama\\.py" # regex over frame files; optional (one of the two is needed)

  (JSON: ``{"rule": [{"name": ..., "category": ..., "frame": ..., "file": ...}]}`` or the
  bare list);
* the short one, ``category = "regex"`` pairs (``{"activation": "attention|mlp"}``), where the
  regex is tried on frame names and, separately, on files.

Regular expressions are ECMAScript's (std::regex, matched anywhere); each is also checked with
Python's ``re``, so one that either engine refuses is an error naming the rule."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ._C import CATEGORIES
from ._errors import RidgescopeError

Rule = tuple[str, str, str, str]  # (name, category, frame regex, file regex)


def load_rules(path: str | os.PathLike[str]) -> list[Rule]:
    """The rules of a .toml or .json file, validated; RidgescopeError naming the problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise RidgescopeError(f"cannot read the rules file {p}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise RidgescopeError(f"the rules file {p} is not UTF-8 text") from None
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RidgescopeError(f"{p}: not valid JSON: {exc}") from None
    else:
        import tomllib  # Python 3.11+
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise RidgescopeError(f"{p}: not valid TOML ({exc}); name a .json file for JSON rules") from None
    return rules_from_data(data, str(p))


def rules_from_data(data: Any, source: str = "rules") -> list[Rule]:
    """Rules from parsed TOML/JSON data (either shape above)."""
    if isinstance(data, dict) and set(data) == {"rule"}:
        data = data["rule"]
    if isinstance(data, list):
        return [_full_rule(r, i, source) for i, r in enumerate(data)]
    if isinstance(data, dict):
        out: list[Rule] = []
        for category, pattern in data.items():
            if not isinstance(pattern, str):
                raise RidgescopeError(f"{source}: '{category}' must map to a regular expression (a string), "
                                      f"got {type(pattern).__name__}; for full rules use [[rule]] tables")
            _check_category(category, f"{source}: '{category}'")
            _check_regex(pattern, f"{source}: '{category}'")
            out.append((category, category, pattern, ""))
            out.append((category, category, "", pattern))
        return out
    raise RidgescopeError(f"{source}: expected [[rule]] tables or category = \"regex\" pairs, "
                          f"got {type(data).__name__}")


def _full_rule(rule: Any, index: int, source: str) -> Rule:
    where = f"{source}: rule {index + 1}"
    if not isinstance(rule, dict):
        raise RidgescopeError(f"{where} must be a table with 'category' and 'frame' and/or 'file'")
    unknown = set(rule) - {"name", "category", "frame", "file"}
    if unknown:
        raise RidgescopeError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
                              "(allowed: name, category, frame, file)")
    name = rule.get("name", f"rule {index + 1}")
    category, frame, file = rule.get("category"), rule.get("frame", ""), rule.get("file", "")
    for key, value in (("name", name), ("category", category), ("frame", frame), ("file", file)):
        if not isinstance(value, str):
            raise RidgescopeError(f"{where}: '{key}' must be a string")
    where = f"{source}: rule '{name}'"
    _check_category(category, where)
    if not frame and not file:
        raise RidgescopeError(f"{where} needs a 'frame' or a 'file' regular expression")
    for pattern in (frame, file):
        if pattern:
            _check_regex(pattern, where)
    return (name, category, frame, file)


def _check_category(category: str, where: str) -> None:
    if category not in CATEGORIES:
        raise RidgescopeError(f"{where}: unknown category '{category}' (one of {', '.join(CATEGORIES)})")


def _check_regex(pattern: str, where: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise RidgescopeError(f"{where}: invalid regular expression {pattern!r}: {exc}") from None
