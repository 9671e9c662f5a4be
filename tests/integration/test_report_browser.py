"""The report in a real browser: headless Chromium opens it over file:// and checks it works.

How: the page carries a self-test that runs only when its URL ends in ``#selftest``. It waits
for the page to load, checks that every <img> decoded (naturalWidth > 0), loads every frame
of the step slider, moves the slider to its last snapshot by dispatching an ``input`` event,
checks that the shown image and the step label changed and the new image decoded, and writes
a JSON verdict into ``<pre id="selftest">``. ``chromium --headless --dump-dom`` prints the
DOM after a virtual-time budget, so the test reads the verdict from stdout. Errors are caught
twice: in the page (window.onerror, unhandled rejections, console.error, installed first in
<head>) and from Chromium's own console log on stderr (``--enable-logging=stderr``), which
also sees a script that fails to parse and so never reports. A control page with a missing
frame, a thrown error and a slider that updates nothing must fail every check, so the
harness is shown to be able to fail. A screenshot of the page is saved to
``test-artifacts/report.png`` (git-ignored).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and Path("/usr/bin/chromium").exists():
        found = "/usr/bin/chromium"
    if found is None:
        pytest.fail("headless Chromium not found (looked for `chromium` on PATH and /usr/bin/chromium); "
                    "install Debian's `chromium` package (.ci/run does this) to run the report's browser test")
    return found


@pytest.fixture(scope="module")
def page(built):
    # The report of the store tests/_report_store.py builds, shared with tests/test_report*.py
    # through tests/conftest.py's session fixture: one session trains it once.
    _, index, _ = built
    return index


def _run_chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    flags = ["--headless", "--disable-gpu", "--no-first-run", "--disable-extensions", "--hide-scrollbars",
             "--disable-dev-shm-usage", "--mute-audio"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        flags.append("--no-sandbox")  # Chromium refuses to start as root with its sandbox
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: no lock clashes between runs
        return subprocess.run([_chromium(), *flags, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def _selftest(index: Path) -> tuple[dict, list[str]]:
    """The page's verdict and the console lines Chromium logged for it."""
    proc = _run_chromium("--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000", "--dump-dom",
                         index.as_uri() + "#selftest")
    match = re.search(r'<pre id="selftest">(.*?)</pre>', proc.stdout, re.S)
    assert match, f"no self-test block in the dumped DOM (rc {proc.returncode}); stderr tail:\n{proc.stderr[-2000:]}"
    text = html.unescape(match.group(1))
    assert text != "pending", f"the self-test never finished; stderr tail:\n{proc.stderr[-2000:]}"
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return json.loads(text), console


def _console_errors(console: list[str]) -> list[str]:
    # Chromium logs every console message at INFO; errors are recognisable by their text.
    return [line for line in console if re.search(r"Uncaught|Error|error", line)]


def test_report_works_in_headless_chromium(page):
    verdict, console = _selftest(page)
    assert verdict["errors"] == [], verdict["errors"]
    assert _console_errors(console) == [], console
    assert verdict["images"]["total"] >= 7 and verdict["images"]["broken"] == [], verdict["images"]
    assert verdict["frames"]["total"] >= 2 and verdict["frames"]["broken"] == [], verdict["frames"]
    slider = verdict["slider"]
    assert slider["changed"], slider
    assert slider["before"]["src"] != slider["after"]["src"] and slider["after"]["loaded"], slider
    assert slider["before"]["label"].startswith("step 0 ") and slider["after"]["label"] != slider["before"]["label"]
    # what a screen reader says of the slider: the step shown, not the 0-based index it holds
    assert slider["after"]["spoken"] == slider["after"]["label"], slider
    # and of the image: the roles at the step shown, which the panel titles draw
    frames = json.loads(re.search(r'id="frames-data">(.*?)</script>', page.read_text(), re.S).group(1).replace("<\\/", "</"))
    assert [slider["before"]["alt"], slider["after"]["alt"]] == [frames[0]["alt"], frames[-1]["alt"]], slider
    assert "; roles: " in slider["after"]["alt"] and slider["after"]["alt"] != slider["before"]["alt"], slider
    assert verdict["ok"] is True

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    _run_chromium("--window-size=1280,4600", f"--screenshot={shot}", page.as_uri())
    assert shot.exists() and shot.stat().st_size > 20_000, "no screenshot written"
    print(f"screenshot: {shot}")


def test_selftest_fails_on_a_broken_page(page, tmp_path):
    broken = tmp_path / "report"
    shutil.copytree(page.parent, broken)
    figures = next((broken / "figures").iterdir())  # the report's one figures/<generation>/ folder
    frames = sorted((figures / "attention").glob("*.png"))
    frames[-1].unlink()  # a frame the slider points at is missing
    (figures / "redundancy.png").unlink()  # and a static figure
    text = (broken / "index.html").read_text()
    text = text.replace("img.src = f.src;", "")  # the slider no longer changes the image
    text = text.replace("</body>", "<script>notDefinedAnywhere();</script></body>")
    (broken / "index.html").write_text(text)

    verdict, console = _selftest(broken / "index.html")
    assert verdict["ok"] is False
    assert any("notDefinedAnywhere" in e for e in verdict["errors"]), verdict["errors"]
    assert any("notDefinedAnywhere" in line for line in _console_errors(console)), console
    assert f"figures/{figures.name}/redundancy.png" in verdict["images"]["broken"]
    assert frames[-1].name in " ".join(verdict["frames"]["broken"])
    assert verdict["slider"]["changed"] is False
