"""The errors of a write the machine refused, apart from the rest: a full disk or quota, a
file-size limit, a read-only filesystem. Its own module, importing nothing, so that the report
(which must not import torch, even indirectly) and the command line share one list."""

from __future__ import annotations

import errno

WRITE_REFUSED = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space",
                 errno.EFBIG: "raise the file-size limit (ulimit -f)", errno.EROFS: "make it writable"}
"""errno -> the fix a command's one line names. A command stops on these, exit 1, with what it
was replacing kept; code that turns other errors into notes (a report section) lets them through."""
