"""deferred_signals: SIGINT and SIGTERM held across a critical section, then delivered once; with
second_goes_through, a second one is delivered at once. reader_may_leave: stdout a closed pipe
does not stop."""

import signal

import pytest

from dynamics.signals import deferred_signals, sigterm_as_interrupt


def test_signals_in_a_section_are_held_and_the_first_delivered_at_its_end():
    reached = []
    with sigterm_as_interrupt(), pytest.raises(KeyboardInterrupt):
        with deferred_signals():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)
            reached.append("end of the section")
    assert reached == ["end of the section"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_a_second_signal_goes_through_at_once_where_asked():
    # import_analysers holds signals across imports, which a cold disk can make long: a second
    # Ctrl-C waited for all of them, and a third and fourth were dropped.
    reached = []
    with sigterm_as_interrupt(), pytest.raises(KeyboardInterrupt):
        with deferred_signals(second_goes_through=True):
            signal.raise_signal(signal.SIGINT)
            reached.append("after the first")
            signal.raise_signal(signal.SIGINT)
            reached.append("after the second")
    assert reached == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with deferred_signals(second_goes_through=True):  # one alone is held to the end, as by default
        pass


def test_a_reader_leaving_stdout_stops_neither_the_command_nor_its_exit(monkeypatch):
    import io
    import os
    import sys

    from dynamics.signals import reader_may_leave

    read, write = os.pipe()
    os.close(read)  # `| head` has exited: a write raises BrokenPipeError (Python ignores SIGPIPE)
    stream = io.TextIOWrapper(io.FileIO(write, "w"))
    monkeypatch.setattr(sys, "stdout", stream)
    done = []
    with reader_may_leave():
        print("x" * 200_000)  # more than a pipe holds, so it is written (and fails) here
        print("the rest")
        done.append(sys.stdout.gone)
    assert done == [True] and sys.stdout is stream  # put back, and nothing left to fail at exit
    stream.write("buffered")
    stream.flush()  # to /dev/null now
    stream.close()


def test_stderr_too_and_an_error_on_its_way_out_is_not_replaced(monkeypatch):
    # `dynamics predict S 2>&1 | head`: the progress lines on stderr hit the closed pipe first
    import copy
    import io
    import os
    import sys

    from dynamics.signals import reader_may_leave

    read, write = os.pipe()
    os.close(read)
    stream = io.TextIOWrapper(io.FileIO(write, "w"))
    monkeypatch.setattr(sys, "stderr", stream)
    with reader_may_leave():
        print("[predict] fitting", file=sys.stderr, flush=True)
        sys.stderr.writelines(["a\n", "b\n"])
        assert sys.stderr.gone
        copy.copy(sys.stderr)  # forwarded attributes do not recurse
    assert sys.stderr is stream
    stream.close()

    class Full(io.StringIO):
        def flush(self):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(sys, "stdout", Full())
    with pytest.raises(KeyboardInterrupt), reader_may_leave():
        print("x")
        raise KeyboardInterrupt  # the flush on the way out fails: the interrupt still comes through
    assert isinstance(sys.stdout, Full)  # and the stream is put back
