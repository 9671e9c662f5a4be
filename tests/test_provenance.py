"""code_hash on packages with known bytes; the sweep task's code check; and a process keeping the
hash of the code it started with, in a real subprocess importing an edited copy of the package;
which code trained a run's kept steps, and the note on runs of more than one code."""

import hashlib
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    here = provenance.process_code_hash()
    assert here == provenance.code_hash() and len(here) == 64
    args = pickle.dumps((2, 3))
    assert provenance.same_code_or_refuse(here, "r1", "operator:add", args) == 5
    # another hash: refused without importing the task's module (there is none) or unpickling its
    # arguments (these name a module that does not exist either)
    unloadable = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x06nosuch\x94\x8c\x01f\x94\x93\x94."
    with pytest.raises(ModuleNotFoundError, match="'nosuch'"):
        pickle.loads(unloadable)
    out = provenance.same_code_or_refuse("0" * 64, "r1", "no_such_module:f", unloadable)
    assert out == {"run_id": "r1", "status": "failed", "steps_done": 0, "skipped": False, "traceback": None,
                   "waited": None, "error": provenance.other_code(here, "0" * 64), "refused": "code"}
    # a worker of a long-lived cluster that imported the code before a pull: restarting it is the fix
    assert out["error"] == (
        f"this worker runs other dynamics code than the launcher (code hash {here[:16]}... against "
        f"0000000000000000...: another checkout or an older install, a worker that imported the code before an "
        f"edit or a pull and keeps what it imported, or one started after an edit made while the sweep ran?); not "
        f"trained here, so that the sweep's runs are all trained by the same code: give every worker the "
        f"launcher's code and restart the workers, or launch the sweep again to go on with the code as it is now")


def test_a_task_payload_runs_the_check_where_it_is_loaded_and_names_what_a_worker_lacks():
    here = provenance.process_code_hash()
    assert pickle.loads(provenance.task(here, "r1", "operator:add", 2, 3)) == 5
    assert pickle.loads(provenance.task("0" * 64, "r1", "operator:add", 2, 3))["error"] == \
        provenance.other_code(here, "0" * 64)
    # the payload names this module's function, not the class that made it: nothing else to find there
    assert b"_Call" not in provenance.task(here, "r1", "operator:add")
    # what loading it raises on a worker without this module, or without dynamics
    older = provenance.missing_code(ModuleNotFoundError(name="dynamics.provenance"), here)
    assert older == ("this worker runs an older dynamics than the launcher (one without a code check); not trained "
                     "here, so that the sweep's runs are all trained by the same code: install the launcher's on "
                     "every worker")
    assert provenance.missing_code(ModuleNotFoundError(name="dynamics"), here) == \
        "this worker has no dynamics installed; not trained here: install the launcher's on every worker"
    assert provenance.missing_code(ModuleNotFoundError(name="dynamics.tasks"), here) is None  # a bug, shown as is
    assert provenance.missing_code(ValueError("dynamics.provenance"), here) is None


@pytest.mark.parametrize("script", [
    # An editable install edited while a sweep runs: its workers imported the code as it was, and
    # their later points must not be refused as other code.
    "from dynamics.provenance import code_hash, process_code_hash\n"
    "loaded = process_code_hash()\n"
    "open('dynamics/limits.py', 'a').write('# edited\\n')\n"
    "print(loaded == process_code_hash(), loaded != code_hash())\n",
    # A notebook imports dynamics.train, saves an edit, then trains: the run must record the code it
    # trained with, not the edited files', which it read at its first call before.
    "from dynamics.provenance import code_hash\n"
    "loaded = code_hash()\n"
    "import dynamics.train\n"
    "open('dynamics/limits.py', 'a').write('# edited\\n')\n"
    "from dynamics.provenance import process_code_hash\n"
    "print(process_code_hash() == loaded, code_hash() != loaded)\n"], ids=["sweep_worker", "notebook"])
