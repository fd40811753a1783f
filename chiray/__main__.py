"""``python -m chiray``: the command line (see ``chiray.cli``)."""

import sys

from chiray.cli import main

sys.exit(main())
