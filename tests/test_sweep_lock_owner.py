"""A sweep lock taken over while its old holder lives on (its heartbeat stalled past the limit,
say on a suspended laptop): the old holder must leave the new lock alone. And the staleness rule
at its edges."""

from __future__ import annotations

import socket
import threading
import time

from dynamics.sweep import acquire_lock, lock_stale_reason, read_lock
from dynamics.sweep.lock import _describe
from tests.test_sweep_lock import plant_lock


def test_a_holder_whose_lock_was_taken_over_does_not_remove_the_new_one(tmp_path):
    lock = acquire_lock(str(tmp_path), heartbeat_every=3600)
    try:
        plant_lock(tmp_path, token="newer")  # the launcher that took it over, live
        assert not lock.owned()
    finally:
        lock.release()
    assert read_lock(str(tmp_path))["token"] == "newer"


def test_a_holder_whose_lock_was_taken_over_stops_its_heartbeat(tmp_path):
    # The holder's own thread never beats here (an hour apart): a lock planted while a beat was
    # between its look and its write was overwritten by that write, a window a stalled test could
    # hit at a beat every 0.2 s. The beat that sees the newer lock runs on a thread of the test's.
    lock = acquire_lock(str(tmp_path), heartbeat_every=3600)
    try:
        plant_lock(tmp_path, token="newer")
        beat = threading.Thread(target=lock._beat, args=(0.01,))
        beat.start()
        beat.join(timeout=60)  # bounds a hang, not a timed assertion
        # a beat that went on wrote its own lock over the newer holder's: two launchers on one store
        assert not beat.is_alive()
        assert read_lock(str(tmp_path))["token"] == "newer"
    finally:
        lock.release()


def test_a_lock_is_stale_only_past_the_limit():
    info = {"host": "some-other-host", "pid": 1, "heartbeat": 1000.0}
    assert lock_stale_reason(info, stale_after=120, now=1120.0) is None
    assert lock_stale_reason(info, stale_after=120, now=1121.0) == "last heartbeat 121 s ago (> 120 s)"


def test_a_pid_no_process_can_have_is_not_running():
    # a hand-edited or foreign lock on this host: os.kill raised OverflowError for it
    info = {"host": socket.gethostname(), "pid": 2**70, "heartbeat": time.time()}
    assert lock_stale_reason(info) == f"pid {2**70} is not running on {socket.gethostname()}"


def test_the_holder_is_described_with_the_age_of_its_heartbeat():
    info = {"pid": 42, "host": "h", "started": "2024-01-02 03:04:05", "heartbeat": 1000.0}
    assert _describe(info, now=1050.0) == "pid 42 on host h, started 2024-01-02 03:04:05, last heartbeat 50 s ago"
    assert _describe({"corrupt": True, "heartbeat": 1000.0}, now=1007.0) == "an unreadable lock, last written 7 s ago"
