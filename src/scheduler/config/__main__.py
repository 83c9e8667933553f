"""``python -m scheduler.config``: the README's configuration table (``readme.main``)."""

import sys

from scheduler.config.readme import main

sys.exit(main())
