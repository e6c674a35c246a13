"""`python -m distillery_runtime.prestop`: the command every rendered RayJob's head runs as its preStop hook.

The hook lives in `run/prestop.py`; this module keeps the name the operator renders (and the goldens and
running clusters carry), so moving the code did not change the command.
"""

from __future__ import annotations

from distillery_runtime.run.prestop import main

if __name__ == "__main__":
    raise SystemExit(main())
