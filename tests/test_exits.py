"""run_to_end: the exit status and the one line for each way a command stops short."""

import errno
import io
import os
import sys
import warnings

import pytest

from dynamics.config import ConfigError
from dynamics.exits import EXIT_INTERRUPTED, run_to_end
from dynamics.usage import EXIT_BAD_INPUT, UsageError
from tests.conftest import cli_in_process


def raising(e: BaseException):
    def work() -> int:
        raise e

    return work


@pytest.mark.parametrize("code, line", [
    ("EROFS", "{err} writing s.zarr/analysis/r1; what it was replacing is kept: make it writable and run it again"),
    ("ENOSPC", "{err} writing s.zarr/analysis/r1; what it was replacing is kept: free some space and run it again"),
    # `ulimit -f`: was a traceback from every command but report, which wrote a near-empty page
    ("EFBIG", "{err} writing s.zarr/analysis/r1; what it was replacing is kept: raise the file-size limit (ulimit -f) "
              "and run it again"),
    # a read as likely as a write (a colleague's run folder of mode 700): no claim which
    ("EACCES", "{err} on s.zarr/analysis/r1; check its permissions and run it again"),
])
def test_an_operation_refused_by_the_system_is_one_line_exit_1(capsys, code, line):
    # A folder deep in the store made read-only after the up-front check (analysis/<run>) ended in
    # a PermissionError traceback; the writes are swapped in whole, so the earlier result stands.
    err = os.strerror(getattr(errno, code))
    assert run_to_end("analyse", raising(OSError(getattr(errno, code), err, "s.zarr/analysis/r1"))) == 1
    assert capsys.readouterr().err == f"dynamics: analyse stopped: {line.format(err=err)}\n"


def test_bad_input_and_interrupts_are_one_line_and_other_errors_are_bugs(capsys):
    assert run_to_end("run", lambda: 0) == 0
    assert run_to_end("run", raising(ConfigError("train.lr: must be > 0"))) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "dynamics: error: train.lr: must be > 0\n"
    assert run_to_end("status", raising(KeyboardInterrupt())) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "dynamics: interrupted; nothing was written\n"
    with pytest.raises(OSError, match="Bad file descriptor"):  # not a refusal by the system: a bug, traced
        run_to_end("status", raising(OSError(errno.EBADF, "Bad file descriptor")))
    with pytest.raises(ZeroDivisionError):
        run_to_end("status", raising(ZeroDivisionError()))


def test_a_huge_value_is_cut_in_its_refusal_and_a_long_path_or_list_is_not(capsys):
    # a 100 kB --set value was echoed whole: one line of 100 kB
    value = "x" * 100_000
    assert run_to_end("run", raising(ConfigError(f"task.name: unknown task {value!r} (induction | markov)"))) == 2
    err = capsys.readouterr().err
    assert err == f"dynamics: error: task.name: unknown task '{'x' * 199}...(100,002 characters)...{'x' * 39}' (induction | markov)\n"
    path = "/" + "/".join(["d" * 250] * 16) + ".zarr"  # 4,022 characters, near PATH_MAX (4,096): whole
    runs = ", ".join(f"run{i:04d}" for i in range(300))
    for text in (f"not a store: {path}", f"refused: {runs}"):  # 2,700 characters with spaces
        run_to_end("status", raising(UsageError(text)))
        assert capsys.readouterr().err == f"dynamics: error: {text}\n"
    # a long list, spaces and all: cut in its middle (a 1,000-number --set value was 5 kB, 100,000 0.5 MB)
    numbers = "[" + ", ".join(["7"] * 100_000) + "]"
    run_to_end("run", raising(ConfigError(f"model.n_heads: expected an integer, got {numbers}")))
    err = capsys.readouterr().err
    assert len(err) < 4200 and err.startswith("dynamics: error: model.n_heads: expected an integer, got [7, 7, ")
    assert err.endswith(", 7, 7]\n") and " ...(300,040 characters)... " in err


def test_a_refusal_naming_a_path_with_control_characters_stays_one_line(capsys, tmp_path):
    # a store path holding a newline printed its refusal as two lines
    assert run_to_end("status", raising(UsageError("no store at /tmp/a\nb\tc\x1b[2J\x7f.zarr: gone"))) == 2
    assert capsys.readouterr().err == "dynamics: error: no store at /tmp/a\\nb\\tc\\x1b[2J\\x7f.zarr: gone\n"
    name = "s\u00e9\u2028.zarr"  # not ASCII control characters: printed as given
    assert run_to_end("status", raising(UsageError(f"no store at {name}"))) == 2
    assert capsys.readouterr().err == f"dynamics: error: no store at {name}\n"
    done = cli_in_process("status", str(tmp_path / "a\nb.zarr"))
    assert done.returncode == 2 and done.stderr == f"dynamics: error: no store at {tmp_path}/a\\nb.zarr: the path does not exist\n"


