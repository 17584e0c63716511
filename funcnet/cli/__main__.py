"""``python -m funcnet.cli``: the ``funcnet`` command."""

import sys

from funcnet.cli import main

sys.exit(main())
