"""Writes docs/api.md, kfit's API reference, from the docstrings of the public names.

    python scripts/build_api_docs.py           # rewrite docs/api.md
    python scripts/build_api_docs.py --check   # exit 1 if docs/api.md is out of date (the tests run this)

The examples in these docstrings run as doctests in the test suite (`pytest --doctest-modules kfit`).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "api.md"
MODULES = [
    ("kfit", ["fit", "Clock", "Interval", "Run", "get_clock", "get_context", "save_checkpoint", "load_checkpoint",
              "EpochSummary"]),
    ("kfit.schedules", None),
    ("kfit.cntk", None),
    ("kfit.optimizers", None),
    ("kfit.callbacks", None),
    ("kfit.data", None),
    ("kfit.distributed", None),
]


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _entry(module_name: str, name: str, obj) -> list[str]:
    kind = "class" if inspect.isclass(obj) else "function"
    lines = [f"### `{module_name}.{name}`", "", f"```python\n{kind} {name}{_signature(obj)}\n```", ""]
    doc = inspect.getdoc(obj) or "(no docstring)"
    lines += [doc, ""]
    if inspect.isclass(obj):
        for attr, member in sorted(vars(obj).items()):
            if attr.startswith("_") or not callable(member) or not getattr(member, "__doc__", None):
                continue
            if attr.startswith("on_") and attr not in ("on_step_begin", "on_step_end"):
                continue
            lines += [f"- `{attr}{_signature(member)}`: {inspect.getdoc(member).splitlines()[0]}"]
        lines.append("")
    return lines


def build() -> str:
    lines = ["# kfit API reference", "",
             "Generated from the docstrings by `python scripts/build_api_docs.py`; their examples run as doctests in the test suite.", ""]
    for module_name, names in MODULES:
        module = importlib.import_module(module_name)
        lines += [f"## `{module_name}`", "", (inspect.getdoc(module) or "").strip(), ""]
        for name in names or sorted(getattr(module, "__all__", [])):
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj) or callable(obj):
                lines += _entry(module_name, name, obj)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = build()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run python scripts/build_api_docs.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
