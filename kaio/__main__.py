"""``python -m kaio``: the same as the ``kaio`` command."""

import sys

from kaio.cli import main

sys.exit(main())
