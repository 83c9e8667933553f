"""How a scenario reports: its figures on one line each, then every problem, then the verdict."""

from __future__ import annotations

import json
from typing import Any


def report(scenario: str, figures: dict[str, Any], problems: list[str], reproduce: str) -> int:
    """Print the figures (``lost`` last) and return the exit code: 0 only if nothing was lost
    and no invariant failed."""
    lost = int(figures.get("lost", 0))
    print(f"\n== {scenario}: figures")
    for name, value in figures.items():
        if name != "lost":
            print(f"  {name}: {value}")
    print(f"  lost: {lost}")
    if problems:
        print(f"== {scenario}: FAILED ({len(problems)} problems)")
        for problem in problems:
            print(f"  - {problem}")
        print(f"reproduce with: {reproduce}")
    else:
        print(f"== {scenario}: passed")
    print("figures-json: " + json.dumps({"scenario": scenario, **figures, "lost": lost, "problems": len(problems)}))
    return 1 if problems or lost else 0
