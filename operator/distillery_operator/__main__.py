"""`python -m distillery_operator` is `distillery operator`."""

import sys

from distillery.cli import main

sys.exit(main(["operator", *sys.argv[1:]]))
