"""code_hash on packages with known bytes, and the sweep task's code check, run where another
`dynamics` is installed: a real subprocess unpickling what the launcher sends."""

import hashlib
import os
import pickle
import subprocess
import sys

from dynamics import provenance


def make_package(root, name, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_code_hash_is_the_sorted_names_lengths_and_bytes_of_the_py_files_only(tmp_path, monkeypatch):
    files = {"__init__.py": b"x = 1\n", "sub/mod.py": b"", "b.py": b"y\n"}
    make_package(tmp_path, "pkg_hashed", files)
    monkeypatch.syspath_prepend(str(tmp_path))
    h = hashlib.sha256()
    for name in ("__init__.py", "b.py", "sub/mod.py"):  # sorted by relative path, '/'-separated
        h.update(f"{name}\0{len(files[name])}\0".encode() + files[name])
    assert provenance.code_hash("pkg_hashed") == h.hexdigest()

    # what is not source does not count: bytecode caches, data files
    make_package(tmp_path, "pkg_hashed", {"__pycache__/b.cpython-311.pyc": b"\0", "data.toml": b"a = 1\n"})
    assert provenance.code_hash("pkg_hashed") == h.hexdigest()
    # one byte of source does; so does a byte moved across a file boundary (the lengths are hashed)
    make_package(tmp_path, "pkg_hashed", {"b.py": b"y\n\n"})
    moved = provenance.code_hash("pkg_hashed")
    assert moved != h.hexdigest()
    make_package(tmp_path, "pkg_hashed", {"__init__.py": b"x = 1", "b.py": b"\ny\n\n"})
    assert provenance.code_hash("pkg_hashed") not in (moved, h.hexdigest())
    assert provenance.code_hash("pkg_not_installed_anywhere") is None


def test_the_check_calls_the_task_only_where_the_code_is_the_launchers():
    here = provenance.code_hash()
    assert len(here) == 64
    assert pickle.loads(provenance.checked_task(here, "r1", "operator:add", 2, 3)) == 5
    # another hash: refused without importing the task's module (it does not exist here)
    out = pickle.loads(provenance.checked_task("0" * 64, "r1", "no_such_module:f", 2, 3))
    assert out == {"run_id": "r1", "status": "failed", "steps_done": 0, "skipped": False, "traceback": None,
                   "waited": None, "error": provenance.other_code(here, "0" * 64)}
    assert out["error"] == (
        f"this worker runs other dynamics code than the launcher (code hash {here[:16]}... against "
        f"0000000000000000...: another checkout or an older install?); not trained here, so that the sweep's runs "
        f"are all trained by the same code: install the launcher's on every worker")


def run_elsewhere(payload: bytes, path) -> dict:
    """``pickle.loads(payload)`` in a Python without site-packages (``-S``): its path is ``path``
    and cloudpickle alone, which a Dask worker always has and a value-pickled function needs."""
    import cloudpickle

    (path / "cloudpickle").symlink_to(os.path.dirname(cloudpickle.__file__))
    code = "import pickle, sys; print(repr(pickle.loads(sys.stdin.buffer.read())))"
    r = subprocess.run([sys.executable, "-S", "-c", code], input=payload, capture_output=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(path)}, cwd=path)
    assert r.returncode == 0, r.stderr.decode()
    return eval(r.stdout.decode())  # the repr of a dict of plain values


def test_a_worker_with_another_dynamics_runs_the_launchers_check_not_its_own(tmp_path):
    # An older dynamics has no provenance module (or another one), and its run_point may take
    # fewer arguments: the check travels by value, and nothing of that dynamics is imported or
    # unpickled (importing this one raises, and its config class could not be rebuilt).
    source = b"raise ImportError('an older dynamics was imported')\n"
    (tmp_path / "older").mkdir()
    make_package(tmp_path / "older", "dynamics", {"__init__.py": source})
    here = provenance.code_hash()
    payload = provenance.checked_task(here, "r1", "dynamics.sweep.task:run_point", {"model": {}}, "s.zarr", "r1")
    theirs = hashlib.sha256(f"__init__.py\0{len(source)}\0".encode() + source).hexdigest()
    assert run_elsewhere(payload, tmp_path / "older") == {
        "run_id": "r1", "status": "failed", "steps_done": 0, "skipped": False, "traceback": None, "waited": None,
        "error": provenance.other_code(theirs, here)}

    # and where no dynamics is installed at all
    (tmp_path / "none").mkdir()
    assert run_elsewhere(payload, tmp_path / "none")["error"] == "this worker has no dynamics installed; not trained here"


def test_a_worker_keeps_the_hash_of_the_code_it_started_with(tmp_path):
    # An editable install edited while a sweep runs: the workers imported the code as it was, and
    # their later points must not be refused as other code (nor the launcher's edit go unseen:
    # it hashed at launch too).
    import cloudpickle

    (tmp_path / "cloudpickle").symlink_to(os.path.dirname(cloudpickle.__file__))
    make_package(tmp_path, "dynamics", {"__init__.py": b"first = 1\n"})
    expected = hashlib.sha256(b"__init__.py\x0010\x00first = 1\n").hexdigest()
    payloads = [provenance.checked_task(expected, "r1", "operator:add", 2, 3) for _ in range(2)]
    (tmp_path / "payloads").write_bytes(pickle.dumps(payloads))
    script = (
        "import pickle, sys\n"
        "one, two = pickle.load(open('payloads', 'rb'))\n"
        "print(pickle.loads(one))\n"
        "open('dynamics/__init__.py', 'w').write('edited = 1\\n')\n"
        "print(pickle.loads(two))\n")
    r = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "5\n5\n"
    assert (tmp_path / "dynamics" / "__init__.py").read_text() == "edited = 1\n"
    # a new process reads the edited file: that one's points are refused
    r = subprocess.run([sys.executable, "-S", "-c", script.replace("print(pickle.loads(one))\n", "")],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                       cwd=tmp_path)
    assert "'status': 'failed'" in r.stdout, r.stdout + r.stderr
