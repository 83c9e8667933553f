"""ARCH-8: one reminder, stored through the API and dispatched by one poll, runs code in at
most 25 of the package's modules (``python -m bench.path``: the readability of the path a
newcomer follows, not a speed)."""

from __future__ import annotations

import pytest
from bench.path import measure

MOST_MODULES = 25


@pytest.mark.clause("ARCH-8")
def test_one_reminder_stored_and_dispatched_runs_code_in_at_most_25_of_the_packages_modules(
    database_url: str,
) -> None:
    """ARCH-8: the profile of a stored reminder (POST) and one ``poll_once`` that dispatches it,
    after a first one has warmed the imports and caches, names at most 25 modules; a fold
    undone, or a new module put on the path, fails here naming the modules."""
    path = measure(database_url)
    assert len(path.both) <= MOST_MODULES, "\n".join(path.both)
    assert "scheduler.core.poll" in path.poll and "scheduler.web.api.intake" in path.store
