"""`python -m distillery_cli ...` is `distillery ...` (for a process started by its interpreter)."""

import sys

from distillery_cli.main import main

sys.exit(main())