def test_a_path_given_in_bytes_that_are_not_utf8_is_printed_as_those_bytes(monkeypatch):
    # argv carries them as lone surrogates; a stdout with strict errors (most UTF-8 locales) refused
    # them, so `run` trained and then died printing where it had written.
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", errors="strict"))
    name = os.fsdecode(b"s\xff.zarr")
    assert run_to_end("run", lambda: print(f"written to {name}") or 0) == 0
    sys.stdout.flush()
    assert raw.getvalue() == b"written to s\xff.zarr\n"


@pytest.mark.parametrize("encoding, written", [
    ("ascii", b"mean 0.409 +- 0.257 (s\xff.zarr) \\u2192\n"),
    ("ascii:surrogateescape", b"mean 0.409 +- 0.257 (s\xff.zarr) \\u2192\n"),  # the C locale's, UTF-8 mode off
    ("latin-1", b"mean 0.409 \xb1 0.257 (s\xff.zarr) \\u2192\n"),  # what the terminal has is kept
    ("utf-8", "mean 0.409 \u00b1 0.257 (s".encode() + b"\xff.zarr) " + "\u2192\n".encode()),
])
def test_what_a_terminals_encoding_lacks_is_spelt_out_not_a_traceback(monkeypatch, encoding, written):
    # predict's table prints "mean ± sd": an ASCII stdout (PYTHONIOENCODING=ascii, a POSIX locale
    # without C.UTF-8) ended it in a UnicodeEncodeError traceback, exit 1
    raw = io.BytesIO()
    encoding, _, errors = encoding.partition(":")
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding=encoding, errors=errors or "strict"))
    name = os.fsdecode(b"s\xff.zarr")
    assert run_to_end("predict", lambda: print(f"mean 0.409 \u00b1 0.257 ({name}) \u2192") or 0) == 0
    sys.stdout.flush()
    assert raw.getvalue() == written


@pytest.mark.parametrize("error, line", [
    # EPERM (an immutable file, a mount that forbids it) is refused like EACCES, not traced as a bug
    (OSError(errno.EPERM, "Operation not permitted", "s.zarr/derived"),
     "analyse stopped: Operation not permitted on s.zarr/derived; check its permissions and run it again"),
    # a quota is a full disk for this user
    (OSError(errno.EDQUOT, "Disk quota exceeded", "s.zarr/analysis/r1"),
     "analyse stopped: Disk quota exceeded writing s.zarr/analysis/r1; what it was replacing is kept: "
     "free some space and run it again"),
    # raised with no file named (a write of an fsspec store, an mmap): no "None" for a path
    (OSError(errno.ENOSPC, "No space left on device"),
     "analyse stopped: No space left on device; what it was replacing is kept: free some space and run it again"),
    (OSError(errno.EACCES, "Permission denied"),
     "analyse stopped: Permission denied on ?; check its permissions and run it again"),
    # the errno without its text (an OSError made by a library, errno set after): the system's text
    (OSError(errno.ENOSPC, None),
     "analyse stopped: No space left on device; what it was replacing is kept: free some space and run it again"),
    (OSError(errno.EROFS, ""),
     "analyse stopped: Read-only file system; what it was replacing is kept: make it writable and run it again"),
])
def test_each_refusal_by_the_system_names_what_it_knows(capsys, error, line):
    assert run_to_end("analyse", raising(error)) == 1
    assert capsys.readouterr().err == f"dynamics: {line}\n"


