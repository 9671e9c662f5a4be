"""Where the CLI reads and writes: paths through links, URLs and a tilde, default paths, report
folders; stores that are damaged, read-only, on a full disk, or of another version."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dynamics import store
from dynamics.config import load_config, with_values
from dynamics.train import train_run
from dynamics.usage import UsageError, check_report_dir
from tests.conftest import cli_in_process
from tests.test_cli import one_line_exit_2


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_memory_url_out_is_refused(tiny, command, capsys):
    # fsspec's memory:// is this process's dict: the store would vanish when the command exits,
    # and a sweep's worker processes would each record into their own, all reported completed
    from dynamics import cli

    _, cfg, _ = tiny
    assert cli.main([command, str(cfg), "--out", "memory://dynamics-cli/s.zarr"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "a memory:// store lives only as long as this command" in line


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


@pytest.mark.parametrize("command", ["run", "sweep"])
@pytest.mark.parametrize("section", ["runs", "checkpoints"])
@pytest.mark.parametrize("how", ["read_only", "file"])
def test_a_store_whose_runs_or_checkpoints_folder_cannot_take_a_run_is_refused_before_training(
        tiny, tmp_path, command, section, how):
    # Only the store's root was checked: a sweep started its cluster, rewrote the sweep index and
    # failed every point (exit 1); a run failed after its lock was written (exit 1)
    _, cfg, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    toml = tmp_path / "sweep.toml"
    toml.write_text(Path(cfg).read_text() + '\n[sweep]\n"train.seed" = [5, 6]\n')
    args = [command, toml if command == "sweep" else cfg, "--out", s]
    args += ["--workers", "1"] if command == "sweep" else ["--set", "train.seed=7"]  # a run not recorded yet
    folder = s / section
    folder.mkdir(exist_ok=True)
    if how == "file":
        shutil.rmtree(folder)
        folder.write_text("x")
    elif os.geteuid() != 0:
        folder.chmod(0o555)
    elif subprocess.run(f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} {folder}",
                        shell=True, capture_output=True).returncode != 0:
        pytest.skip("root here cannot make a read-only mount")
    before = {str(p): p.read_bytes() for p in sorted(s.rglob("*")) if p.is_file()}
    try:
        one_line_exit_2(cli_in_process(*args),
                        f"--out {s}: its {section}/ folder is read-only here, and this command writes into it"
                        if how == "read_only" else
                        f"{s}: {section} is not a folder (the store is damaged); restore it from a backup")
    finally:
        if how == "file":
            pass
        elif os.geteuid() != 0:
            folder.chmod(0o755)
        else:
            subprocess.run(["umount", str(folder)], check=True)
    assert {str(p): p.read_bytes() for p in sorted(s.rglob("*")) if p.is_file()} == before


@pytest.mark.parametrize("section", ["analysis", "derived", ".staging"])
def test_a_computed_section_that_is_a_file_stops_its_writers_not_its_readers(tiny, tmp_path, section):
    # analyse failed each run's analysis with a FileExistsError; status read no further than the
    # check; a file .staging (where results are written before the swap) failed every writer with a
    # FileExistsError traceback, gates after its whole fit
    import shutil

    _, _, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    shutil.rmtree(s / section, ignore_errors=True)
    (s / section).write_text("x")
    derived = [["analyse"], ["predict", "--target", "importance"], ["gates", "--steps", "2", "--restarts", "1"]]
    writers = {"analysis": [["analyse"]], "derived": derived, ".staging": derived}[section]
    for command in writers:
        one_line_exit_2(cli_in_process(command[0], s, *command[1:]),
                        f"{s}: {section} is not a folder (the store is damaged); move it aside")
    r = cli_in_process("status", s)
    assert r.returncode == 0 and store.list_runs(s)[0] in r.stdout
    assert (s / section).read_text() == "x"
    if section == ".staging":  # run and sweep never write there: a stray file does not stop training
        from dynamics.usage import check_writable

        check_writable(str(s), "--out", into=("runs", "checkpoints"))
    # the demo writes analyses and a curve too: it trained every run, then failed each (b03b79f)
    one_line_exit_2(cli_in_process("demo", "--out", s, "--report", tmp_path / "rep"),
                    f"{s}: {section} is not a folder (the store is damaged); move it aside")


@pytest.mark.parametrize("config, needle", [
    (lambda c: {**c, "model": {**c["model"], "newkey": 1}}, "its recorded config cannot be read by this version: "),
    (lambda c: None, "has damaged attributes in runs/{rid}/zarr.json (config = None, not a table)"),
])
def test_a_run_whose_recorded_config_this_version_cannot_read_is_named(tiny, tmp_path, config, needle):
    # A newer version's key read "unknown key 'model.newkey'" as if typed by the user, naming no
    # run; a missing config attribute was a KeyError traceback.
    import shutil

    _, cfg, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    [rid] = store.list_runs(s)
    store.update_run_attrs(s, rid, config=config(store.run_attrs(s, rid)["config"]))
    needle = needle.format(rid=rid)
    if "damaged attributes" in needle:  # damaged, as a status of the wrong type is: named by every command
        one_line_exit_2(cli_in_process("gates", s, "--steps", "2", "--restarts", "1"), needle)
        # analyse wrote every analysis, then a traceback (AttributeError) from cross-seed consistency
        r = cli_in_process("analyse", s)
        assert r.returncode == 1 and "Traceback" not in r.stderr and needle in r.stderr, r.stderr
        one_line_exit_2(cli_in_process("run", cfg, "--out", s), needle)  # was a traceback in one line, exit 1
        return
    one_line_exit_2(cli_in_process("gates", s, "--steps", "2", "--restarts", "1"), f"run {rid} in {s}: {needle}")


def _copy_with_attributes(tiny, tmp_path, change):
    """(config path, store, run id): a copy of tiny's store whose one run's zarr.json attributes
    ``change(attributes)`` edits in place, as a hand edit would."""
    import json

    _, cfg, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    [rid] = store.list_runs(s)
    meta = json.loads((s / "runs" / rid / "zarr.json").read_text())
    change(meta["attributes"])
    (s / "runs" / rid / "zarr.json").write_text(json.dumps(meta))
    return cfg, s, rid


def test_a_run_that_records_no_config_is_not_called_one_of_another_config(tiny, tmp_path):
    # a run written through the store API may have no config: "recorded with a different config" was untrue
    cfg, s, rid = _copy_with_attributes(tiny, tmp_path, lambda a: a.pop("config"))
    one_line_exit_2(cli_in_process("run", cfg, "--out", s),
                    f"run {rid} in {s} records no config, so it cannot be told to be this config's run; refusing "
                    "to train into it")
    r = cli_in_process("analyse", s)  # its recordings are analysed; cross-seed consistency leaves it out
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


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


def test_a_full_disk_is_one_line_exit_1_and_keeps_what_was_there(tiny, tmpfs):
    """`analyse` and `report` on a full disk printed a traceback (the derived consistency and the
    report page are written after each run's analysis). Needs a small filesystem: a tmpfs, which
    only root can mount."""
    import os
    import shutil

    import xarray as xr

    from dynamics import store

    _, _, path = tiny
    disk = tmpfs("4m")
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
    figures = sorted(os.listdir(disk / "rep" / "figures"))
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
    assert sorted(os.listdir(disk / "rep" / "figures")) == figures  # no folder of the failed report left


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


def test_report_of_dot_inside_a_store_goes_next_to_it(tiny):
    d, _, path = tiny
    r = cli_in_process("report", ".", "--no-compute", cwd=path)
    assert r.returncode == 0, r.stderr
    assert (d / "s-report" / "index.html").is_file()


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


def test_demo_report_default_for_a_file_url_store_is_next_to_the_folder_it_names(tmp_path, monkeypatch, capsys):
    # as `dynamics report` does; the demo made Path("file:///x/d.zarr" - ".zarr" + "-report"), a
    # folder "file:" in the working directory, and then "d%20e-report" there, the URL's name
    # undecoded, for a store that is a local folder. Every default is made unusable here, so the
    # demo is refused before any work and the refusal names the one it chose.
    from dynamics.cli import main

    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    for name in ("file:", "d%20e-report", "d e-report"):
        (cwd / name).write_text("")
    (tmp_path / "d e-report").write_text("")
    monkeypatch.chdir(cwd)
    assert main(["demo", "--out", f"file://{tmp_path}/d%20e.zarr"]) == 2
    assert capsys.readouterr().err == (f"dynamics: error: the default report folder {tmp_path}/d e-report exists "
                                       f"and is not a directory\n")


def test_report_default_for_a_remote_store_is_its_name_in_cwd():
    from dynamics.cli import default_report_dir

    assert default_report_dir("memory://bucket/x/d.zarr") == Path("d-report")
    assert default_report_dir("file:///data/my%20runs.zarr") == Path("/data/my runs-report")


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
    # gone, not cut short: "not a dynamics store" hid the runs beside it as a wrong path
    (s / "zarr.json").unlink()
    before = sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    assert cli.main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == f"dynamics: error: {s}: the store's root metadata zarr.json is missing, though runs/ holds 1 run " \
                   f"group(s) ({', '.join(n for n in os.listdir(s / 'runs') if n != 'zarr.json')}) (damaged); restore it from a backup"
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


def test_run_refuses_a_store_whose_sweep_index_is_damaged_as_every_command_does(tiny, tmp_path):
    # status, analyse, sweep ... refused it in one line; `run` trained a new run into it and
    # rewrote its root zarr.json
    import json

    from tests.test_resume import tree_bytes

    _, cfg, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    doc = json.loads((s / "zarr.json").read_text())
    doc["attributes"]["sweep"] = 5
    (s / "zarr.json").write_text(json.dumps(doc))
    before = tree_bytes(s)
    for extra in ([], ["--set", "train.seed=9"]):  # the finished run, and a new one
        one_line_exit_2(cli_in_process("run", cfg, "--out", s, *extra),
                        f"{s}: the sweep index in the store's root zarr.json is damaged (5, not a table)")
    assert tree_bytes(s) == before


def test_a_sweep_refuses_a_store_with_a_run_of_damaged_attributes_outside_its_grid(tiny, tmp_path):
    # An unreadable zarr.json outside the grid was refused, damaged attributes were not: the sweep
    # trained its points, exit 0, and named nothing (README: sweep refuses such a store)
    from dynamics.sweep import expand_grid

    cfg, s, rid = _copy_with_attributes(tiny, tmp_path, lambda a: a.update(status="weird"))
    swept = tmp_path / "sweep.toml"
    swept.write_text(Path(cfg).read_text() + '\n[sweep]\n"train.seed" = [5]\n')  # not tiny's run
    assert rid not in {p.run_id for p in expand_grid(load_config(swept))}
    before = {str(p): p.read_bytes() for p in sorted(s.rglob("*")) if p.is_file()}
    one_line_exit_2(cli_in_process("sweep", swept, "--out", s, "--workers", "1"),
                    f"run group runs/{rid} has damaged attributes in runs/{rid}/zarr.json (status = 'weird', not one a run writes")
    assert {str(p): p.read_bytes() for p in sorted(s.rglob("*")) if p.is_file()} == before


def _without_dac_override(cmd: list[str]) -> list[str]:
    """`cmd` run where file modes stop it: as a user they do; root gets setpriv to drop its
    override of them for the command alone (skipped where root cannot)."""
    if os.geteuid() != 0:
        return cmd
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    if shutil.which("setpriv") is None or subprocess.run([*drop, "true"], capture_output=True).returncode != 0:
        pytest.skip("root here cannot drop its override of file modes")
    return [*drop, *cmd]


def test_an_unreadable_store_or_run_is_named_as_unreadable_and_the_other_runs_go_on(tiny, tmp_path):
    # A store with the wrong owner was "not a dynamics store" (its data called foreign), `run --out`
    # into it "stopped ... run it again" (exit 1), and one run's unreadable zarr.json stopped
    # `status` of every run with no table.
    import sys

    d, cfg, path = tiny
    dyn = [sys.executable, "-m", "dynamics"]
    shut = tmp_path / "shut.zarr"
    shutil.copytree(path, shut)
    shut.chmod(0o000)
    try:
        for args in (["status", str(shut)], ["run", str(cfg), "--out", str(shut)]):
            r = subprocess.run(_without_dac_override([*dyn, *args]), capture_output=True, text=True)
            assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
            assert "permission" in r.stderr.lower() and "not a dynamics store" not in r.stderr, r.stderr
    finally:
        shut.chmod(0o755)
    two = tmp_path / "two.zarr"
    shutil.copytree(path, two)
    other = train_run(with_values(load_config(cfg), {"train.seed": 7}), str(two)).run_id
    (first,) = [r for r in store.list_runs(two) if r != other]
    meta = two / "runs" / first / "zarr.json"
    meta.chmod(0o000)
    try:
        r = subprocess.run(_without_dac_override([*dyn, "status", str(two)]), capture_output=True, text=True)
    finally:
        meta.chmod(0o644)
    assert r.returncode == 1, r.stderr
    rows = {line.split()[0]: line.split()[1] for line in r.stdout.strip().splitlines()[1:]}
    assert rows == {first: "damaged", other: "completed"}, r.stdout
    assert f"runs/{first}/zarr.json cannot be read: Permission denied; check its permissions" in r.stderr


def test_an_analysis_or_derived_folder_on_another_filesystem_is_refused_before_any_work(tiny, tmpfs, tmp_path):
    # results are staged in .staging, then renamed into analysis/ or derived/: across filesystems
    # (a link to another disk) every run's analysis was computed, then lost with a traceback (EXDEV)
    _, _, path = tiny
    copy = tmp_path / "s.zarr"
    shutil.copytree(path, copy)
    assert cli_in_process("analyse", copy).returncode == 0
    disk = tmpfs("16m")
    for name, argv in (("analysis", ["analyse", copy, "--again"]), ("derived", ["gates", copy, "--steps", "2"]),
                       ("derived", ["predict", copy])):
        (copy / name).mkdir(exist_ok=True)
        shutil.move(copy / name, disk / name)
        os.symlink(disk / name, copy / name)
        before = sorted((str(p), p.stat().st_mtime_ns) for p in disk.rglob("*"))
        done = cli_in_process(*argv)
        assert done.returncode == 2 and done.stdout == "", (argv, done.stderr)
        assert done.stderr == (f"dynamics: error: {argv[0]} {copy}: its {name}/ folder is on another filesystem than its "
                               f".staging (a link, or a mount); results are written in .staging, then moved into "
                               f"{name}/, which cannot cross filesystems: link or mount the whole store instead\n")
        assert sorted((str(p), p.stat().st_mtime_ns) for p in disk.rglob("*")) == before
        assert not (copy / ".staging").exists() and sorted(os.listdir(copy)) == sorted(os.listdir(path))
        os.unlink(copy / name)
        shutil.move(disk / name, copy / name)
    # a bind mount of a folder of the same filesystem: one device number, and still no rename across it
    (tmp_path / "bound").mkdir()
    shutil.copytree(copy / "analysis", tmp_path / "bound", dirs_exist_ok=True)
    if subprocess.run(["mount", "--bind", str(tmp_path / "bound"), str(copy / "analysis")],
                      capture_output=True).returncode == 0:
        try:
            assert os.stat(copy / "analysis").st_dev == os.stat(copy).st_dev
            done = cli_in_process("analyse", copy, "--again")
            assert done.returncode == 2 and "its analysis/ folder is on another filesystem" in done.stderr
        finally:
            subprocess.run(["umount", str(copy / "analysis")], check=True)
    # a link within the store's own filesystem is no problem
    shutil.move(copy / "analysis", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", copy / "analysis")
    assert cli_in_process("analyse", copy, "--again").returncode == 0
    assert not any(n.startswith(".dynamics-probe-") for n in os.listdir(tmp_path / "elsewhere"))
