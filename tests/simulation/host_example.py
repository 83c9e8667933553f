"""Helpers for the tests that run examples/host_ci: its directory on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "host_ci"


def import_example() -> None:
    """Make ``host_app`` (the example host's package) importable, as its own CI would."""
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
