"""`python -m distillery_operator` is `distillery operator`."""

import sys

from distillery.cli import main

if __name__ == "__main__":
    sys.exit(main(["operator", *sys.argv[1:]]))
