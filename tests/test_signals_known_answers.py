"""dynamics.signals with real signals: os.kill on this process, or a child ``python -c`` sent
them by this one, or given a pipe whose reader has gone. No handler is replaced by a mock: the
handlers the sections hand signals on to record what reaches them."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from dynamics.signals import deferred_signals, reader_may_leave, sigterm_as_interrupt

REPO = Path(__file__).resolve().parents[1]
BOTH = (signal.SIGINT, signal.SIGTERM)
WAIT = 120  # seconds a child may take; never reached unless it hangs


@pytest.fixture
def received():
    """SIGINT and SIGTERM handled by a handler that records them (in order) and returns, in
    place for the test and then replaced by what was there before."""
    got = []

    def record(signum, frame):
        got.append(signum)

    before = {s: signal.signal(s, record) for s in BOTH}
    try:
        yield got, record
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def kill(signum):
    os.kill(os.getpid(), signum)  # to the main thread, this one; handled before os.kill returns


def test_held_signals_reach_the_handler_once_at_the_end_of_the_section(received):
    got, record = received
    with deferred_signals():
        kill(signal.SIGTERM)
        kill(signal.SIGINT)
        kill(signal.SIGTERM)
        assert got == []  # held
    assert got == [signal.SIGTERM]  # the first, once, to the handler that was in place
    assert all(signal.getsignal(s) is record for s in BOTH)


def test_one_held_signal_is_delivered_at_the_end_also_where_a_second_would_go_through(received):
    got, record = received
    with deferred_signals(second_goes_through=True):
        kill(signal.SIGINT)
        assert got == []
    assert got == [signal.SIGINT]
    assert all(signal.getsignal(s) is record for s in BOTH)


def test_a_second_signal_goes_through_at_once_and_later_ones_are_not_held(received):
    got, record = received
    with deferred_signals(second_goes_through=True):
        kill(signal.SIGTERM)
        assert got == []
        kill(signal.SIGINT)
        assert got == [signal.SIGINT]  # delivered before the section ends
        assert all(signal.getsignal(s) is record for s in BOTH)  # the section's handlers are gone
        kill(signal.SIGTERM)
        assert got == [signal.SIGINT, signal.SIGTERM]
    assert got == [signal.SIGINT, signal.SIGTERM]  # the held first is not delivered after the second
    assert all(signal.getsignal(s) is record for s in BOTH)


def test_a_section_left_by_an_error_puts_the_handlers_back_and_delivers_what_it_held(received):
    got, record = received
    with pytest.raises(ZeroDivisionError), deferred_signals():
        kill(signal.SIGINT)
        1 / 0  # noqa: B018
    assert got == [signal.SIGINT]
    assert all(signal.getsignal(s) is record for s in BOTH)


def test_sigterm_as_interrupt_raises_keyboard_interrupt_and_puts_the_handler_back(received):
    got, record = received
    with pytest.raises(KeyboardInterrupt, match=f"^signal {int(signal.SIGTERM)}$"), sigterm_as_interrupt():
        kill(signal.SIGTERM)
    assert got == [] and signal.getsignal(signal.SIGTERM) is record
    with sigterm_as_interrupt():
        kill(signal.SIGINT)  # SIGINT is left to its handler
    assert got == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is record


def test_off_the_main_thread_both_sections_leave_the_handlers_alone(received):
    # signal.signal raises ValueError off the main thread: a section entered from a writer or
    # worker thread would fail instead of doing nothing
    got, record = received
    errors = []

    def work():
        try:
            with deferred_signals(), deferred_signals(second_goes_through=True), sigterm_as_interrupt():
                assert all(signal.getsignal(s) is record for s in BOTH)
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join(WAIT)
    assert not t.is_alive() and errors == []
    assert got == [] and all(signal.getsignal(s) is record for s in BOTH)


def child(code: str, *args: str, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTHONUNBUFFERED", None)  # stdout buffered, as a command's is when piped
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env, cwd=REPO, text=True,
                            **kwargs)


def test_sigterm_from_another_process_is_held_by_the_section_then_interrupts_as_ctrl_c():
    proc = child("""
        import sys
        from dynamics.exits import run_to_end
        from dynamics.signals import deferred_signals, sigterm_as_interrupt

        def work():
            with sigterm_as_interrupt():
                with deferred_signals():
                    print("ready", flush=True)
                    sys.stdin.readline()  # the parent sends SIGTERM, then this line
                    print("section done", flush=True)
                print("not reached", flush=True)
            return 0

        sys.exit(run_to_end("status", work))
    """, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate("go\n", timeout=WAIT)
    finally:
        proc.kill()
    assert (proc.returncode, out, err) == (130, "section done\n", "dynamics: interrupted; nothing was written\n")


# A command whose output is read by `| head`: the reader goes while the command still writes.
WRITES = """
    import os, sys
    from dynamics.exits import run_to_end

    def fds():
        return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0

    def work():
        before = fds()
        print("first line", flush=True)
        sys.stdin.readline()  # the reader has gone when this line comes
        print("buffered, not yet written")  # only written (and failing) as the command ends
        {more}
        left_open = fds() - before
        open(sys.argv[1], "w").write(f"finished {{left_open}}")  # the work after the output
        return 0

    sys.exit(run_to_end("status", work))
