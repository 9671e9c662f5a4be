"""The store lock STORE/sweep.lock (dynamics.sweep.lock): held, refused, heartbeat, taken over when
stale, and never seen half written."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from dynamics import store
from dynamics.sweep import LOCK_NAME, SweepLockError, acquire_lock, lock_path, lock_stale_reason, read_lock
from dynamics.sweep import lock as lock_module
from tests.test_sweep import cli, tiny, write_toml


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def plant_lock(path: Path, **info) -> None:
    lock = {"pid": os.getpid(), "host": socket.gethostname(), "started": "then", "heartbeat": time.time(),
            "token": "planted"}
    lock.update(info)
    Path(lock_path(str(path))).write_text(json.dumps(lock))


def test_lock_refuses_a_second_holder_and_is_removed_on_release(tmp_path):
    with acquire_lock(str(tmp_path)) as lock:
        held = read_lock(str(tmp_path))
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        assert held["token"] == lock.token and "heartbeat" in held and "started" in held
        with pytest.raises(SweepLockError, match=f"another sweep \\(pid {os.getpid()} on host"):
            acquire_lock(str(tmp_path))
    assert not (tmp_path / LOCK_NAME).exists()
    acquire_lock(str(tmp_path)).release()  # free again


def test_lock_heartbeat_refreshes(tmp_path):
    with acquire_lock(str(tmp_path), heartbeat_every=0.05):
        first = read_lock(str(tmp_path))["heartbeat"]
        for _ in range(200):  # bounded poll, not a timed assertion
            time.sleep(0.02)
            if read_lock(str(tmp_path))["heartbeat"] > first:
                break
        assert read_lock(str(tmp_path))["heartbeat"] > first


def test_stale_lock_of_a_dead_pid_is_taken_over(tmp_path):
    pid = dead_pid()
    plant_lock(tmp_path, pid=pid)
    assert "not running" in lock_stale_reason(read_lock(str(tmp_path)))
    with acquire_lock(str(tmp_path)) as lock:
        assert read_lock(str(tmp_path))["token"] == lock.token
    assert not (tmp_path / LOCK_NAME).exists()
    assert list(tmp_path.iterdir()) == []  # no stale leftovers


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc to see a zombie")
def test_a_lock_of_a_killed_launcher_not_yet_reaped_is_taken_over(tmp_path):
    # A launcher killed (`timeout -s KILL`) and not yet reaped by its parent is a zombie, which
    # still answers signal 0: the rerun was refused until the heartbeat went stale, 120 s later.
    p = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    try:
        for _ in range(500):  # bounded poll for the zombie state, not a timed assertion
            if Path(f"/proc/{p.pid}/stat").read_bytes().rsplit(b")", 1)[1][1:2] == b"Z":
                break
            time.sleep(0.01)
        else:
            pytest.fail("the killed child never became a zombie")
        plant_lock(tmp_path, pid=p.pid)
        assert lock_stale_reason(read_lock(str(tmp_path))) == f"pid {p.pid} is not running on {socket.gethostname()}"
        with acquire_lock(str(tmp_path)) as lock:
            assert read_lock(str(tmp_path))["token"] == lock.token
    finally:
        p.wait()


def test_stale_lock_of_an_old_heartbeat_is_taken_over(tmp_path):
    plant_lock(tmp_path, host="some-other-host", pid=1, heartbeat=time.time() - 3600)
    assert "heartbeat" in lock_stale_reason(read_lock(str(tmp_path)))
    with acquire_lock(str(tmp_path)) as lock:
        assert read_lock(str(tmp_path))["token"] == lock.token


def test_live_lock_from_another_host_is_respected(tmp_path):
    plant_lock(tmp_path, host="some-other-host", pid=1)
    assert lock_stale_reason(read_lock(str(tmp_path))) is None
    with pytest.raises(SweepLockError, match="some-other-host"):
        acquire_lock(str(tmp_path))
    assert read_lock(str(tmp_path))["token"] == "planted"


def test_a_lock_being_written_is_not_taken_over_until_it_is_old(tmp_path):
    # On a filesystem without hard links a launcher creates its lock (O_EXCL) and then writes it:
    # in between, the file is empty.
    # An unreadable lock is judged by its age (its modification time), so a second launcher
    # must be refused while it is fresh, and take it over only once it is older than the limit.
    target = Path(lock_path(str(tmp_path)))
    target.write_bytes(b"")
    assert lock_stale_reason(read_lock(str(tmp_path))) is None
    with pytest.raises(SweepLockError, match="unreadable lock"):
        acquire_lock(str(tmp_path))
    assert target.read_bytes() == b""  # left alone
    old = time.time() - 3600
    os.utime(target, (old, old))  # a launcher that died between creating and writing its lock
    assert "heartbeat" in lock_stale_reason(read_lock(str(tmp_path)))
    with acquire_lock(str(tmp_path)) as lock:
        assert read_lock(str(tmp_path))["token"] == lock.token
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("heartbeat", ['"x"', "null", "NaN", "true", "[1]"])
def test_a_lock_whose_heartbeat_is_no_time_is_judged_as_an_unreadable_one(tmp_path, heartbeat):
    # "x" was a ValueError traceback from float(); NaN was never stale, however old the lock
    target = Path(lock_path(str(tmp_path)))
    target.write_text(f'{{"pid": 1, "host": "some-other-host", "token": "planted", "heartbeat": {heartbeat}}}')
    with pytest.raises(SweepLockError, match="an unreadable lock, last written "):
        acquire_lock(str(tmp_path))
    old = time.time() - 3600
    os.utime(target, (old, old))
    with acquire_lock(str(tmp_path)) as lock:
        assert read_lock(str(tmp_path))["token"] == lock.token


def test_a_lock_is_never_seen_half_written(tmp_path, monkeypatch):
    # Created empty (O_EXCL) and then written, the lock was read in between by a second launcher
    # (the distributed test's, under load), which was told of "an unreadable lock, last written
    # 0 s ago" instead of the pid holding it. Every write of the lock's bytes is a moment to look.
    import builtins

    from dynamics.sweep import lock as lock_module

    seen = []

    class Looking:
        def __init__(self, f):
            self.f = f

        def write(self, blob):
            seen.append(read_lock(str(tmp_path)))
            return self.f.write(blob)

        def __getattr__(self, name):  # reads, and the rest, as the file's own
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    real_open, real_fdopen = builtins.open, os.fdopen
    monkeypatch.setattr(lock_module, "open", lambda *a, **k: Looking(real_open(*a, **k)), raising=False)
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: Looking(real_fdopen(*a, **k)))
    with acquire_lock(str(tmp_path), heartbeat_every=3600) as lock:
        assert read_lock(str(tmp_path))["token"] == lock.token
    assert seen and all(s is None or s.get("token") == lock.token for s in seen), seen
    assert list(tmp_path.iterdir()) == []  # nor a temporary file left behind


def test_a_filesystem_without_hard_links_still_takes_the_lock_exclusively(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")  # as some FUSE and SMB mounts say

    monkeypatch.setattr(os, "link", no_links)
    with acquire_lock(str(tmp_path), heartbeat_every=3600) as lock:
        assert read_lock(str(tmp_path))["token"] == lock.token
        with pytest.raises(SweepLockError, match=f"another sweep \\(pid {os.getpid()} on host"):
            acquire_lock(str(tmp_path))
        assert [p.name for p in tmp_path.iterdir()] == [LOCK_NAME]
    assert list(tmp_path.iterdir()) == []


def test_lock_on_an_fsspec_url():
    url = f"memory://dynamics-test-{os.getpid()}/store.zarr"
    with acquire_lock(url) as lock:
        assert read_lock(url)["token"] == lock.token
        with pytest.raises(SweepLockError, match="another sweep"):
            acquire_lock(url)
    assert read_lock(url) is None


def test_a_file_url_locks_the_folder_it_names_as_a_plain_path_does(tmp_path, monkeypatch):
    # Taken for a remote URL, a file:// store's lock was fsspec's check-then-write (two launchers
    # started together both held it: 12 of 40 tries) at a path with its %-escapes left in (a
    # FileNotFoundError once the store "my store.zarr" had been made).
    folder = tmp_path / "my store.zarr"
    folder.mkdir()
    url = "file://" + quote(str(folder))
    assert "%20" in url
    placed = []
    real_place = lock_module._place
    monkeypatch.setattr(lock_module, "_place", lambda src, target: placed.append(target) or real_place(src, target))
    with acquire_lock(url) as lock:
        assert placed == [str(folder / LOCK_NAME)]  # the exclusive create: one hard link, or O_EXCL
        assert read_lock(str(folder))["token"] == lock.token == read_lock(url)["token"]
        with pytest.raises(SweepLockError, match="another sweep"):
            acquire_lock(str(folder))
    assert list(folder.iterdir()) == []
    with acquire_lock(str(folder)):
        with pytest.raises(SweepLockError, match="another sweep"):
            acquire_lock(url)


def test_a_sweep_into_a_file_url_with_escapes_writes_the_folder_it_names(tmp_path):
    config = write_toml(tmp_path / "s.toml", tiny({"train.seed": [0]}))
    folder = tmp_path / "my store.zarr"
    r = cli("sweep", str(config), "--out", "file://" + quote(str(folder)), "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert len(store.list_runs(str(folder))) == 1 and store.is_finished(str(folder), store.list_runs(str(folder))[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my store.zarr", "s.toml"]


def test_cli_refuses_a_locked_store(tmp_path):
    config = write_toml(tmp_path / "s.toml", tiny({"train.seed": [0, 1]}))
    out = tmp_path / "store.zarr"
    store.init_store(str(out))
    plant_lock(out)  # held by this (live) test process
    r = cli("sweep", str(config), "--out", str(out))
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert "is being written by another sweep" in line and f"pid {os.getpid()}" in line
    assert store.list_runs(str(out)) == []
    assert read_lock(str(out))["token"] == "planted"  # not removed by the refused launcher


def test_a_failing_heartbeat_leaves_no_temporaries(tmp_path, monkeypatch):
    # A heartbeat that fails is logged and the sweep goes on (a flaky shared filesystem); with a
    # temporary of a new name for each write, each failure left one behind (360 an hour).
    failed = []

    def flaky_replace(src, dst):
        failed.append(src)
        raise OSError(116, "Stale file handle")

    monkeypatch.setattr(os, "replace", flaky_replace)
    with acquire_lock(str(tmp_path), heartbeat_every=0.01) as lock:
        for _ in range(500):  # bounded poll for a few failed beats, not a timed assertion
            if len(failed) >= 3:
                break
            time.sleep(0.01)
        assert len(failed) >= 3
    monkeypatch.undo()
    assert read_lock(str(tmp_path)) is None and list(tmp_path.iterdir()) == [], lock.token


def test_a_lock_put_back_on_a_filesystem_without_hard_links_is_not_lost(tmp_path, monkeypatch):
    # Two launchers read one stale lock; one takes it over and holds the store. The other's late
    # takeover moves the new lock aside, sees it is not the stale one and puts it back, by os.link:
    # without hard links that failed, and the holder's lock was deleted, the store left to a third.
    from dynamics.sweep import lock as lock_module

    plant_lock(tmp_path, pid=dead_pid())
    stale = read_lock(str(tmp_path))
    with acquire_lock(str(tmp_path), heartbeat_every=3600) as winner:
        def no_links(src, dst):
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_links)
        assert lock_module._take_over(str(tmp_path), stale) is False
        assert read_lock(str(tmp_path))["token"] == winner.token and winner.owned()
        assert [p.name for p in tmp_path.iterdir()] == [LOCK_NAME]


def test_what_killed_launchers_left_beside_the_lock_is_cleared_once_old(tmp_path):
    old = time.time() - 3600
    left = [tmp_path / f"{LOCK_NAME}.4242.0123abcd.tmp", tmp_path / f"{LOCK_NAME}.stale-0123abcd"]
    fresh = tmp_path / f"{LOCK_NAME}.4243.0123abce.tmp"  # a write happening now, perhaps on another host
    mine = tmp_path / f"{LOCK_NAME}.notes"  # not a name the lock gives: the user's
    for f in [*left, fresh, mine]:
        f.write_text("{}")
    for f in [*left, mine]:
        os.utime(f, (old, old))
    with acquire_lock(str(tmp_path), heartbeat_every=3600):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, mine.name])


def test_a_takeover_whose_moved_aside_lock_a_winner_cleared_does_not_crash(tmp_path, monkeypatch):
    # The copy a takeover moves aside keeps the stale lock's old mtime: a launcher that won the
    # lock meanwhile clears it as a leftover, and the takeover's own remove raised FileNotFoundError.
    from dynamics.sweep import lock as lock_module

    old = time.time() - 3600
    plant_lock(tmp_path, pid=dead_pid(), heartbeat=old)
    real = lock_module.read_lock_file

    def read_then_cleared(file):
        info = real(file)
        os.remove(file)  # the winner's _clear_leftovers, right after this read
        return info

    monkeypatch.setattr(lock_module, "read_lock_file", read_then_cleared)
    with acquire_lock(str(tmp_path), heartbeat_every=3600) as lock:
        assert read_lock(str(tmp_path))["token"] == lock.token