def test_a_process_keeps_the_hash_of_the_code_it_loaded(tmp_path, script):
    package = Path(provenance.__file__).parent
    shutil.copytree(package, tmp_path / "dynamics", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "True True\n"  # the files changed under it, and the kept hash did not


A, B, C = "a" * 64, "b" * 64, "c" * 64


@pytest.mark.parametrize(("attrs", "codes"), [
    ({"code_hash": A}, (A,)),
    ({}, (None,)),  # a run of a dynamics that recorded no hash
    ({"code_hash": A, "resumes": [{"step": 40, "code_hash": A}]}, (A,)),  # resumed by the same code
    ({"code_hash": A, "resumes": [{"step": 40, "code_hash": B}]}, (A, B)),
    ({"code_hash": A, "resumes": [{"step": 40}]}, (A, None)),  # resumed by an older dynamics
    ({"code_hash": A, "resumes": [{"step": 0, "code_hash": B}]}, (B,)),  # B redid every step
    # B's steps from 40 were redone by C from 20; A's steps before 20 are kept
    ({"code_hash": A, "resumes": [{"step": 40, "code_hash": B}, {"step": 20, "code_hash": C}]}, (A, C)),
    # C resumes at B's own start: none of B's steps is kept
    ({"code_hash": A, "resumes": [{"step": 40, "code_hash": B}, {"step": 40, "code_hash": C}]}, (A, C)),
    ({"code_hash": A, "resumes": [{"step": 10, "code_hash": B}, {"step": 30, "code_hash": A}]}, (A, B, A)),
    ({"code_hash": A, "resumes": [{"step": 10, "code_hash": B}, {"step": 30, "code_hash": B}]}, (A, B)),
])
def test_trained_by_keeps_the_code_of_each_session_whose_steps_are_kept(attrs, codes):
    assert provenance.trained_by(attrs) == codes


def test_mixed_code_says_nothing_for_one_code_and_names_each_codes_runs_otherwise():
    def mixed(attrs):
        return provenance.mixed_code({r: provenance.trained_by(a) for r, a in attrs.items()})

    assert mixed({}) is None
    assert mixed({"r1": {"code_hash": A}, "r2": {"code_hash": A}}) is None
    assert mixed({"r1": {}, "r2": {}}) is None  # all older: no claim to make
    runs = {f"r{i}": {"code_hash": A} for i in range(5)} | {"s": {"code_hash": B}, "t": {},
                                                             "u": {"code_hash": A, "resumes": [{"step": 9, "code_hash": B}]}}
    # the largest group first, then by their first run; more than three runs named by two and a count
    assert mixed(runs) == (
        "these 8 runs were not all trained by the same dynamics code (code hash aaaaaaaaaaaa: r0, r1 and 3 others; "
        "bbbbbbbbbbbb: s; not recorded: t; aaaaaaaaaaaa then bbbbbbbbbbbb: u): a difference between them may be "
        "the code's, not the experiment's (each run's code_hash and resumes attributes say which)")


T, CPU = "2.13.0+cpu", "cpu"


@pytest.mark.parametrize(("attrs", "executions"), [
    ({"torch_version": T, "device": CPU, "cpu_capability": "AVX2"}, ((T, CPU, "AVX2"),)),
    ({}, ((None, None, None),)),  # a run of a dynamics that recorded none of them
    # a resume's own entry names its kernels; the first session's stay in the run's attributes
    ({"torch_version": T, "device": CPU, "cpu_capability": "AVX2",
      "resumes": [{"step": 40, "torch_version": T, "device": CPU, "cpu_capability": "AVX512"}]},
     ((T, CPU, "AVX2"), (T, CPU, "AVX512"))),
    ({"torch_version": T, "device": CPU, "cpu_capability": "AVX2",
      "resumes": [{"step": 40, "torch_version": T, "device": CPU, "cpu_capability": "AVX2"}]}, ((T, CPU, "AVX2"),)),
    # redone from step 0 on a GPU: none of the first session's steps is kept; a GPU is its kind,
    # and the host's CPU kernels do not do its arithmetic
    ({"torch_version": T, "device": CPU, "cpu_capability": "AVX2",
      "resumes": [{"step": 0, "torch_version": "2.13.0", "device": "cuda:1", "cpu_capability": "AVX2"}]},
     (("2.13.0", "cuda", "-"),)),
    ({"torch_version": "2.13.0", "device": "cuda", "cpu_capability": "AVX512",
      "resumes": [{"step": 40, "torch_version": "2.13.0", "device": "cuda:0", "cpu_capability": "AVX2"}]},
     (("2.13.0", "cuda", "-"),)),
])
def test_trained_on_keeps_the_torch_device_and_kernels_of_each_session_whose_steps_are_kept(attrs, executions):
    assert provenance.trained_on(attrs) == executions


def mixed_execution(attrs):
    return provenance.mixed_execution({r: provenance.trained_on(a) for r, a in attrs.items()})


AVX2 = {"torch_version": T, "device": CPU, "cpu_capability": "AVX2"}
NOTE = ("these {n} runs were not all trained with the same torch build, device and CPU kernels ({groups}): "
        "they may round differently, so a difference between them may be the machine's, not the experiment's "
        "(each run's torch_version, device, cpu_capability and resumes attributes say which)")


def test_mixed_execution_says_nothing_for_one_machine_and_names_each_ones_runs_otherwise():
    assert mixed_execution({}) is None
    assert mixed_execution({"r1": AVX2, "r2": dict(AVX2)}) is None
    assert mixed_execution({"r1": {}, "r2": {}}) is None  # all older: no claim to make
    # another code, same machine: that is mixed_code's to say, not this
    assert mixed_execution({"r1": AVX2 | {"code_hash": A}, "r2": AVX2 | {"code_hash": B}}) is None
    # GPU runs: the hosts' CPU kernels and the GPU's index are not differences
    gpu = {"torch_version": "2.13.0", "device": "cuda", "cpu_capability": "AVX2"}
    assert mixed_execution({"g1": gpu, "g2": gpu | {"device": "cuda:0", "cpu_capability": "AVX512"}}) is None
    runs = {"r1": AVX2, "r2": AVX2, "s": AVX2 | {"cpu_capability": "AVX512"},
            "u": AVX2 | {"torch_version": "2.12.1+cpu"},
            "v": AVX2 | {"resumes": [{"step": 9, **gpu}]}}
    assert mixed_execution(runs) == NOTE.format(n=5, groups=(
        "torch 2.13.0+cpu, cpu, AVX2: r1, r2; torch 2.13.0+cpu, cpu, AVX512: s; torch 2.12.1+cpu, cpu, AVX2: u; "
        "torch 2.13.0+cpu, cpu, AVX2 then torch 2.13.0, cuda: v"))


def test_mixed_execution_compares_only_what_every_run_recorded():
    # a run of a dynamics that recorded none of them is left out, not a group of its own
    assert mixed_execution({"r1": AVX2, "r2": AVX2, "t": {}}) is None
    assert mixed_execution({"r1": AVX2, "s": AVX2 | {"cpu_capability": "AVX512"}, "t": {}}) == NOTE.format(
        n=2, groups="torch 2.13.0+cpu, cpu, AVX2: r1; torch 2.13.0+cpu, cpu, AVX512: s")
    # one run recorded no kernels (before cpu_capability was): kernels are compared for none,
    # so the same torch on the same device reads as one machine, and another torch still differs
    older = {"torch_version": T, "device": CPU}
    assert mixed_execution({"r1": AVX2, "s": AVX2 | {"cpu_capability": "AVX512"}, "o": older}) is None
    assert mixed_execution({"r1": AVX2, "o": older | {"torch_version": "2.12.1+cpu"}}) == NOTE.format(
        n=2, groups="torch 2.12.1+cpu, cpu: o; torch 2.13.0+cpu, cpu: r1")  # equal groups: by first run
    # a resume that recorded no kernels, on a run that did: its sessions merge once kernels drop out
    resumed = AVX2 | {"resumes": [{"step": 9, "torch_version": T, "device": CPU}]}
    assert mixed_execution({"r1": AVX2, "x": resumed, "u": AVX2 | {"torch_version": "2.12.1+cpu"}}) == NOTE.format(
        n=3, groups="torch 2.13.0+cpu, cpu: r1, x; torch 2.12.1+cpu, cpu: u")


def test_an_editors_lock_file_is_not_hashed_as_code(tmp_path, monkeypatch):
    # Emacs's .#b.py beside b.py being edited: a link to a file that does not exist, and no module
    make_package(tmp_path, "pkg_locked", {"__init__.py": b"x = 1", "b.py": b"y = 2\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    before = provenance.code_hash("pkg_locked")
    os.symlink("user@host.1234:1700000000", tmp_path / "pkg_locked" / ".#b.py")
    (tmp_path / "pkg_locked" / "b copy.py").write_bytes(b"y = 3\n")  # no module either: not importable by name
    assert provenance.code_hash("pkg_locked") == before

# Known answers that mutants of this module passed (a mutation audit's): each pins a number, an
# order or a wording the other tests let move.


def test_mixed_code_names_three_runs_of_one_code_in_full():
    # `len(ids) <= 3` -> `< 3` survived: a group of exactly three runs read "r1, r2 and 1 others"
    note = provenance.mixed_code({"r1": (A,), "r2": (A,), "r3": (A,), "s": (B,)})
    assert "(code hash aaaaaaaaaaaa: r1, r2, r3; bbbbbbbbbbbb: s)" in note


def test_mixed_code_names_each_codes_runs_by_id_whatever_order_they_came_in():
    # `sorted(sessions)` -> `sessions` survived: the note named a group's runs in the caller's order
    note = provenance.mixed_code({"r2": (A,), "s": (B,), "r1": (A,)})
    assert "(code hash aaaaaaaaaaaa: r1, r2; bbbbbbbbbbbb: s)" in note
