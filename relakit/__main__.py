"""``python -m relakit``: the same command as ``relakit`` (see ``relakit --help``)."""

import sys

from relakit.cli import main

sys.exit(main())
