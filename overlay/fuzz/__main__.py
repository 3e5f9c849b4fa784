"""`python -m overlay.fuzz [options]`: what `apply.py fuzz` runs (command.py)."""

import sys

from overlay.fuzz.command import main

sys.exit(main())
