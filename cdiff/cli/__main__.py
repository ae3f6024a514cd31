"""`python -m cdiff.cli`: the `cdiff` command."""

import sys

from . import main

sys.exit(main())
