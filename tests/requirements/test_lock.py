"""OPS-27: installs come from a lock. ``constraints.txt`` pins the exact version of every
package the project needs with its ``test`` and ``otel`` extras (written by ``bash
scripts/lock`` with uv); ``scripts/bootstrap``, ``scripts/check-wheel`` and so CI install with
it, and ``pyproject.toml`` keeps the library's ranges."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "constraints.txt"
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(\s*;\s*(?P<marker>.+))?$")


def _pins() -> dict[str, Requirement]:
    """Package name -> its pin (with its marker), from every requirement line of the lock."""
    pins: dict[str, Requirement] = {}
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assert PIN.match(line), f"constraints.txt: not an exact pin: {line!r}"
        requirement = Requirement(line)
        pins[canonicalize_name(requirement.name)] = requirement
    return pins


def _pinned_version(requirement: Requirement) -> str:
    (specifier,) = requirement.specifier
    assert specifier.operator == "==", requirement
    return specifier.version


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in [*project["dependencies"], *extras["test"], *extras["otel"]]]


def _installed_closure(name: str, extras: set[str]) -> set[str]:
    """Every distribution that ``name[extras]`` brings in, read from what is installed."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(canonicalize_name(name), frozenset(extras))]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        dist, wanted = current
        for line in metadata.requires(dist) or []:
            requirement = Requirement(line)
            if requirement.marker and not any(requirement.marker.evaluate({"extra": extra})
                                              for extra in (*wanted, "")):
                continue
            todo.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return {dist for dist, _ in seen}


@pytest.mark.clause("OPS-27")
def test_the_lock_pins_every_declared_dependency_at_a_version_its_range_allows() -> None:
    """OPS-27: each dependency of the project, its test extra and its otel extra has one exact
    pin in constraints.txt, inside the range pyproject.toml declares."""
    pins = _pins()
    for requirement in _declared():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is declared in pyproject.toml but not pinned: bash scripts/lock"
        version = _pinned_version(pins[name])
        assert requirement.specifier.contains(version, prereleases=True), (
            f"constraints.txt pins {name}=={version}, outside pyproject.toml's {requirement}: bash scripts/lock")


@pytest.mark.clause("OPS-27")
def test_what_is_installed_is_the_lock_whole_nothing_unpinned() -> None:
    """OPS-27: every distribution that nudging-scheduler[test,otel] brings into this
    environment is pinned by the lock, and installed at exactly the pinned version (as
    scripts/bootstrap installs it: ``-c constraints.txt``)."""
    pins = _pins()
    brought_in = _installed_closure("nudging-scheduler", {"test", "otel"}) - {"nudging-scheduler"}
    unpinned = sorted(brought_in - set(pins))
    assert not unpinned, f"installed but not in constraints.txt: {unpinned} (bash scripts/lock)"
    differ = {name: (metadata.version(name), _pinned_version(pins[name])) for name in sorted(brought_in)
              if metadata.version(name) != _pinned_version(pins[name])}
    assert not differ, f"installed (left) is not the lock's version (right): {differ}; run bash scripts/bootstrap"


@pytest.mark.clause("OPS-27")
def test_the_lock_says_how_to_refresh_it_and_every_install_script_uses_it() -> None:
    """OPS-27: the lock's header names its refresh command; the bootstrap installs with it
    (its stamp hashes it, so a new lock reinstalls) and tries a failed install again; the wheel
    check installs the wheel's dependencies with it."""
    header = [line for line in LOCK.read_text().splitlines() if line.startswith("#")]
    assert any("bash scripts/lock" in line for line in header)
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text()
    assert "-c constraints.txt -e '.[test]'" in bootstrap
    assert "cat pyproject.toml constraints.txt | sha1sum" in bootstrap
    assert "scripts/pip-install" in bootstrap
    check_wheel = (ROOT / "scripts" / "check-wheel").read_text()
    assert '-c "$checkout/constraints.txt" "$wheel"' in check_wheel
