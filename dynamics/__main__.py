"""`python -m dynamics ...` is the same as `dynamics ...`."""

from dynamics.cli import console

raise SystemExit(console())
