"""Bad command-line input: one line naming the problem, exit code 2, nothing created."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dynamics import store
from dynamics.config import load_config, with_values
from dynamics.train import train_run
from dynamics.usage import UsageError, check_report_dir
from tests.conftest import TINY, cli_in_process, interrupt_at

ROOT = Path(__file__).resolve().parents[1]


def dyn(*args, cwd=None):
    """`python -m dynamics ARGS` as a process of its own: for what is about the process (its exit
    status from the real entry point); the checks of what a command says call cli.main in this
    process (cli_in_process), sparing each the seconds of a fresh interpreter's imports."""
    return subprocess.run([sys.executable, "-m", "dynamics", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or ROOT)


def one_line_exit_2(r, needle):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    cfg = d / "tiny.toml"
    cfg.write_text(TINY.format(steps=10, every=5))
    path = d / "s.zarr"
    train_run(load_config(cfg), str(path))
    (d / "afile").write_text("not a directory")
    (d / "foreign.zarr").mkdir()  # a zarr store another tool made
    (d / "foreign.zarr" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    return d, cfg, path


@pytest.mark.parametrize("args, needle", [
    (["run", "{cfg}", "--out", "{d}/afile/sub.zarr"], "afile is a file, not a directory"),
    (["sweep", "{cfg}", "--out", "{d}/afile/sub.zarr"], "afile is a file, not a directory"),
    (["run", "{cfg}", "--out", "{d}/new1.zarr", "--run-id", "bad id!"], "invalid run id 'bad id!'"),
    (["sweep", "{cfg}", "--out", "{d}/new2.zarr", "--scheduler", "{d}/nofile.json"],
     "neither an address (tcp://host:port) nor a scheduler file"),
    (["demo", "--workers", "0", "--out", "{d}/new3.zarr"], "--workers: must be >= 1, got 0"),
    # ignored there, while the first line named "7 worker(s)" for a cluster of one
    (["sweep", "{cfg}", "--out", "{d}/new5.zarr", "--scheduler", "tcp://127.0.0.1:1", "--workers", "7"],
     "--workers 7: sizes the cluster a sweep starts itself; with --scheduler the runs go to that cluster's own "
     "workers (give one of the two)"),
    (["demo", "--workers", "-1", "--out", "{d}/new3.zarr"], "--workers: must be >= 1, got -1"),
    (["report", "{path}", "--out", "{d}/afile/x"], "afile is a file, not a directory"),
    (["gates", "{path}", "--lam", "nan"], "--lam: give |lambda|"),
    (["gates", "{path}", "--steps", "0"], "--steps: must be positive, got 0"),
    (["gates", "{path}", "--init-steps", "10000000000000"], "--init-steps: must be in [0, 100,000,000]"),
    (["gates", "{path}", "--lam", "1e39"], "--lam: must be at most 3.403e+38 (float32)"),
    (["run", "{cfg}", "--out", "{d}/new4.zarr", "--run-id", "zarr.json"], "invalid run id 'zarr.json': reserved by zarr"),
    (["run", "{cfg}", "--out", "{path}/runs/inner.zarr"], "is inside the store"),
    (["report", "{path}", "--out", "{path}"], "is a dynamics store; a report goes next to it, not into it"),
    (["report", "{path}", "--out", "{path}/rep"], "is inside the store"),
    (["report", "{path}", "--out", "{d}/foreign.zarr"], "foreign.zarr is a zarr store; give the report a folder"),
    (["demo", "--out", "{d}/new6.zarr", "--report", "{path}"], "is a dynamics store; a report goes next to it"),
    # stat of a name too long raised OSError from exists(), a traceback with exit 1
    (["run", "{cfg}", "--out", "{d}/" + "x" * 300 + ".zarr"], "cannot be looked at: File name too long"),
    (["run", "{d}/" + "x" * 300 + ".toml"], "cannot be looked at: File name too long"),
    (["report", "{path}", "--out", "{d}/" + "x" * 300], "cannot be looked at: File name too long"),
    # the store did not exist yet when the report folder was checked: the demo trained, then wrote its page into it
    (["demo", "--out", "{d}/new12.zarr", "--report", "{d}/new12.zarr"], "is the store --out"),
    (["demo", "--out", "{d}/new13.zarr", "--report", "{d}/new13.zarr/rep"], "is inside the store --out"),
    # every point of the grid would replace the value: no run would train with it
    (["demo", "--out", "{d}/new7.zarr", "--set", "train.seed=5"], "--set train.seed: a [sweep] axis"),
    (["sweep", str(ROOT / "experiments" / "quickstart.toml"), "--out", "{d}/new8.zarr", "--set", "model.init_scale=3.0"],
     "--set model.init_scale: a [sweep] axis"),
    (["run", "{cfg}", "--out", "nosuch://bucket/x.zarr"], "no filesystem for the URL scheme 'nosuch'"),
    (["run", "{cfg}", "--out", ""], "--out: empty value"),
    # made a store named "-" in the working directory (the conventional name of standard output)
    (["run", "{cfg}", "--out", "-"], "--out -: a path is needed here, not standard input or output"),
    (["report", "{path}", "--out", "-"], "--out -: a path is needed here"),
    (["status", "-"], "STORE -: a path is needed here"),
    (["run", "-"], "CONFIG -: a path is needed here"),
    (["status", "{d}/nope.zarr"], "nope.zarr: the path does not exist"),
    # argparse kept the last of a flag given twice: the run went to new19.zarr
    (["run", "{cfg}", "--out", "{d}/new20.zarr", "--out", "{d}/new19.zarr"], "argument --out: given twice"),
    (["gates", "{path}", "--run", "a", "--run", "b"], "argument --run: given twice"),
    (["run", "{cfg}", "--out", "{d}/new21.zarr", "--device", "cpu", "--set", "train.device=\"cuda\""],
     "give --device or --set train.device, not both"),
    # the working directory became the store, or received the report's index.html
    (["run", "{cfg}", "--out", "file://"], "--out file://: a file:// URL with no path"),
    (["report", "{path}", "--out", "file://"], "--out file://: a file:// URL with no path"),
    (["status", "file://%20"], "STORE file://%20: a file:// URL with no path"),
    # a ValueError traceback (embedded null byte) from os.stat
    (["status", "file:///tmp/x%00y"], "STORE file:///tmp/x%00y: a path cannot hold a NUL byte"),
    (["run", "{cfg}", "--out", "file://{d}/x%00y.zarr"], "x%00y.zarr: a path cannot hold a NUL byte"),
    (["run", "{cfg}", "--out", "{d}/new5.zarr", "--run-id", " "], "--run-id: empty value"),
    # a store URL nothing answers at (port 1: nothing listens there): a traceback from the sweep's
    # init_store, "not a dynamics store" from the readers
    (["sweep", "{cfg}", "--out", "ftp://127.0.0.1:1/x.zarr"], "--out ftp://127.0.0.1:1/x.zarr: cannot be reached: "),
    (["status", "ftp://127.0.0.1:1/x.zarr"], "ftp://127.0.0.1:1/x.zarr: cannot be reached: "),
    # its folder name too long for the filesystem: refused by the lock, after the store was made
    (["run", "{cfg}", "--out", "{d}/new22.zarr", "--run-id", "a" * 300],
     "invalid run id aaaaaaaaaaaaaaaaaaaa...: 300 bytes long, at most 255"),
    # a new one leaves room for the names made from it (derived/gates.<run id>)
    (["run", "{cfg}", "--out", "{d}/new23.zarr", "--run-id", "a" * 200],
     "invalid run id aaaaaaaaaaaaaaaaaaaa...: 200 bytes long, at most 128 for a new run"),
    # trained the same data and model as the config without it, under a run id of its own
    (["run", "{cfg}", "--out", "{d}/new11.zarr", "--set", "task.delta=5"],
     "task.delta = 5: the induction task does not read it (only offset_copy does)"),
    (["run", "{cfg}", "--out", "{d}/new14.zarr", "--set", "model.gate_l1=0.5"],
     'model.gate_l1 = 0.5: fixed gates (model.gates = "fixed") do not read it'),
    # each trained bitwise the run without the setting, under another run id
    (["run", "{cfg}", "--out", "{d}/new15.zarr", "--set", "model.d_mlp=128"],
     "model.d_mlp = 128: an attention-only model (model.attn_only = true) does not read it, so the run would "
     "train what the config without it trains, under another run id; drop the setting, or set model.attn_only = false"),
    (["run", "{cfg}", "--out", "{d}/new16.zarr", "--set", "model.pos=\"learned\"", "--set", "model.rope_base=500.0"],
     'model.rope_base = 500.0: a model without RoPE (model.pos = "learned") does not read it'),
    (["run", "{cfg}", "--out", "{d}/new17.zarr", "--set", "train.optimizer=\"sgd\"", "--set", "train.beta2=0.9"],
     'train.beta2 = 0.9: SGD (train.optimizer = "sgd") does not read it'),
    (["run", "{cfg}", "--out", "{d}/new18.zarr", "--set", "record.chg_steps=5"],
     "record.chg_steps = 5: a run that fits no gates while it trains (record.chg_every = 0) does not read it"),
    # made the store and a "failed" run, which died of a MemoryError 30 s later (or pushed the machine into swap)
    (["run", "{cfg}", "--out", "{d}/new9.zarr", "--set", "train.batch_size=100000000"],
     "for a training step), more than the"),
])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(tiny, args, needle):
    d, cfg, path = tiny
    before = sorted(p.name for p in d.iterdir())
    one_line_exit_2(cli_in_process(*(a.format(d=d, cfg=cfg, path=path) for a in args), cwd=ROOT), needle)
    assert sorted(p.name for p in d.iterdir()) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("command", ["run", "sweep", "report"])
def test_an_out_folder_mkdir_cannot_make_is_one_line_exit_2(tiny, command):
    # access() says yes to root for /proc, where mkdir then fails: sweep and report printed two
    # chained tracebacks, and run recorded nothing but said it "failed", exit 1
    d, cfg, path = tiny
    source = path if command == "report" else cfg
    one_line_exit_2(cli_in_process(command, source, "--out", "/proc/dynamics-test.zarr", cwd=ROOT),
                    "--out /proc/dynamics-test.zarr: ")


def test_bad_input_through_python_dash_m_is_one_line_exit_2_and_creates_nothing(tiny):
    # The cases above call cli.main in this process; this one goes through the real entry point,
    # whose exit status is main()'s return value.
    d, cfg, _ = tiny
    before = sorted(p.name for p in d.iterdir())
    one_line_exit_2(dyn("run", cfg, "--out", d / "afile" / "sub.zarr"), "afile is a file, not a directory")
    assert sorted(p.name for p in d.iterdir()) == before


def test_demo_refuses_a_point_that_cannot_fit_in_memory(tiny, capsys):
    from dynamics import cli

    d, _, _ = tiny
    assert cli.main(["demo", "--out", str(d / "demo.zarr"), "--set", "record.n_probe=100000000"]) == 2
    got = capsys.readouterr()
    [line] = got.err.strip().splitlines()
    assert line.startswith("dynamics: error: sweep point model.init_scale=") and "for an attention snapshot" in line
    assert not (d / "demo.zarr").exists() and not (d / "demo.zarr-report").exists()
    assert got.out == ""  # the "== 1/4 sweep" banner came first, as if work had started
    # a bad grid likewise
    assert cli.main(["demo", "--out", str(d / "demo.zarr"), "--set", "sweep.model.init_scale=[-1]"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.startswith("dynamics: error: ") and len(got.err.splitlines()) == 1


def test_a_finished_run_is_skipped_on_a_machine_it_would_not_fit(tiny, capsys, monkeypatch):
    # a store copied from a larger machine, rerun to confirm nothing is left: refused before
    from dynamics import cli

    d, cfg, path = tiny
    monkeypatch.setenv("DYNAMICS_MEMORY_GB", "0.0001")
    assert cli.main(["run", str(cfg), "--out", str(path)]) == 0
    assert "already completed" in capsys.readouterr().out
    assert cli.main(["run", str(cfg), "--out", str(d / "new10.zarr")]) == 2  # an unfinished one still is
    assert "more than the 0.1 MiB DYNAMICS_MEMORY_GB allows" in capsys.readouterr().err
    assert not (d / "new10.zarr").exists()


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_memory_url_out_is_refused(tiny, command, capsys):
    # fsspec's memory:// is this process's dict: the store would vanish when the command exits,
    # and a sweep's worker processes would each record into their own, all reported completed
    from dynamics import cli

    _, cfg, _ = tiny
    assert cli.main([command, str(cfg), "--out", "memory://dynamics-cli/s.zarr"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "a memory:// store lives only as long as this command" in line


def test_a_set_inside_a_table_valued_sweep_axis_is_refused():
    # the axis replaces the whole intervene.templates table at every point: the --set was silently lost
    from dynamics.config import from_dict
    from dynamics.usage import UsageError, check_not_swept

    tables = [{"heads": [{"layer": 0, "head": h, "pattern": "uniform"}]} for h in (0, 1)]
    cfg = from_dict({"sweep": {"intervene.templates": tables}})
    with pytest.raises(UsageError, match=r"--set intervene.templates.weight: inside the \[sweep\] axis "
                                         r"intervene.templates, whose values replace it"):
        check_not_swept(cfg, ["intervene.templates.weight=2.0"])
    check_not_swept(cfg, ["intervene.templatesx.weight=2.0", "train.seed=1"])  # beside the axis: kept



def test_a_table_set_whole_holding_a_swept_key_is_refused():
    # the axis set weight at every point, so the table's weight = 0.5 was silently replaced
    from dynamics.config import from_dict
    from dynamics.usage import UsageError, check_not_swept

    cfg = from_dict({"sweep": {"intervene.templates.weight": [0.0, 1.0]}})
    table = "intervene.templates={weight=0.5, heads=[{layer=0, head=1, pattern='previous_token'}]}"
    with pytest.raises(UsageError, match=r"^--set intervene.templates: its weight is the \[sweep\] axis "
                                         r"intervene.templates.weight, which every point of the grid sets"):
        check_not_swept(cfg, [table])
    check_not_swept(cfg, ["intervene.templates={heads=[{layer=0, head=1, pattern='previous_token'}]}"])  # kept

@pytest.fixture
def read_only_store(tiny, tmp_path):
    """A copy of the tiny store that cannot be written: file modes for a user, a read-only bind
    mount for root (whom modes do not stop)."""
    import os
    import shutil

    _, _, path = tiny
    d = tmp_path / "ro"
    shutil.copytree(path.parent, d, ignore=shutil.ignore_patterns("ro"))
    if os.geteuid() != 0:
        for p in [d, *d.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
        yield d / path.name
        for p in [d, *d.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
        return
    mounted = subprocess.run(f"mount --bind {d} {d} && mount -o remount,bind,ro {d} {d}", shell=True,
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("root here cannot make a read-only mount")
    try:
        yield d / path.name
    finally:
        subprocess.run(["umount", str(d)], check=True)


@pytest.mark.parametrize("args, needle", [
    (["analyse", "{ro}"], "analyse {ro}: the store is read-only here, and this command writes into it"),
    (["predict", "{ro}", "--target", "importance"], "(--no-save writes nothing)"),
    (["gates", "{ro}"], "gates {ro}: the store is read-only here"),
    (["run", "{cfg}", "--out", "{ro}", "--set", "train.seed=7"], "--out {ro}: the store is read-only here"),
    # as a file:// URL it was taken for a remote store and not checked: the work ran, then a traceback
    (["analyse", "file://{ro}"], "analyse file://{ro}: the store is read-only here"),
    (["gates", "file://{ro}", "--steps", "2", "--restarts", "1"], "gates file://{ro}: the store is read-only here"),
])
def test_a_read_only_store_is_refused_before_any_work(tiny, read_only_store, args, needle):
    _, cfg, _ = tiny
    ro = read_only_store
    one_line_exit_2(cli_in_process(*(a.format(ro=ro, cfg=cfg) for a in args)), needle.format(ro=ro))


@pytest.mark.parametrize("command", [["predict", "--target", "importance"], ["gates", "--steps", "2", "--restarts", "1"]])
def test_a_store_whose_derived_folder_is_read_only_is_refused_before_any_work(tiny, tmp_path, command):
    # A writable root over a read-only derived/ passed the check: the whole fit ran, then saving
    # it failed with a PermissionError traceback.
    import os
    import shutil

    _, _, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    derived = s / "derived"
    derived.mkdir(exist_ok=True)
    if os.geteuid() != 0:
        derived.chmod(0o555)
    elif subprocess.run(f"mount --bind {derived} {derived} && mount -o remount,bind,ro {derived} {derived}",
                        shell=True, capture_output=True).returncode != 0:
        pytest.skip("root here cannot make a read-only mount")
    try:
        one_line_exit_2(cli_in_process(command[0], s, *command[1:]),
                        f"{command[0]} {s}: its derived/ folder is read-only here, and this command writes into it")
    finally:
        if os.geteuid() != 0:
            derived.chmod(0o755)
        else:
            subprocess.run(["umount", str(derived)], check=True)


@pytest.mark.parametrize("section", ["analysis", "derived"])
def test_a_computed_section_that_is_a_file_stops_its_writers_not_its_readers(tiny, tmp_path, section):
    # analyse failed each run's analysis with a FileExistsError; status read no further than the check
    import shutil

    _, _, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    shutil.rmtree(s / section, ignore_errors=True)
    (s / section).write_text("x")
    writers = {"analysis": [["analyse"]], "derived": [["analyse"], ["predict", "--target", "importance"],
                                                        ["gates", "--steps", "2", "--restarts", "1"]]}[section]
    for command in writers:
        one_line_exit_2(cli_in_process(command[0], s, *command[1:]),
                        f"{s}: {section} is not a folder (the store is damaged); move it aside")
    r = cli_in_process("status", s)
    assert r.returncode == 0 and store.list_runs(s)[0] in r.stdout
    assert (s / section).read_text() == "x"


@pytest.mark.parametrize("config, needle", [
    (lambda c: {**c, "model": {**c["model"], "newkey": 1}}, "its recorded config cannot be read by this version: "),
    (lambda c: None, "its recorded config is missing or not a table"),
])
def test_a_run_whose_recorded_config_this_version_cannot_read_is_named(tiny, tmp_path, config, needle):
    # A newer version's key read "unknown key 'model.newkey'" as if typed by the user, naming no
    # run; a missing config attribute was a KeyError traceback.
    import shutil

    _, _, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    [rid] = store.list_runs(s)
    store.update_run_attrs(s, rid, config=config(store.run_attrs(s, rid)["config"]))
    one_line_exit_2(cli_in_process("gates", s, "--steps", "2", "--restarts", "1"), f"run {rid} in {s}: {needle}")


def test_gates_without_run_on_a_store_of_many_runs_says_how_many_it_did_not_name(tiny, tmp_path):
    # "holds 12 runs; choose one with --run (8 ids)": four runs left out, unsaid
    import shutil

    _, _, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    [rid] = store.list_runs(s)
    for i in range(9):  # group names are all list_runs reads
        shutil.copytree(s / "runs" / rid, s / "runs" / f"copy{i}")
    runs = store.list_runs(s)
    one_line_exit_2(cli_in_process("gates", s), f"{s} holds 10 runs; choose one with --run ({', '.join(runs[:8])}, "
                                                 f"and 2 more: dynamics status {s} lists them)")


def test_a_run_an_earlier_version_made_with_a_long_id_stays_usable(tiny, tmp_path):
    # Ids of 129 to 255 bytes were accepted once: their runs must still read, resume and skip.
    _, cfg, _ = tiny
    s = tmp_path / "s.zarr"
    long_id = "a" * 200
    train_run(load_config(cfg), str(s), long_id)
    for args in (["status", s], ["run", cfg, "--out", s, "--run-id", long_id]):
        done = cli_in_process(*args)
        assert done.returncode == 0, done.stderr
    assert "already completed" in done.stdout


def test_a_finished_run_of_a_read_only_store_is_skipped_not_refused(tiny, read_only_store):
    # nothing to write: train_run skips it without the lock, but --out was refused as read-only
    _, cfg, _ = tiny
    done = cli_in_process("run", cfg, "--out", read_only_store)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"already completed in {read_only_store}; nothing retrained")


def test_a_full_disk_is_one_line_exit_1_and_keeps_what_was_there(tiny, tmp_path):
    """`analyse` and `report` on a full disk printed a traceback (the derived consistency and the
    report page are written after each run's analysis). Needs a small filesystem: a tmpfs, which
    only root can mount."""
    import os
    import shutil

    import xarray as xr

    from dynamics import store

    if os.geteuid() != 0 or sys.platform != "linux":
        pytest.skip("a full disk needs a tmpfs mount, which needs root")
    _, _, path = tiny
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("root here cannot mount a tmpfs")
    try:
        copy = disk / path.name
        shutil.copytree(path, copy)
        # a second seed, so that cross-seed consistency has a pair: a full disk made every run's
        # analysis "fail" on its own, and consistency was rewritten empty from none of them
        train_run(with_values(load_config(tiny[1]), {"train.seed": 1}), str(copy))
        assert cli_in_process("analyse", copy).returncode == 0
        assert cli_in_process("report", copy, "--out", disk / "rep").returncode == 0
        run_id = store.list_runs(copy)[0]
        before = store.open_analysis(copy, run_id).load()
        consistency = store.open_derived(copy, "consistency").load()
        assert consistency.sizes["group"] == 1
        page = (disk / "rep" / "index.html").read_bytes()
        free = shutil.disk_usage(disk).free
        with open(disk / "filler", "wb") as f:  # every free block taken
            f.write(b"\0" * free)
        for args in (["analyse", copy], ["report", copy, "--out", disk / "rep"]):
            r = cli_in_process(*args)
            assert r.returncode == 1, (r.stdout, r.stderr)
            last = r.stderr.strip().splitlines()[-1]
            assert "Traceback" not in r.stderr and last.startswith(f"dynamics: {args[0]} stopped: No space left on device")
            assert "analysis failed" not in r.stdout + r.stderr
        xr.testing.assert_identical(store.open_analysis(copy, run_id).load(), before)
        xr.testing.assert_identical(store.open_derived(copy, "consistency").load(), consistency)
        assert (disk / "rep" / "index.html").read_bytes() == page
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_report_does_not_replace_a_page_it_did_not_write(tiny, tmp_path):
    _, _, path = tiny
    mine = tmp_path / "site"
    mine.mkdir()
    (mine / "index.html").write_text("<html>my notes</html>")
    one_line_exit_2(cli_in_process("report", path, "--out", mine), "holds an index.html that is not a dynamics report")
    assert (mine / "index.html").read_text() == "<html>my notes</html>"
    # No page, but PNGs of the user's own in figures/: a report would delete them before writing its own.
    paper = tmp_path / "paper"
    (paper / "figures").mkdir(parents=True)
    (paper / "figures" / "fig1.png").write_bytes(b"mine")
    with pytest.raises(UsageError, match=r"--report .* holds figures/\*\.png but no report index.html"):
        check_report_dir(paper, "--report")  # what `report` and `demo` (before training) check
    assert (paper / "figures" / "fig1.png").read_bytes() == b"mine"


def test_usage_errors_are_one_line(tiny):
    # argparse's errors through the real entry point (SystemExit from the parser, not main's return)
    one_line_exit_2(dyn("run"), "the following arguments are required: config")
    one_line_exit_2(dyn("frob"), "invalid choice: 'frob'")
    d, _, _ = tiny
    store.init_store(d / "empty.zarr")
    one_line_exit_2(cli_in_process("report", d / "empty.zarr"), "holds no runs to report on")
    one_line_exit_2(cli_in_process("gates", d / "empty.zarr"), "holds no runs")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
def test_cuda_without_cuda_is_refused_before_any_store(tiny):
    d, cfg, _ = tiny
    one_line_exit_2(cli_in_process("run", cfg, "--out", d / "c.zarr", "--device", "cuda"), "has no usable CUDA device")
    one_line_exit_2(cli_in_process("sweep", cfg, "--out", d / "c.zarr", "--set", "train.device='cuda:1'"),
                    "has no usable CUDA device")
    assert not (d / "c.zarr").exists()


def test_a_sweep_on_an_existing_cluster_leaves_devices_to_its_workers(tiny):
    d, cfg, _ = tiny
    # The CUDA check is local; with --scheduler the workers decide, so the scheduler is what fails.
    one_line_exit_2(cli_in_process("sweep", cfg, "--out", d / "c2.zarr", "--set", "train.device='cuda'", "--scheduler",
                        d / "nofile"), "neither an address")


def test_check_scheduler_takes_a_host_port_address():
    from distributed import LocalCluster

    from dynamics.sweep.launcher import check_scheduler

    with LocalCluster(n_workers=0, processes=False, dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"}) as cluster:
        check_scheduler(cluster.scheduler_address.removeprefix("tcp://"))  # as Dask's Client accepts


def test_report_of_dot_inside_a_store_goes_next_to_it(tiny):
    d, _, path = tiny
    r = cli_in_process("report", ".", "--no-compute", cwd=path)
    assert r.returncode == 0, r.stderr
    assert (d / "s-report" / "index.html").is_file()


def test_status_names_stopped_and_pending_runs(tiny, tmp_path):
    _, cfg, path = tiny
    s = tmp_path / "s.zarr"
    train_run(load_config(cfg), str(s))
    rid = store.list_runs(s)[0]
    store.update_run_attrs(s, rid, status="running")  # as a run killed by SIGKILL leaves it
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {rid: {"train.seed": 0}, "rnever": {"train.seed": 1}}})
    r = cli_in_process("status", s)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:]}
    assert rows[rid][2] == "stopped"
    assert rows["rnever"][1:] == ["1", "pending", "0/?", "-", "-"]


def status_rows(capsys, path) -> tuple[list[str], list[list[str]]]:
    from dynamics.cli import main

    assert main(["status", str(path)]) == 0
    header, *rows = (line.split() for line in capsys.readouterr().out.splitlines())
    return header, rows


def test_run_says_a_resumed_run_was_resumed_and_from_where(tiny, tmp_path):
    # "completed after 20 steps" read as 20 steps trained by this command, which trained the last 12
    _, cfg, _ = tiny
    s = tmp_path / "s.zarr"
    with pytest.raises(KeyboardInterrupt):
        train_run(load_config(cfg, ["train.steps=20", "record.every=15"]), str(s), progress=interrupt_at(10))
    r = cli_in_process("run", cfg, "--out", s, "--set", "train.steps=20", "--set", "record.every=15")
    assert r.returncode == 0, r.stderr
    [rid] = store.list_runs(s)
    assert r.stdout.strip() == f"{rid}: completed after 20 steps (resumed at step 8) -> {s}"
    fresh = tmp_path / "fresh.zarr"
    r = cli_in_process("run", cfg, "--out", fresh, "--set", "train.steps=20", "--set", "record.every=15")
    assert r.stdout.strip() == f"{rid}: completed after 20 steps -> {fresh}"


def test_run_says_how_many_gate_fits_training_will_wait_for(tiny, tmp_path):
    # record.chg_every: the progress lines paused for seconds at each fit, with nothing saying why
    _, cfg, _ = tiny
    r = cli_in_process("run", cfg, "--out", tmp_path / "c.zarr", "--set", "train.steps=8", "--set", "record.every=4",
                       "--set", "record.chg_every=2", "--set", "record.chg_steps=2")
    assert r.returncode == 0, r.stderr
    # snapshots at 0, 1, 2, 4, 8: fits at the 1st, 3rd and 5th (the last)
    assert ("dynamics: note: CHG is fitted at 3 of the 5 snapshots (record.chg_every = 2), 6 gate updates each; "
            "training waits for each fit, so the progress lines pause") in r.stderr.splitlines()


def test_status_says_where_an_interrupted_run_resumes(tiny, tmp_path, capsys):
    # Interrupted in progress(10), once update 10 is made, it showed "11/20" alone: a resume
    # restarts from its checkpoint at 8.
    _, cfg, _ = tiny
    s = tmp_path / "s.zarr"
    with pytest.raises(KeyboardInterrupt):
        train_run(load_config(cfg, ["train.steps=20", "record.every=15"]), str(s), progress=interrupt_at(10))
    [rid] = store.list_runs(s)
    header, [row] = status_rows(capsys, s)
    got = dict(zip(header, row, strict=True))
    assert (got["status"], got["steps"], got["resumes_at"]) == ("interrupted", "11/20", "8")
    store.update_run_attrs(s, rid, status="running")  # as a run killed by SIGKILL leaves it
    _, [row] = status_rows(capsys, s)
    assert row[1:4] == ["stopped", "11/20", "8"]
    # killed after its checkpoint was written, before the attrs named it: the checkpoint's own step
    store.update_run_attrs(s, rid, checkpoint_step=4)
    _, [row] = status_rows(capsys, s)
    assert row[1:4] == ["stopped", "11/20", "8"]
    store.update_run_attrs(s, rid, steps_done=4)  # and the steps done before it
    _, [row] = status_rows(capsys, s)
    assert row[1:4] == ["stopped", "8/20", "8"]
    store.update_run_attrs(s, rid, steps_done=11, checkpoint_step=8)
    (s / "checkpoints" / rid / "ckpt.pt").rename(tmp_path / "aside.pt")
    _, [row] = status_rows(capsys, s)
    assert row[1:4] == ["stopped", "11/20", "lost"]  # "8" offered a resume that `run` refuses
    store.update_run_attrs(s, rid, status="completed")
    _, [row] = status_rows(capsys, s)
    assert row[1:4] == ["completed", "11/20", "-"]  # a finished run is never resumed


def test_status_lists_runs_in_the_grid_order_not_by_id(tiny, tmp_path, capsys):
    # Sorted by run id (hashes), recorded runs first, a grid read as a shuffle. The index lists the
    # grid in the config's order (seed slowest, init_scale 2.0 before 0.5); a later sweep's new value
    # comes after; a run outside any sweep last.
    import shutil

    _, _, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    [rid] = store.list_runs(s)  # recorded, and placed in the middle of the grid
    runs = {"rd": (0, 2.0), "rb": (0, 0.5), rid: (1, 2.0), "ra": (1, 0.5), "re": (0, 1.0)}
    store.write_sweep_index(s, {"axes": ["train.seed", "model.init_scale"],
                                "runs": {r: {"train.seed": a, "model.init_scale": b} for r, (a, b) in runs.items()}})
    header, rows = status_rows(capsys, s)
    assert header[:3] == ["run", "train.seed", "model.init_scale"]
    assert [r[0] for r in rows] == ["rd", "rb", "re", rid, "ra"]
    # a point never started has nothing to resume from: its resumes_at said 0, a checkpoint it does not have
    assert rows[3][3] == "completed" and all(r[3:6] == ["pending", "0/?", "-"] for r in rows if r[0] != rid)
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {"rz": {"train.seed": 0}}})
    _, rows = status_rows(capsys, s)
    assert [r[0] for r in rows] == ["rz", rid]
    # outside the index, its own config's seed, as the report's runs table shows it (it was blank)
    assert rows[1][1] == "0"
    # two sweeps of one grid from other base configs: each point's runs in the order the sweeps
    # recorded them (by id, ry and rb swapped places against rx and ra from point to point)
    two = {"ry": 0, "rx": 1, "rb": 0, "ra": 1}
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {r: {"train.seed": v} for r, v in two.items()}})
    _, rows = status_rows(capsys, s)
    assert [r[0] for r in rows] == ["ry", "rb", "rx", "ra", rid]


def test_analyse_of_one_head_per_layer_prints_divergence_undefined_with_the_reason(tiny, tmp_path):
    # The divergence column printed "nan" beside the bifurcation column's "undefined".
    _, cfg, _ = tiny
    path = tmp_path / "h1.zarr"
    train_run(load_config(cfg, ["model.n_heads=1"]), str(path))
    r = cli_in_process("analyse", path, "--workers", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header, row = lines[0].split(), lines[1].split()
    assert row[header.index("bifurcation")] == "undefined" and row[header.index("divergence")] == "undefined"
    assert not re.search(r"\bnan\b", r.stdout)  # as a number ("dominant" holds the letters)
    assert lines[2].startswith("bifurcation: step")  # the columns' legend, then why they are undefined
    assert lines[3].startswith("undefined: one head per layer, so no pair of heads to compare")


def test_analyse_table_lists_the_sweep_points_not_started(tiny, tmp_path):
    # On a sweep still running, or stopped part-way, the table left out the points not started
    # while `status` and the report list them: 1 row of a 3-point sweep read as the whole sweep.
    import shutil

    _, _, path = tiny
    partway = tmp_path / "partway.zarr"
    shutil.copytree(path, partway)
    (done,) = store.list_runs(partway)
    store.write_sweep_index(partway, {"axes": ["train.seed"], "runs": {
        "rlater": {"train.seed": 1}, done: {"train.seed": 0}, "rlast": {"train.seed": 2}}})
    r = cli_in_process("analyse", partway, "--workers", "1")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:4]]
    assert rows[0][:3] == ["rlater", "1", "pending"] and rows[2][:3] == ["rlast", "2", "pending"]
    assert r.stdout.splitlines()[1].endswith("not analysed (not started)")
    assert rows[1][:3] == [done, "0", "completed"]
    assert "analysed 1 runs" in r.stdout


