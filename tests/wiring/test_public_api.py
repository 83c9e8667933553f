"""ARCH-3: the public API is what the README's "Public API" section names, no more, no less.

The section's first item lists what ``scheduler`` exports and its second the protocols of
``scheduler.types``; both are read from README.md here, so the README and the package cannot
drift apart in either direction.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import scheduler
from scheduler import types

README = Path(__file__).resolve().parents[2] / "README.md"


def _public_api_items() -> list[str]:
    """The items of the README's "Public API" list, each as one line of text."""
    text = README.read_text()
    start = text.index("\n## Public API\n")
    section = text[start:text.index("\n## ", start + 1)]
    items = re.split(r"\n- ", section)[1:]
    return [" ".join(item.split("\n\n")[0].split()) for item in items]


def _names(item: str) -> list[str]:
    return re.findall(r"`(\w+)`", item)


@pytest.mark.clause("ARCH-3")
def test_the_readme_public_api_section_is_read_as_written() -> None:
    """ARCH-3: the reader of the section finds its two first items where they are (a guard for
    the other tests: a reworded README fails here rather than passing them vacuously)."""
    items = _public_api_items()
    assert items[0].startswith("what `scheduler` exports:"), items[0]
    assert items[1].startswith("the `Dispatcher` and `Publisher` protocols"), items[1]


@pytest.mark.clause("ARCH-3")
def test_scheduler_exports_exactly_the_names_the_readme_lists_and_each_resolves() -> None:
    """ARCH-3: ``scheduler.__all__`` is the README's list (both ways, no duplicate), each name
    resolves from ``scheduler`` to the object at its home module, and ``from scheduler import *``
    gives exactly those names."""
    item = _public_api_items()[0]
    listed = _names(item.split(":", 1)[1].split(";")[0])
    assert len(listed) == len(set(listed)) and len(scheduler.__all__) == len(set(scheduler.__all__))
    assert sorted(listed) == sorted(scheduler.__all__)
    for name in listed:
        value = getattr(scheduler, name)
        assert getattr(importlib.import_module(value.__module__), name) is value, name
    star: dict[str, object] = {}
    exec("from scheduler import *", star)  # the import is what is tested
    assert sorted(n for n in star if n != "__builtins__") == sorted(listed)
    with pytest.raises(AttributeError):
        scheduler.moved  # noqa: B018 - an unlisted name is no export


@pytest.mark.clause("ARCH-3")
def test_the_protocols_the_readme_names_are_in_scheduler_types() -> None:
    """ARCH-3: ``Dispatcher`` and ``Publisher`` are protocols of ``scheduler.types``, with the
    ``DispatchResult`` and ``DigitalTwinEvent`` they take and give."""
    item = _public_api_items()[1]
    assert "in `scheduler.types`" in item, item
    protocols = _names(item.split("protocols", 1)[0])
    carried = _names(item.split("(with", 1)[1].split(")")[0])
    assert protocols == ["Dispatcher", "Publisher"] and carried == ["DispatchResult", "DigitalTwinEvent"]
    for name in protocols:
        assert getattr(getattr(types, name), "_is_protocol", False), name
    for name in carried:
        assert isinstance(getattr(types, name), type), name
