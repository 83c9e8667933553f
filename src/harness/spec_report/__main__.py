"""``python -m harness.spec_report DIR``: rebuild DIR/index.html from DIR/report.json, without
running a test (after a change to the page's layout, or from a report CI kept)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.spec_report.plugin import write
from harness.spec_report.render import render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.spec_report",
        description="Rebuild DIR/index.html from DIR/report.json (written by pytest --spec-report DIR).")
    parser.add_argument("dir", type=Path, metavar="DIR", help="the directory pytest --spec-report wrote")
    args = parser.parse_args(argv)
    source = args.dir / "report.json"
    try:
        report = json.loads(source.read_text())
    except FileNotFoundError:
        parser.error(f"{source} does not exist: run pytest --spec-report {args.dir} first")
    except json.JSONDecodeError as error:
        parser.error(f"{source} is not JSON: {error}")
    write(args.dir / "index.html", render(report))
    print(f"{report['summary']['line']} — {args.dir / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
