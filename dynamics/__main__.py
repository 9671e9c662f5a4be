"""`python -m dynamics ...` is the same as `dynamics ...`."""

from dynamics.cli import main

raise SystemExit(main())