@pytest.mark.parametrize("command", ["predict", "gates", "report", "status"])
def test_sigterm_stops_every_command_as_ctrl_c_does(capsys, command):
    # Only run, analyse and sweep took it so: predict, gates and report died at once, exit 143 and
    # not a word on what was kept.
    import signal
    import time

    from dynamics.exits import AFTER_INTERRUPT

    def work() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal arrives well before: a KeyboardInterrupt out of the sleep
        return 0

    before = signal.getsignal(signal.SIGTERM)
    assert run_to_end(command, work) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == f"dynamics: interrupted; {AFTER_INTERRUPT[command]}\n"
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_interrupt_leaves_no_line_per_zarr_read_it_cut_short(caplog, monkeypatch):
    # "Task was destroyed but it is pending!" and its coroutine, up to 138 of them after the line
    # saying what was kept, for the zarr reads in flight when Ctrl-C came
    import logging

    from dynamics import exits

    monkeypatch.setattr(exits, "PROGRAM", True)  # the dynamics program, whose process ends with it
    monkeypatch.setattr(warnings, "filters", list(warnings.filters))

    assert run_to_end("analyse", raising(KeyboardInterrupt())) == EXIT_INTERRUPTED
    assert run_to_end("analyse", raising(KeyboardInterrupt())) == EXIT_INTERRUPTED  # one filter, not one per call
    assert len(logging.getLogger("asyncio").filters) == 1
    zarrs = ("Task was destroyed but it is pending!\ntask: <Task pending name='Task-1' coro=<concurrent_map.<locals>."
             "run() running at /x/zarr/core/common.py:115>>")
    theirs = "Task was destroyed but it is pending!\ntask: <Task pending name='Task-2' coro=<mine() running at nb.py:3>>"
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for text in (zarrs, theirs, "Unclosed connection"):
            logging.getLogger("asyncio").error(text)
    # zarr's only: a program that calls main keeps its own tasks' warnings
    assert [r.getMessage() for r in caplog.records] == [theirs, "Unclosed connection"]
    caplog.clear()
    shut = RuntimeError("cannot schedule new futures after shutdown")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        logging.getLogger("asyncio").error("Task exception was never retrieved\nfuture: <Task finished name='Task-9' "
                                           "coro=<concurrent_map.<locals>.run() done, defined at /x/zarr/core/common.py>>",
                                           exc_info=(RuntimeError, shut, None))
        logging.getLogger("asyncio").error("_GatheringFuture exception was never retrieved", exc_info=(RuntimeError, shut, None))
        logging.getLogger("asyncio").error("Task exception was never retrieved\nfuture: <Task mine()>",
                                           exc_info=(ValueError, ValueError("mine"), None))
    assert [r.getMessage() for r in caplog.records] == ["Task exception was never retrieved\nfuture: <Task mine()>"]
    # "Exception ignored in: <coroutine ...>" goes to sys.unraisablehook, zarr's dropped there too
    import types

    seen = []
    hook = sys.unraisablehook
    try:
        sys.unraisablehook = seen.append
        del logging.getLogger("asyncio").filters[:]
        assert run_to_end("analyse", raising(KeyboardInterrupt())) == EXIT_INTERRUPTED
        closed = types.SimpleNamespace(object="<coroutine object concurrent_map.<locals>.run>",
                                       exc_value=RuntimeError("Event loop is closed"))
        mine = types.SimpleNamespace(object="<coroutine object mine>", exc_value=ValueError("mine"))
        sys.unraisablehook(closed)
        sys.unraisablehook(mine)
        assert seen == [mine]
    finally:
        sys.unraisablehook = hook
        del logging.getLogger("asyncio").filters[:]


def test_a_program_calling_main_keeps_its_own_warnings_hooks_and_stdout_after_an_interrupt(monkeypatch):
    # An interrupted command (a notebook's kernel interrupt) had hidden, for the rest of the
    # process, every un-awaited coroutine's warning and any "Event loop is closed" error; and
    # every command left stdout's error handler its own.
    import logging

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii", errors="strict"))
    filters, hook, logged = list(warnings.filters), sys.unraisablehook, list(logging.getLogger("asyncio").filters)
    assert run_to_end("analyse", raising(KeyboardInterrupt())) == EXIT_INTERRUPTED
    assert run_to_end("status", lambda: print("0.41 \u00b1 0.02") or 0) == 0
    assert (warnings.filters, sys.unraisablehook, logging.getLogger("asyncio").filters) == (filters, hook, logged)
    assert sys.stdout.errors == "strict"
    sys.stdout.flush()
    assert raw.getvalue() == b"0.41 +- 0.02\n"  # spelt out while the command ran


def test_an_interrupt_names_what_its_stage_kept_and_falls_back_to_the_commands_line(capsys):
    from dynamics.exits import AFTER_INTERRUPT

    def work() -> int:
        raise KeyboardInterrupt

    assert run_to_end("demo", work, lambda: "predict") == EXIT_INTERRUPTED
    assert capsys.readouterr().err == f"dynamics: interrupted; {AFTER_INTERRUPT['demo predict']}\n"
    # a stage without a line of its own (the demo's sweep), or no stage yet: the command's line
    for stage in (lambda: "sweep", lambda: None):
        assert run_to_end("demo", work, stage) == EXIT_INTERRUPTED
        assert capsys.readouterr().err == "dynamics: interrupted; what was recorded is kept; the same command resumes each run, or starts one not begun\n"


def test_stage_prints_its_banner_and_names_its_first_word():
    import argparse
    import contextlib

    from dynamics.exits import stage

    args, printed = argparse.Namespace(), io.StringIO()
    with contextlib.redirect_stdout(printed):
        stage(args, 3, 4, "predict: how early is each head's final role readable?")
    assert printed.getvalue() == "== 3/4 predict: how early is each head's final role readable?\n"
    assert args.stage == "predict"


def test_clipped_cuts_a_word_past_4200_characters_and_a_line_past_8000_not_at_them():
    # from a mutation audit: `<=` as `<` cut a word of exactly the limit; no test held a line
    # between 8,000 and 80,000 characters
    from dynamics.usage import clipped

    assert clipped("x" * 4200) == "x" * 4200 and clipped("x" * 4201) != "x" * 4201
    spaced = " ".join(["1"] * 5000)  # 9,999 characters in short words
    assert len(clipped(spaced)) < 8000 and clipped(spaced[:8000]) == spaced[:8000]