"""


@pytest.mark.parametrize("more", ["", "print('x' * 200_000)  # past what a pipe holds: fails here"],
                         ids=["buffered", "past_a_pipe"])
def test_a_reader_that_leaves_early_gives_no_traceback_and_exit_0(tmp_path, more):
    marker = tmp_path / "marker"
    proc = child(WRITES.format(more=more), str(marker), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == "first line\n"
        proc.stdout.close()  # `head -1` has exited
        proc.stdin.write("go\n")
        proc.stdin.close()
        err = proc.stderr.read()
        proc.wait(WAIT)
    finally:
        proc.kill()
        proc.stderr.close()  # left to the collector, it warned in whichever test ran then
    # no "Exception ignored ... BrokenPipeError" at exit (status 120) and no file descriptor left open
    assert (proc.returncode, err, marker.read_text()) == (0, "", "finished 0")


def test_stdout_and_stderr_to_a_pipe_already_closed_exit_0_with_the_work_done(tmp_path):
    # `dynamics predict S 2>&1 | head -0`: nothing can be written anywhere, and nothing need be
    marker = tmp_path / "marker"
    read, write = os.pipe()
    os.close(read)
    try:
        # a progress line not yet ended: held in stderr's buffer until the command ends
        proc = child(WRITES.format(more="sys.stderr.write('progress')"), str(marker),
                     stdin=subprocess.PIPE, stdout=write, stderr=write)
    finally:
        os.close(write)
    try:
        proc.communicate("go\n", timeout=WAIT)
    finally:
        proc.kill()
    assert (proc.returncode, marker.read_text()) == (0, "finished 0")


def test_writes_answer_their_length_and_the_stream_keeps_its_own_attributes(monkeypatch):
    import io

    read, write = os.pipe()
    stream = io.TextIOWrapper(io.FileIO(write, "w"), encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stdout", stream)
    try:
        with reader_may_leave():
            out = sys.stdout
            assert (out.fileno(), out.isatty(), out.encoding, out.closed) == (write, False, "utf-8", False)
            assert out.write("abc") == 3 and not out.gone
            out.writelines(["d\n", "e\n"])
            assert os.read(read, 100) == b"abcd\ne\n"
            os.close(read)
            assert out.write("fg") == 2 and out.gone
            assert out.write("h") == 1
    finally:
        stream.close()


def test_copy_and_pickle_see_no_attributes_forwarded_from_the_stream():
    # copy and pickle make the object bare (no stream yet) and look up dunder names on it and
    # on the original: those are the class's own, never the stream's, and never a recursion
    import io

    from dynamics.signals import _Dropping

    bare = _Dropping.__new__(_Dropping)
    for name in ("encoding", "__setstate__"):
        with pytest.raises(AttributeError):
            getattr(bare, name)
    assert not hasattr(_Dropping(io.StringIO()), "__next__")


def test_a_stream_without_a_descriptor_whose_reader_left_leaves_no_descriptor_open():
    # /dev/null was opened before the stream was asked for its descriptor: one that has none
    # (io.UnsupportedOperation, an in-memory stream standing in for stdout) leaked one per stream
    import io

    from dynamics.signals import _Dropping

    class Gone(io.StringIO):
        def write(self, text):
            raise BrokenPipeError

    before = len(os.listdir("/proc/self/fd"))
    dropping = _Dropping(Gone())
    assert dropping.write("x") == 1 and dropping.gone
    assert len(os.listdir("/proc/self/fd")) == before
