"""Helpers shared by the bench scripts (imported as ``bench._common`` once a script has put the
repository root on ``sys.path``)."""

from __future__ import annotations

from pathlib import Path


def load_line() -> str:
    """The 1, 5 and 15 minute load averages, printed next to timings: other load on the machine skews them."""
    try:
        return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average n/a"
