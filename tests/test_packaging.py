"""The source distribution, built by the build-system's own backend (setuptools), as
``python -m build --sdist`` builds it: it carries every file of the project's tree that its
tests, the demo and CI read."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tracked() -> list[str]:
    """The project's files: git's list in a clone, the tree itself in an unpacked sdist."""
    if (ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p) and p.name != "PKG-INFO"]


def test_the_sdist_carries_what_its_own_tests_need(tmp_path):
    # setuptools' default took tests/test*.py alone: in the unpacked sdist 28 of the suite's files
    # failed to import tests.conftest, tests._report_store or bench, and the demo's config was gone
    files = _tracked()
    src = tmp_path / "src"
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; print(b.build_sdist('dist'))"],
                          cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sdist = src / "dist" / proc.stdout.split()[-1]
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]  # dynamics-<version>
        held = {name.removeprefix(top + "/") for name in tar.getnames()}
    wanted = {name for name in files if name.split("/")[0] in ("dynamics", "tests", "bench", "experiments")}
    wanted |= {"README.md", "pyproject.toml", "MANIFEST.in", "data/README.md", ".ci/run"}
    assert {"tests/conftest.py", "tests/_report_store.py", "bench/_common.py", "experiments/quickstart.toml"} <= wanted
    assert sorted(wanted - held) == []
    assert not [name for name in held if "__pycache__" in name or name.endswith(".pyc")]
