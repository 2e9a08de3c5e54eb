"""``python -m hapc.cli``: the ``hapc`` command."""

import sys

from hapc.cli import main

sys.exit(main())
