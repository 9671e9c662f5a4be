"""Control characters in what a command prints, escaped: refusals quote the input they refuse,
tables and notes a store's values, and either may come from anyone.

Torch-free, as `status` and `report` are."""

from __future__ import annotations

ESCAPED = {i: repr(chr(i))[1:-1] for i in (*range(32), 127)}
_SHOWN = {**ESCAPED, **{i: f"\\x{i:02x}" for i in range(128, 160)}}


def escaped(text) -> str:
    """``text`` (made a str) with its control characters escaped (``\\x1b``, ``\\r``; the C1 set too),
    for what a command prints from a store: a store from elsewhere whose values held escape
    sequences cleared the terminal and redrew `status`'s table with other losses.

    Example
    -------
    >>> escaped("0.5\\x1b[2J\\rfake")
    '0.5\\\\x1b[2J\\\\rfake'
    """
    return str(text).translate(_SHOWN)
