"""Signal handling shared by training and sweeps, torch-free so that a sweep's coordinating
process does not import torch for it.

- :func:`sigterm_as_interrupt`: SIGTERM stops work as Ctrl-C does (a KeyboardInterrupt), so
  what was running is recorded interrupted and stays resumable.
- :func:`deferred_signals`: SIGINT and SIGTERM held back across a short critical section.
"""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def deferred_signals(*, second_goes_through: bool = False):
    """Hold SIGINT and SIGTERM back for a short critical section (the final status write), then
    deliver them to their own handlers. Python runs signal handlers in the main thread whichever
    thread the kernel picks, so a blocked signal mask would not do: the handlers are swapped.

    ``second_goes_through``: for a section that may take long (imports from a slow disk), a
    second signal is not held but delivered at once, so that a user who presses Ctrl-C again
    is not kept waiting; by default only the first is delivered, at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous: dict = {}

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)
        previous.clear()

    def hold(signum, frame):
        got.append(signum)
        if second_goes_through and len(got) > 1:
            restore()
            signal.raise_signal(signum)  # to the handler that was in place, as this one returns

    previous.update({s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)})
    try:
        yield
    finally:
        if previous:  # else a second signal went through already
            restore()
            for signum in got[:1]:
                signal.raise_signal(signum)  # now, to the handler that was in place, in this (the main) thread


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (``kill``, a batch system's time limit) stops a run or a sweep as Ctrl-C does,
    so a run is recorded interrupted and stays resumable instead of dying marked "running"."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
