"""The suite's own fixtures, where one guards the others' results (tests/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

# A test leaves a pipe open in a reference cycle: only the collector closes it, warning then.
LEAK = """
import subprocess, sys

def test_leaves_a_pipe_in_a_cycle():
    p = subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE, text=True)
    p.wait()
    cycle = {"p": p}
    cycle["self"] = cycle
"""

STRICT = """
import gc
import pytest

pytestmark = pytest.mark.filterwarnings("error")

def test_collects():
    gc.collect()  # as any allocation may, mid-test (zarr's asyncio did, in CI)
"""


def pytest_in(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    # One process, in file order: the collection must land in the strict module. Its own
    # --basetemp: in the shared one, the inner pytest deleted the outer runs' old numbered folders
    # as it exited (pytest keeps 3), stores and all, which took one of these tests 36-48 s.
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist",
                           "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "basetemp"), *files],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_an_earlier_modules_open_pipe_does_not_fail_a_strict_module(tmp_path):
    r = pytest_in(tmp_path, {"test_a_leak.py": LEAK, "test_b_strict.py": STRICT})
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout + r.stderr


def test_a_strict_modules_own_open_pipe_still_fails_it(tmp_path):
    r = pytest_in(tmp_path, {"test_a_strict.py": STRICT.replace("def test_collects", LEAK + "\ndef test_collects")})
    assert r.returncode == 1 and "1 failed, 1 passed" in r.stdout, r.stdout + r.stderr
    assert "ResourceWarning: unclosed file" in r.stdout, r.stdout


def test_every_file_the_suite_starts_first_exists():
    # A renamed or split file would silently drop out of the order and could start last again.
    from tests.conftest import SLOWEST_FIRST

    assert [p for p in SLOWEST_FIRST if not (CONFTEST.parent / p).is_file()] == []
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST)


BUSY = """
def test_leaves_a_file_open_on_its_tmpfs(tmpfs):
    global held
    held = open(tmpfs("1m") / "f", "w")  # still open at teardown
"""


def test_a_tmpfs_still_busy_after_its_test_is_detached_and_the_test_errors(tmp_path):
    # An unchecked umount left the mount in place: pytest renamed it with its old temporary
    # folders, run after run, and none of them could be deleted.
    r = pytest_in(tmp_path, {"test_busy.py": BUSY})
    if "1 skipped" in r.stdout:
        pytest.skip("cannot mount a tmpfs here")
    assert "1 passed, 1 error" in r.stdout, r.stdout
    assert "tmpfs still busy after the test, detached: " in r.stdout
    mounts = Path("/proc/mounts").read_text() if Path("/proc/mounts").exists() else ""
    assert str(tmp_path) not in mounts
