"""ARCH-14: no module of ``src/scheduler`` is over 400 lines: a module says one thing, and one
a newcomer opens reads top to bottom."""

from __future__ import annotations

from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "scheduler"
MOST_LINES = 400


@pytest.mark.clause("ARCH-14")
def test_no_module_of_the_package_is_over_400_lines() -> None:
    """ARCH-14: every ``.py`` file under src/scheduler (migrations included) has at most 400 lines."""
    long = {str(path.relative_to(SRC)): lines for path in sorted(SRC.rglob("*.py"))
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES}
    assert long == {}