def test_analyse_with_nothing_to_analyse_does_not_say_it_wrote_to_the_store(tiny, tmp_path):
    # "analysed 0 runs in 1.3s -> STORE (analysis/<run_id>)" read as a result written there
    import shutil

    _, _, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    (rid,) = store.list_runs(s)
    store.update_run_attrs(s, rid, status="running")  # killed outright: nothing finished to analyse
    before = sorted(p.relative_to(s) for p in (s / "analysis").rglob("*"))
    r = cli_in_process("analyse", s, "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "analysed no run: none could be (the table says why)"
    assert sorted(p.relative_to(s) for p in (s / "analysis").rglob("*")) == before


def test_gates_on_a_killed_run_names_it_stopped_not_running(tiny, tmp_path):
    # A run killed outright still says "running" in its attrs; gates' note repeated that, while
    # `dynamics status` calls it "stopped" (nothing trains it).
    _, cfg, _ = tiny
    path = tmp_path / "killed.zarr"
    with pytest.raises(KeyboardInterrupt):
        train_run(load_config(cfg), str(path), progress=interrupt_at(5))
    (rid,) = store.list_runs(path)
    store.update_run_attrs(path, rid, status="running")  # as SIGKILL leaves it: no chance to say otherwise
    r = cli_in_process("gates", path, "--steps", "2", "--init-steps", "0", "--restarts", "1", "--no-save")
    assert r.returncode == 0, r.stderr
    assert f"dynamics: note: run {rid} is stopped; these gates are fitted to its checkpoint at step" in r.stderr


def test_gates_refuses_a_run_trained_with_conditioned_gates(tmp_path):
    # Its conditioned gates act through hooks a loaded checkpoint lacks: refused before loading.
    cfg = tmp_path / "cg.toml"
    cfg.write_text(TINY.format(steps=4, every=2) + "\n[intervene.conditioned_gates]\n")
    path = tmp_path / "cg.zarr"
    train_run(load_config(cfg), str(path))
    one_line_exit_2(cli_in_process("gates", path), "change its forward pass outside the checkpoint's weights")
    assert store.open_derived(path, f"gates.{store.list_runs(path)[0]}") is None


@pytest.mark.parametrize("args", [["status"], ["analyse"], ["predict", "--target", "importance"], ["gates"],
                                  ["report", "--out", "{d}/rep"]])
def test_a_store_of_a_newer_version_is_refused_by_every_command(tiny, tmp_path, args):
    # `dynamics run` refused it, but analyse, predict and gates wrote their results into it.
    import json
    import shutil

    _, _, path = tiny
    newer = tmp_path / "newer.zarr"
    shutil.copytree(path, newer)
    root = json.loads((newer / "zarr.json").read_text())
    root["attributes"]["dynamics_store"] = store.STORE_VERSION + 1
    (newer / "zarr.json").write_text(json.dumps(root))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    r = cli_in_process(args[0], newer, *(a.format(d=tmp_path) for a in args[1:]))
    one_line_exit_2(r, f"store version {store.STORE_VERSION + 1} is newer than this package supports")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_run_of_a_config_with_a_sweep_table_says_it_trains_the_base_point_only(tiny, tmp_path):
    _, cfg, _ = tiny
    swept = tmp_path / "swept.toml"
    swept.write_text(Path(cfg).read_text() + '\n[sweep]\n"train.seed" = [0, 1]\n')
    r = cli_in_process("run", swept, "--out", tmp_path / "s.zarr")
    assert r.returncode == 0, r.stderr
    assert "has a [sweep] table; `dynamics run` trains only its base point" in r.stderr
    assert len(store.list_runs(tmp_path / "s.zarr")) == 1
    assert "[sweep]" not in r.stdout
    # a table given by --set is said to be: the file has none
    r = cli_in_process("run", cfg, "--out", tmp_path / "s2.zarr", "--set", "sweep.train.seed=[1, 2]")
    assert r.returncode == 0, r.stderr
    assert (f"dynamics: note: {cfg} with --set sweep.train.seed has a [sweep] table; `dynamics run` trains only its "
            f"base point (`dynamics sweep` trains the grid)") in r.stderr.splitlines()


def test_a_refused_run_is_one_line_without_the_notes_of_a_run_that_trains(tiny, tmp_path):
    # The [sweep] note (and the CHG and threads notes) came before the refusal, two lines for one problem
    _, cfg, _ = tiny
    swept = tmp_path / "swept.toml"
    swept.write_text(Path(cfg).read_text() + '\n[sweep]\n"train.seed" = [0, 1]\n')
    s = tmp_path / "s.zarr"
    assert cli_in_process("run", swept, "--out", s, "--run-id", "mine").returncode == 0
    r = cli_in_process("run", swept, "--out", s, "--run-id", "mine", "--set", "train.lr=0.5")
    one_line_exit_2(r, "recorded with a different config")


def test_analyse_goes_on_past_a_run_whose_analysis_fails(tiny, tmp_path):
    # A corrupt chunk in one run ended `dynamics analyse` with a traceback before the other runs.
    _, cfg, _ = tiny
    path = tmp_path / "two.zarr"
    for seed in (0, 1):
        train_run(load_config(cfg, [f"train.seed={seed}"]), str(path))
    broken, good = store.list_runs(path)
    chunk = sorted((path / "runs" / broken / "attention" / "c").rglob("*"))
    next(p for p in chunk if p.is_file()).write_bytes(b"not zstd")
    r = cli_in_process("analyse", path, "--workers", "1")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert (f"not analysed (analysis failed: StoreError: {path}: run {broken}: array attention at snapshot 0 (step 0): "
            f"its chunk runs/{broken}/attention/c/0/0/0/0/0/0 cannot be decoded (damaged: its CRC32C checksum does not "
            f"match: its bytes changed, or were cut short, after they were written)"
            in r.stdout)
    assert r.stderr.strip().splitlines()[-1] == f"dynamics: the analysis of 1 run(s) failed: {broken}"
    assert store.open_analysis(path, good) is not None
    assert store.open_analysis(path, broken) is None


def test_demo_timing_gives_a_share_of_training_only_when_it_trained_every_run():
    # a second `dynamics demo` of one store trained nothing and printed
    # "training 0.0s, analysis 4.9s (26694.6% of training)"
    from dynamics.cli import demo_timing

    assert demo_timing(80.0, 8.0, 95.4, 0, 12) == "training 80.0s, analysis 8.0s (10.0% of training), total 95s"
    assert demo_timing(0.02, 4.9, 9.0, 12, 12) == ("training 0.0s, analysis 4.9s (no share of training: 12 of 12 "
                                                   "runs were already finished, not retrained), total 9s")
    assert "% of training" not in demo_timing(40.0, 8.0, 50.0, 6, 12)


def test_demo_help_gives_the_report_default_that_follows_out():
    # cmd_demo puts the report next to --out (x.zarr -> x-report); the help said runs/quickstart-report always
    r = dyn("demo", "--help")
    assert r.returncode == 0
    assert "<store>-report next to the store" in " ".join(r.stdout.split())


def test_demo_report_default_for_a_url_store_is_its_name_in_cwd(tmp_path, monkeypatch, capsys):
    # as `dynamics report` does; the demo made Path("file:///x/d.zarr" - ".zarr" + "-report"), a
    # folder "file:" in the working directory. Both defaults are made unusable here, so the demo
    # is refused before any work and the refusal names the one it chose.
    from dynamics.cli import main

    (tmp_path / "file:").write_text("")
    (tmp_path / "d-report").write_text("")
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--out", f"file://{tmp_path}/d.zarr"]) == 2
    assert capsys.readouterr().err == "dynamics: error: the default report folder d-report exists and is not a directory\n"


def test_a_report_inside_the_default_store_names_it_as_the_default(tmp_path, monkeypatch, capsys):
    from dynamics.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--report", "runs/quickstart.zarr/rep"]) == 2
    assert capsys.readouterr().err == ("dynamics: error: --report runs/quickstart.zarr/rep is inside the store "
                                       "runs/quickstart.zarr (no --out given: the default) is to become; a report "
                                       "goes next to it, not into it\n")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["run", "sweep", "demo", "report"])
