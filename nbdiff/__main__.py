"""``python -m nbdiff``: the command line (see ``nbdiff --help``)."""

import sys

from nbdiff.cli import main

sys.exit(main())
