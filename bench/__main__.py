"""``python -m bench``: the same command as ``scheduler bench``."""

import sys

from bench.cli import main

sys.exit(main())