def test_a_default_path_is_named_as_the_default_not_as_an_option_never_given(tiny, tmp_path, monkeypatch, capsys,
                                                                              command):
    # "--out runs/tiny.zarr exists ..." when no --out had been given sent one looking for it
    from dynamics.cli import main

    _, cfg, path = tiny
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    stem = "quickstart" if command == "demo" else Path(cfg).stem
    (tmp_path / "runs" / f"{stem}.zarr").write_text("")
    (tmp_path / "s-report").write_text("")
    shutil.copytree(path, tmp_path / "s.zarr")
    argv = {"demo": ["demo"], "report": ["report", "s.zarr"]}.get(command, [command, str(cfg)])
    assert main(argv) == 2
    expected = ("the default report folder s-report exists and is not a directory" if command == "report" else
                f"no --out given: the default store runs/{stem}.zarr exists and is not a dynamics store; "
                "refusing to overwrite it")
    assert capsys.readouterr().err == f"dynamics: error: {expected}\n"


def test_a_sweep_axis_is_changed_through_the_sweep_table():
    from dynamics.sweep.grid import expand_grid

    cfg = load_config(ROOT / "experiments" / "quickstart.toml", ["sweep.train.seed=[5]"])
    assert {p.values["train.seed"] for p in expand_grid(cfg)} == {5}


