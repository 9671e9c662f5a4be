"""A local path made absolute as the operating system reads it.

``os.path.abspath`` and ``normpath`` drop ``name/..`` as text, where the kernel goes up from
wherever ``name`` leads: past a symbolic link, from its target's folder. xarray applies abspath to
every store path it is given, so ``lnk/../s.zarr`` (``lnk`` a link into another tree) named one
store to `run` and `status`, which let the kernel read it, and another to `sweep` and every reader
of arrays: one ``--out`` split into two stores, and `analyse` failed on every run. Every local
store and report path goes through :func:`absolute` once, so that all of them read the same one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_UNDECODED = re.compile("[\udc80-\udcff]+")


def absolute(path: str | os.PathLike) -> Path:
    """``path`` (``~`` expanded) absolute, with each ``..`` taken as the kernel takes it: the part
    up to its last ``..`` resolved (symbolic links followed) where it exists, the rest kept as given,
    so that a store that is itself a link keeps its own name (a report goes next to the link, as before).

    >>> str(absolute("/../x/y/s.zarr")), str(absolute("/x/y/s.zarr")), str(absolute("/nowhere/../s.zarr"))
    ('/x/y/s.zarr', '/x/y/s.zarr', '/nowhere/../s.zarr')
    """
    p = Path(path).expanduser().absolute()
    if ".." not in p.parts:
        return p
    last = len(p.parts) - 1 - p.parts[::-1].index("..")
    head = Path(*p.parts[: last + 1])
    if not head.exists():
        # `new/..` with no `new`: the kernel finds nothing there, where realpath drops the pair;
        # kept as given, it is made (`run` makes `new`) and then read where the kernel reads it
        return p
    return Path(os.path.realpath(head), *p.parts[last + 1:])


def shown(name: str | bytes) -> str:
    r"""A path, or text naming one, as UTF-8 can hold it (a report page): the bytes of a name that
    the filesystem encoding could not decode (lone surrogates in Python) decoded as UTF-8, U+FFFD
    where they are not UTF-8 either; written as they were, they made the page unwritable.

    Only those bytes: the whole page had been put through the filesystem encoding, which garbled
    it in a Latin-1 locale ("·" as U+FFFD) and failed in an ASCII one (a traceback, no report).

    Examples
    --------
    >>> shown("s\udcff.zarr · caf\udcc3\udca9"), shown(b"s\xff.zarr")
    ('s�.zarr · café', 's�.zarr')
    """
    if isinstance(name, bytes):
        return name.decode("utf-8", "replace")
    return _UNDECODED.sub(lambda m: bytes(ord(c) - 0xDC00 for c in m.group()).decode("utf-8", "replace"), name)
