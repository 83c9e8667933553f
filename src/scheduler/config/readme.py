"""The README's configuration table, written from the one declaration of ``Settings``:
``python -m scheduler.config --markdown`` prints it, ``--write-readme`` puts it in README.md,
and a test fails when the two drift."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic.fields import FieldInfo

from scheduler.config.settings import Settings, env_name

README = Path("README.md")  # run from the checkout's root
TABLE_HEADER = "| variable | default | meaning |\n| --- | --- | --- |\n"


def _shown_default(field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("readme_default"), str):
        return str(extra["readme_default"])
    value = field.default
    if value is None:
        return "\u2013"  # an en dash, as the README shows "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def markdown_table() -> str:
    """The README's configuration table, one row per declared setting, in declaration order."""
    rows = [f"| `{env_name(name)}` | {_shown_default(field)} | {field.description} |\n"
            for name, field in Settings.model_fields.items()]
    return TABLE_HEADER + "".join(rows)


def readme_table(text: str) -> str:
    """The configuration table as it stands in the README's text (header included)."""
    start = text.index(TABLE_HEADER, text.index("## Configuration"))
    end = text.find("\n\n", start)
    return text[start:end + 1]


def write_readme(path: Path = README) -> bool:
    """Put the generated table in the README; True when it changed."""
    text = path.read_text()
    old = readme_table(text)
    new = markdown_table()
    if old == new:
        return False
    path.write_text(text.replace(old, new, 1))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scheduler.config``: print the configuration table, or write it into README.md."""
    parser = argparse.ArgumentParser(prog="python -m scheduler.config",
                                     description="The settings, from their one declaration.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--markdown", action="store_true", help="print the README's configuration table")
    what.add_argument("--write-readme", nargs="?", const=README, type=Path, metavar="PATH",
                      help="write the table into the README (default: README.md here)")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown_table())
        return 0
    changed = write_readme(args.write_readme)
    print(f"{args.write_readme}: {'configuration table rewritten' if changed else 'already up to date'}")
    return 0