def test_analyse_defaults_to_the_cores_this_process_may_use(tiny, monkeypatch):
    import os

    import dynamics.analyse
    from dynamics import cli

    _, _, path = tiny
    seen = []
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(dynamics.analyse, "analyse_store", lambda *a, workers, **k: seen.append(workers) or [])
    cli.analyse_store(str(path))
    assert seen == [1]  # as the sweep's default_workers: one process per usable core, not per machine core


def test_run_notes_threads_beyond_the_cores_it_may_use(tiny, tmp_path, monkeypatch, capsys):
    # Not refused (a config may be meant for a larger machine), but said: the threads share cores.
    import os

    from dynamics.cli import main

    _, cfg, path = tiny
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    fresh = str(tmp_path / "t.zarr")
    assert main(["run", str(cfg), "--out", fresh, "--set", "train.threads=2", "--set", "train.steps=2"]) == 0
    assert ("dynamics: note: train.threads 2 is more than the 1 core this process may use; its threads would "
            "share cores and train slower") in capsys.readouterr().err
    assert main(["run", str(cfg), "--out", str(path)]) == 0
    assert "train.threads" not in capsys.readouterr().err
    assert main(["run", str(cfg), "--out", str(path), "--set", "train.threads=2"]) == 0  # completed: skipped
    assert "note" not in capsys.readouterr().err  # nothing trains: nothing to note


