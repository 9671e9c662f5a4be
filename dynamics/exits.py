"""How a command ends: the exit status, and one line on stderr for each way it can stop short.

- bad input (ConfigError, UsageError, and a StoreError found up front): the error, exit 2;
- Ctrl-C or SIGTERM: what was kept (per command), exit 130;
- a full disk, a read-only filesystem or a permission refused: where, exit 1, with no
  traceback: what it was replacing is written beside it and swapped in whole;
- a reader of its output that has gone (``| head``): nothing, and the command runs to its end
  (:func:`dynamics.signals.reader_may_leave`).

Anything else is a bug, and its traceback is shown.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import sys
import warnings
from collections.abc import Callable

from dynamics.config import ConfigError
from dynamics.refused import WRITE_REFUSED
from dynamics.signals import reader_may_leave, sigterm_as_interrupt
from dynamics.usage import EXIT_BAD_INPUT, UsageError, clipped

EXIT_INTERRUPTED = 130
"""As a shell reports a command that SIGINT ended."""

AFTER_INTERRUPT = {
    # stopped before anything was made too (a config read from a pipe, a wait for a scheduler),
    # where "runs are resumable" named runs that did not exist
    "run": "what was recorded is kept; the same command resumes each run, or starts one not begun",
    "sweep": "what was recorded is kept; the same command resumes each run, or starts one not begun",
    "demo": "what was recorded is kept; the same command resumes each run, or starts one not begun",
    "analyse": "the analyses written before are whole; the other runs keep their previous analysis, if any "
               "(run the same command again to analyse them)",
    "predict": "a curve is saved whole or not at all; the store holds the previous one otherwise",
    "gates": "the gates are saved whole or not at all; the store holds the previous ones otherwise",
    "report": "the report folder holds a whole report, the previous one (if any) or, once it was in place, this one; "
              "run the same command again",
    "status": "nothing was written",
    # Past the demo's sweep every run has ended, so "resumable" said nothing of what was kept.
    "demo analyse": "training has ended (the same command retrains no finished run); the analyses written "
                    "before are whole",
    "demo predict": "training and the analysis have ended (the same command retrains no finished run); a curve "
                    "is saved whole or not at all",
    "demo report": "training, the analysis and the predictor curve have ended (the same command retrains no "
                   "finished run); the report folder holds a whole report, the previous one (if any) or, once it "
                   "was in place, this one",
}
"""What the line after an interrupt says was kept, per command, and per stage of one that has
stages (``"demo report"``: :func:`stage`)."""


def stage(args, n: int, total: int, text: str) -> None:
    """Print a stage's banner, ``== n/total text``, and name the stage (the text's first word) in
    ``args.stage`` for the line an interrupt prints (:func:`run_to_end`'s ``stage``)."""
    args.stage = text.split(":")[0].split()[0]
    print(f"== {n}/{total} {text}", flush=True)


PROGRAM = False
"""True in the ``dynamics`` program (:func:`dynamics.__main__.console` sets it), whose process ends
with the command: there what an interrupt leaves in flight is silenced process-wide. A program
that calls main keeps its own warnings filters and hooks (an interrupted command had hidden a
notebook's own un-awaited coroutines for the rest of its life)."""


def run_to_end(command: str, work: Callable[[], int], at_stage: Callable[[], str | None] = lambda: None) -> int:
    """``work()``'s exit status, or the status and one line of the way it stopped short.

    ``at_stage()``: the stage the command was in when it stopped (:func:`stage`), whose own line an
    interrupt prints where :data:`AFTER_INTERRUPT` has one."""
    put_back = _names_as_given()
    try:
        return _to_end(command, work, at_stage)
    finally:
        put_back()


def _to_end(command: str, work: Callable[[], int], at_stage: Callable[[], str | None]) -> int:
    try:
        # SIGTERM (kill, a batch system's limit) as Ctrl-C for every command: predict, gates and
        # report died of it at once, exit 143 and not a word, leaving a figures folder behind
        with reader_may_leave() as lost, sigterm_as_interrupt():
            code = work()
        return _output_lost(command, code, lost) if lost else code
    except (ConfigError, UsageError) as e:
        print(f"dynamics: error: {clipped(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # one zarr was waiting for leaves a coroutine never run: no warning of it at exit
        if PROGRAM:
            warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
            _quiet_pending_tasks()
        kept = AFTER_INTERRUPT.get(f"{command} {at_stage()}") or AFTER_INTERRUPT.get(command, AFTER_INTERRUPT["run"])
        print(f"dynamics: interrupted; {kept}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:
        # an OSError made in code (a library's own raise) may carry the errno without its text
        reason = e.strerror or (os.strerror(e.errno) if isinstance(e.errno, int) else None)
        if e.errno in (errno.EACCES, errno.EPERM):  # a read as likely as a write: no claim which
            print(f"dynamics: {command} stopped: {reason} on {e.filename or '?'}; check its permissions "
                  f"and run it again", file=sys.stderr)
            return 1
        fix = WRITE_REFUSED
        if e.errno not in fix:
            raise
        # A full disk (or a read-only filesystem) is no bug to trace: analyses, derived results and
        # report pages are written beside what they replace and swapped in whole: the earlier stands.
        where = f" writing {e.filename}" if e.filename else ""
        print(f"dynamics: {command} stopped: {reason}{where}; what it was replacing is kept: "
              f"{fix[e.errno]} and run it again", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - a one-line message for store problems found up front
        from dynamics.store import StoreError  # here: the store imports zarr, which --help need not

        if isinstance(e, StoreError):
            print(f"dynamics: error: {clipped(str(e))}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise


def _quiet_pending_tasks() -> None:
    """No lines at exit for the zarr reads an interrupt left in flight: "Task was destroyed but it
    is pending!", "Task exception was never retrieved" ("cannot schedule new futures after
    shutdown") and "Exception ignored in: <coroutine ...>" ("Event loop is closed"), each with its
    coroutine or traceback, up to 700 lines after the one saying what was kept. asyncio logs the
    first two, the interpreter hands the third to sys.unraisablehook; the interrupt has said all
    there is to say. Once, and in the ``dynamics`` program only (:data:`PROGRAM`)."""
    import logging

    def from_zarr(text: str, error: BaseException | None) -> bool:
        said = str(error) if error is not None else ""
        return "zarr" in text or said in ("cannot schedule new futures after shutdown", "Event loop is closed")

    if not any(getattr(f, "_dynamics", False) for f in logging.getLogger("asyncio").filters):
        def zarr_tasks(record) -> bool:
            text = record.getMessage()
            error = record.exc_info[1] if record.exc_info else None
            return not (("Task was destroyed but it is pending" in text or "exception was never retrieved" in text)
                        and from_zarr(text, error))

        zarr_tasks._dynamics = True
        logging.getLogger("asyncio").addFilter(zarr_tasks)
        before = sys.unraisablehook

        def unraisable(u) -> None:
            if not from_zarr(repr(u.object), u.exc_value):
                before(u)

        sys.unraisablehook = unraisable


def _output_lost(command: str, code: int, lost: list[tuple[str, OSError]]) -> int:
    """Exit 1 (or the command's own failure) where its output could not all be written (a log on
    a full disk), said on stderr where that is not the stream that failed; its work is done."""
    if all(name != "stderr" for name, _ in lost):
        said = "; ".join(f"{name}: {e.strerror or e}" for name, e in lost)
        with contextlib.suppress(OSError):
            print(f"dynamics: {command} finished its work, but not all of its output could be written ({said})",
                  file=sys.stderr, flush=True)
    return code or 1


def _names_as_given() -> Callable[[], None]:
    """Let stdout write whatever a command prints, on any terminal.

    A path given in bytes that are not UTF-8 is written back as those bytes: Python carries them
    as lone surrogates, which a stdout with strict errors (a UTF-8 locale other than C.UTF-8, or
    ``PYTHONIOENCODING``) refused, so `run` trained, then died printing where it had written. A
    character the terminal's encoding lacks is spelled in ASCII (``±`` as ``+-``): an ASCII or
    Latin-1 stdout had ended `predict` in a UnicodeEncodeError traceback at its table. stderr
    already escapes both (backslashreplace). Returns what puts stdout's own handler back, as a
    program calling main had it."""
    stream = sys.stdout
    # surrogateescape: Python's own in the C locale without UTF-8 mode, where '±' failed as well
    own = getattr(stream, "errors", None)
    if own not in ("strict", "surrogateescape") or not hasattr(stream, "reconfigure"):
        return lambda: None
    stream.reconfigure(errors=_OUT_ERRORS)

    def put_back() -> None:
        with contextlib.suppress(Exception):  # a stream closed, or whose disk is full, meanwhile
            stream.reconfigure(errors=own)

    return put_back


_OUT_ERRORS = "dynamics-stdout"
_ASCII = {"±": "+-", "∓": "-+", "·": "-", "²": "^2", "≥": ">=", "≤": "<=", "×": "x", "—": "--", "–": "-"}


def _spell_out(e: UnicodeError) -> tuple[bytes, int]:
    r"""Encode error handler: a lone surrogate (an undecodable byte of argv) as its byte, a
    character of `_ASCII` as its spelling, any other as Python's backslash escape.

    Example
    -------
    >>> ("0.409 ± 0.257 s" + "\udcff" + "\u2192").encode("ascii", _OUT_ERRORS)
    b'0.409 +- 0.257 s\xff\\u2192'
    """
    if not isinstance(e, UnicodeEncodeError):
        raise e
    out = b""
    for ch in e.object[e.start:e.end]:
        if 0xDC80 <= ord(ch) <= 0xDCFF:
            out += bytes([ord(ch) - 0xDC00])
        else:
            spelt = _ASCII.get(ch) or ch.encode("ascii", "backslashreplace").decode("ascii")
            out += spelt.encode(e.encoding, "backslashreplace")
    return out, e.end


codecs.register_error(_OUT_ERRORS, _spell_out)
