"""Signal handling shared by training and sweeps, torch-free so that a sweep's coordinating
process does not import torch for it.

- :func:`sigterm_as_interrupt`: SIGTERM stops work as Ctrl-C does (a KeyboardInterrupt), so
  what was running is recorded interrupted and stays resumable.
- :func:`deferred_signals`: SIGINT and SIGTERM held back across a short critical section.
- :func:`reader_may_leave`: stdout or stderr whose reader has gone (``dynamics status S | head``;
  SIGPIPE, which Python ignores, comes back as BrokenPipeError), or that cannot be written (a
  log on a full disk), drops what follows, so the command still finishes its work (a run still
  trained, a curve still saved) with no traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
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


class _Dropping:
    """A standard stream as it was, until its reader goes or a write fails; then nothing more is
    written. ``error``: the failure, where it was not a reader gone (BrokenPipeError)."""

    def __init__(self, stream):
        self._stream, self.gone, self.error = stream, False, None

    def _guard(self, call, *args):
        if not self.gone:
            try:
                return call(*args)
            except OSError as e:
                # Not only a reader gone: a log on a full disk (ENOSPC) had stopped training
                # in its progress line and marked a trained run failed.
                self.gone = True
                self.error = None if isinstance(e, BrokenPipeError) else e
                # What the stream still buffers is flushed again, at the latest at exit: to
                # /dev/null instead, where it cannot raise.
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    fd = self._stream.fileno()  # first: a stream with none (io.UnsupportedOperation) opens nothing
                    null = os.open(os.devnull, os.O_WRONLY)
                    try:
                        os.dup2(null, fd)
                    finally:
                        os.close(null)
        return None

    def write(self, text: str) -> int:
        self._guard(self._stream.write, text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._guard(self._stream.flush)

    def __getattr__(self, name):  # isatty, fileno, encoding...: the stream's own
        if name.startswith("__") or "_stream" not in self.__dict__:  # copy, pickle: not forwarded
            raise AttributeError(name)
        return getattr(self._stream, name)


@contextlib.contextmanager
def reader_may_leave():
    """sys.stdout and sys.stderr made streams that a closed pipe or a failed write does not
    stop: a command's output read by ``| head`` ended in a BrokenPipeError traceback, and one that
    prints before it saves (predict, gates) lost its result; with ``2>&1 | head`` its progress
    lines on stderr did the same. Flushed before they are put back, so nothing is left to fail at
    exit (a full disk under a buffered stdout had ended every command in exit 120).

    A stream closed when the command started (``2>&-``: Python's is None, whose isatty() failed
    `run` and `sweep`) writes to /dev/null. Yields a list that holds, once the block has ended,
    (name, error) for each stream whose writes failed other than by its reader leaving."""
    before = sys.stdout, sys.stderr
    opened = []

    def wrapped(stream):
        if stream is None:
            stream = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - closed below
            opened.append(stream)
        return _Dropping(stream)

    sys.stdout, sys.stderr = wrapped(before[0]), wrapped(before[1])
    lost: list[tuple[str, OSError]] = []
    try:
        yield lost
    finally:
        try:
            for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
                if isinstance(stream, _Dropping):
                    with contextlib.suppress(Exception):  # not over the error already on its way out
                        stream.flush()
                    if stream.error is not None:
                        lost.append((name, stream.error))
        finally:
            sys.stdout, sys.stderr = before
            for stream in opened:
                stream.close()