def test_one_damaged_run_is_named_and_the_other_runs_are_still_processed(tiny, tmp_path, capsys):
    # A run group whose zarr.json was cut short made status, analyse and report refuse the whole store.
    import shutil

    from dynamics import cli

    _, _, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    good = store.list_runs(s)[0]
    shutil.copytree(s / "runs" / good, s / "runs" / "broken")
    meta = s / "runs" / "broken" / "zarr.json"
    damaged = meta.read_bytes()[:40]
    meta.write_bytes(damaged)
    named = "runs/broken exists but its metadata runs/broken/zarr.json cannot be read (damaged)"
    last = "dynamics: 1 run(s) could not be read (damaged), skipped: broken"

    assert cli.main(["status", str(s)]) == 1
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["broken"][1:] == ["damaged", "-", "-", "-"] and rows[good][1] == "completed"
    assert named in err and err.strip().splitlines()[-1] == last

    # analyse and report go on run by run (their other runs: test_analyse_goes_on_past_a_run_whose_analysis_fails,
    # test_report_data); here, cheaply, the damaged run alone
    shutil.rmtree(s / "runs" / good)
    assert cli.main(["analyse", str(s), "--workers", "1"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[:3] == ["broken", "damaged", "-"]
    assert f"not analysed (analysis failed: StoreError: {s}: run group {named}" in out
    assert err.strip().splitlines()[-1] == "dynamics: the analysis of 1 run(s) failed: broken"
    assert cli.main(["report", str(s), "--out", str(tmp_path / "rep"), "--no-compute"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == last
    assert named in (tmp_path / "rep" / "index.html").read_text()
    for args in (["analyse", str(s), "--run", "broken"],
                 ["report", str(s), "--run", "broken", "--out", str(tmp_path / "rep2")]):
        assert cli.main(args) == 2  # the one run asked for is the damaged one: refused, named
        [line] = capsys.readouterr().err.strip().splitlines()
        assert named in line
    assert meta.read_bytes() == damaged
    assert not (s / "analysis" / "broken").exists() and not (tmp_path / "rep2").exists()


@pytest.mark.parametrize("args", [["run", "{cfg}", "--out"], ["sweep", "{cfg}", "--out"], ["demo", "--out"], ["status"], ["analyse"],
                                  ["predict"], ["gates"], ["report", "--out", "{d}/rep"]])
def test_a_store_whose_root_metadata_is_cut_short_is_named_as_damaged_by_every_command(tiny, tmp_path, args, capsys):
    # run and sweep called it a folder that "exists and is not a dynamics store"
    import shutil

    from dynamics import cli

    _, cfg, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    (s / "zarr.json").write_bytes((path / "zarr.json").read_bytes()[:30])
    before = sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    argv = [a.format(cfg=cfg, d=tmp_path) for a in args]
    argv.insert(argv.index("--out") + 1 if argv[-1] == "--out" else 1, str(s))
    assert cli.main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == f"dynamics: error: {s}: the store's root metadata zarr.json cannot be read (damaged); restore it " \
                   f"from a backup"
    assert sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before


def _refused(argv, needle, capsys):
    """In-process: exit 2 and one line on stderr holding `needle`."""
    from dynamics import cli

    assert cli.main([str(a) for a in argv]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert needle in line, line
    return line


@pytest.mark.parametrize("args", [["run", "{cfg}", "--out", "{link}"], ["sweep", "{cfg}", "--out", "{link}"],
                                  ["run", "{cfg}", "--out", "{link}/sub/x.zarr"], ["report", "{path}", "--out", "{link}"],
                                  ["demo", "--out", "{new}", "--report", "{link}"], ["demo", "--out", "{link}"]])
def test_a_link_to_nothing_is_refused_before_any_work(tiny, tmp_path, args, capsys):
    # run: "run failed: FileExistsError" (exit 1); sweep, report: a traceback; demo --report: after the whole sweep
    _, cfg, path = tiny
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    argv = [a.format(cfg=cfg, path=path, link=link, new=tmp_path / "new.zarr") for a in args]
    _refused(argv, f"{link} is a symbolic link to {tmp_path / 'gone'}, which does not exist", capsys)
    assert sorted(tmp_path.iterdir()) == [link]


@pytest.mark.parametrize("args", [["run", "{cfg}", "--out", "{link}/x.zarr"], ["report", "{path}", "--out", "{link}/rep"]])
def test_a_path_through_a_link_into_a_store_is_inside_it(tiny, tmp_path, args, capsys):
    # the link hid the store: a second store, or a report, was written into its analysis/ folder
    _, cfg, path = tiny
    link = tmp_path / "results"
    link.symlink_to(path / "analysis")
    before = sorted(p.name for p in (path / "analysis").iterdir())
    _refused([a.format(cfg=cfg, path=path, link=link) for a in args], f"is inside the store {path}", capsys)
    assert sorted(p.name for p in (path / "analysis").iterdir()) == before


@pytest.mark.parametrize("command", ["status", "analyse", "predict", "gates", "report"])
def test_a_store_url_without_its_filesystem_is_named(command, capsys):
    # was "not a dynamics store: s3://..." when s3fs is not installed, as for a wrong path
    _refused([command, "nosuch://bucket/x.zarr"], "nosuch://bucket/x.zarr: no filesystem for the URL scheme 'nosuch'",
             capsys)
    _refused([command, "memory://x.zarr"], "a memory:// store lives only as long as this command", capsys)


def test_a_tilde_in_a_path_is_the_home_folder_everywhere(tiny, tmp_path, monkeypatch, capsys):
    # bash leaves --out=~/x as it is: stores read it as $HOME/x, but a report went to ./~/x
    # and a config ~/x.toml was "not found"
    d, cfg, path = tiny
    monkeypatch.setenv("HOME", str(d))
    monkeypatch.chdir(tmp_path)
    _refused(["report", f"~/{path.name}", "--out", "~/afile/rep"], f"{d}/afile is a file, not a directory", capsys)
    _refused(["run", f"~/{cfg.name}", "--out=~/afile/x.zarr"], f"{d}/afile is a file, not a directory", capsys)
    assert not any(tmp_path.iterdir())
    _refused(["status", ""], "STORE: empty value", capsys)  # was "--store", a flag there is not
    _refused(["run", " "], "CONFIG: empty value", capsys)


@pytest.mark.parametrize("args, needle", [
    (["run", "{cfg}", "--out", "file://{d}/afile/x.zarr"], "afile is a file, not a directory"),  # was exit 1, "run failed"
    (["sweep", "{cfg}", "--out", "file://{path}/analysis/x.zarr"], "is inside the store"),  # was written there
    (["report", "{path}", "--out", "file://{d}/afile/rep"], "afile is a file, not a directory"),  # was ./file:/...
    (["report", "{path}", "--out", "s3://bucket/rep"], "--out s3://bucket/rep: a report is written to a local folder"),
    (["demo", "--out", "{d}/new.zarr", "--report", "s3://bucket/rep"], "--report s3://bucket/rep: a report is written"),
])
def test_a_file_url_is_checked_as_the_local_path_it_names(tiny, tmp_path, monkeypatch, args, needle, capsys):
    d, cfg, path = tiny
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in (path / "analysis").iterdir())
    _refused([a.format(d=d, cfg=cfg, path=path) for a in args], needle, capsys)
    assert not any(tmp_path.iterdir()) and not (d / "new.zarr").exists()
    assert sorted(p.name for p in (path / "analysis").iterdir()) == before


def test_status_tells_apart_runs_outside_a_sweep_that_differ_only_in_their_seed(tiny, tmp_path):
    # `dynamics run --set train.seed=5` and `=6` into one store: two rows told apart by their hash alone
    import shutil

    from dynamics.config import with_values
    from dynamics.status import status_table

    _, cfg, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    [first] = store.list_runs(s)
    other = train_run(with_values(load_config(cfg), {"train.seed": 5}), str(s)).run_id
    header, rows, _ = status_table(str(s))
    assert header[:3] == ["run", "train.seed", "status"]
    assert {r[0]: r[1] for r in rows} == {first: str(load_config(cfg).train.seed), other: "5"}


def test_status_tells_apart_runs_at_one_swept_point_by_the_settings_that_differ(tiny, tmp_path, capsys):
    # A seed sweep from two base configs (--set train.lr=...) into one store, and a seed sweep of
    # conditioned gates beside its free runs (README, Configs): status showed only the swept columns,
    # so the three runs of seed 0 were three identical rows, while the report's runs table names them.
    import shutil
    import tomllib

    from dynamics.config import from_dict, with_values
    from dynamics.status import status_table

    d, cfg, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    [free] = store.list_runs(s)
    base = from_dict(tomllib.loads(cfg.read_text()))
    slow = train_run(with_values(base, {"train.lr": 1e-3}), str(s)).run_id
    gated = train_run(from_dict({**tomllib.loads(cfg.read_text()),
                                 "intervene": {"conditioned_gates": {"pool": "mean"}}}), str(s)).run_id
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {free: {"train.seed": 0}, slow: {"train.seed": 0},
                                                                 gated: {"train.seed": 0}, "rp": {"train.seed": 1}}})
    header, rows, damaged = status_table(str(s))
    assert not damaged
    assert header[:4] == ["run", "train.seed", "intervene.conditioned_gates", "train.lr"]
    got = {r[0]: r[1:4] for r in rows}
    assert got[free] == ["0", "none", "0.003"] and got[slow] == ["0", "none", "0.001"]
    assert got[gated][0::2] == ["0", "0.003"] and '"pool":"mean"' in got[gated][1] and " " not in got[gated][1]
    assert got["rp"] == ["1", "", ""]  # pending: no config to show
    assert len({tuple(r[1:4]) for r in rows}) == 4

    # the analyse (and demo) table had the same identical rows: it shares status's columns
    from dynamics.tables import print_analysis

    row = {"status": "completed", "bifurcation_step": 10, "final_divergence": 0.25, "redundancy": 0.0,
           "slash_dominant": 0, "roles": {"none": 4}}
    capsys.readouterr()
    print_analysis([{"run": r} | row for r in (free, slow, gated)], str(s), pending=True)
    table = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert table[0][:5] == ["run", "train.seed", "intervene.conditioned_gates", "train.lr", "status"]
    shown = {line[0]: line[1:4] for line in table[1:]}
    assert shown[free] == ["0", "none", "0.003"] and shown[slow] == ["0", "none", "0.001"]
    assert shown[gated][0::2] == ["0", "0.003"] and '"pool":"mean"' in shown[gated][1]
    assert shown["rp"][:2] == ["1", "pending"]  # no config: blank settings

    # one base config: nothing to tell apart, no extra column
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {free: {"train.seed": 0}, slow: {"train.seed": 1}}})
    header, _, _ = status_table(str(s))
    assert "train.lr" not in header  # the two are at different points; gated, outside the index, alone there


def test_ctrl_c_while_zarr_waits_prints_no_never_awaited_warning(tmp_path):
    # Ctrl-C before zarr's event loop ran the coroutine its sync() handed over left that
    # coroutine never run, and Python printed a RuntimeWarning after the one line, at exit.
    script = tmp_path / "interrupted.py"
    script.write_text(
        "import sys\n"
        "from dynamics import cli\n"
        "async def write(): pass\n"
        "def status(args):\n"
        "    pending = write()  # as zarr's sync() leaves it\n"
        "    raise KeyboardInterrupt\n"
        "cli.cmd_status = status\n"
        "sys.exit(cli.main(['status', 'x.zarr']))\n"
    )
    done = subprocess.run([sys.executable, "-W", "default", str(script)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 130
    assert done.stderr.strip() == "dynamics: interrupted; nothing was written"
