"""Subcommands of ``scheduler`` that live outside the service: ``simulate`` (the replica
simulation, ``harness``) and ``bench`` (the benchmarks, a folder of the checkout).

They are registered by name and help line only; their module is imported when, and only
when, the subcommand runs. So ``scheduler serve`` (and ``--help``) never imports the test
harness or the benchmarks, and nothing in them can stop the service from starting. A broken
import of that module is still an error when the subcommand runs (WIRE-7), never a
subcommand that silently disappears.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler.config import Settings

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


@dataclass(frozen=True)
class Extension:
    """A subcommand whose module ``module`` registers it with ``module.hook(subparsers)``."""

    name: str
    module: str
    hook: str
    help: str
    checkout_only: bool = False  # its package is a folder of the repository, not installed


EXTENSIONS: tuple[Extension, ...] = (
    Extension("simulate", "harness.cli", "add_simulate_command",
              "run several scheduler replicas against one database under a seeded random program"),
    Extension("bench", "bench.cli", "add_bench_command",
              "benchmarks: claim cost, drain throughput, HTTP, shutdown, memory (from a checkout)",
              checkout_only=True),
)


def register(sub: SubParsers, extensions: Sequence[Extension] | None = None) -> None:
    """Add each extension as a subcommand that takes its arguments as they come (``parse_args``
    hands them over; the extension's own parser reads them when it runs)."""
    for extension in EXTENSIONS if extensions is None else extensions:
        parser = sub.add_parser(extension.name, help=extension.help, add_help=False,
                                description=f"{extension.help} (`scheduler {extension.name} --help` for its options)")
        parser.set_defaults(func=_runner(extension), extension_arguments=[])


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that what an extension's subcommand was given is
    left for the extension's own parser (in ``args.extension_arguments``)."""
    args, rest = parser.parse_known_args(argv)
    if rest:
        if not hasattr(args, "extension_arguments"):
            parser.error("unrecognized arguments: " + " ".join(rest))
        args.extension_arguments = rest
    return args


def _runner(extension: Extension) -> Callable[[argparse.Namespace, Settings], int]:
    def run(args: argparse.Namespace, settings: Settings) -> int:
        return run_extension(extension, list(args.extension_arguments), settings)

    return run


def run_extension(extension: Extension, argv: Sequence[str], settings: Settings) -> int:
    """Import the extension's module, let it register its real subcommand, parse ``argv``
    with it and run it."""
    module = _import(extension)
    if module is None:
        return 2
    parser = argparse.ArgumentParser(prog="scheduler")
    sub = parser.add_subparsers(dest="command", required=True)
    getattr(module, extension.hook)(sub)
    args = parser.parse_args([extension.name, *argv])
    result: int = args.func(args, settings)
    return result


def _import(extension: Extension) -> ModuleType | None:
    """The extension's module; ``None`` (after saying why) when a checkout-only package is
    not there. Any other ImportError propagates: a broken extension is a bug to report."""
    package = extension.module.split(".")[0]
    try:
        return importlib.import_module(extension.module)
    except ModuleNotFoundError as exc:
        if not extension.checkout_only or exc.name != package:
            raise
    root = checkout_root()
    if root is None or not (root / package / "__init__.py").is_file():
        print(f"`scheduler {extension.name}` runs from a checkout of the repository: its {package}/ "
              f"folder is not installed with the package. In the checkout, run `python -m {package}` "
              f"(or `.venv/bin/scheduler {extension.name}`).", file=sys.stderr)
        return None
    # An editable install of a checkout: its root holds the folder; import it from there.
    sys.path.insert(0, str(root))
    return importlib.import_module(extension.module)


def checkout_root() -> Path | None:
    """The repository this package runs from (an editable install), or ``None`` for a wheel."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "src" / "scheduler").is_dir() else None
