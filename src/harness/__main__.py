"""``python -m harness [options]``: the same as ``scheduler simulate [options]``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from harness.cli import DESCRIPTION, add_arguments, cmd_simulate
from scheduler.config import ConfigError, Settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=cmd_simulate)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        result: int = args.func(args, Settings.from_env())
        return result
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
