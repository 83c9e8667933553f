"""``python -m harness [options]``: the same as ``scheduler simulate [options]``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from harness.cli import DESCRIPTION, add_arguments, cmd_simulate
from scheduler.cli import run_command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=cmd_simulate)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
