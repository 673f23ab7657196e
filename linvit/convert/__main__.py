"""`python -m linvit.convert ...`: the command standalone."""

import sys

from .command import main

sys.exit(main())
