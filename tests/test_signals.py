"""deferred_signals: SIGINT and SIGTERM held across a critical section, then delivered once; with
second_goes_through, a second one is delivered at once."""

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
