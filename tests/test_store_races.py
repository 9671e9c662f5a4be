"""Readers of a store while a writer changes it: each concurrent write is injected at the exact
point between a reader's (or a writer's) steps where it once made the read wrong, so the race is
reproduced every time rather than by chance."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xarray as xr

from dynamics import store
from dynamics.store import readers
from tests.test_store import write_run

pytestmark = pytest.mark.filterwarnings("error")


def analysis(marker: float) -> xr.Dataset:
    return xr.Dataset({"score": ("head", np.full(4, marker))}, attrs={"marker": marker})


def skip_without_exchange(tmp_path) -> None:
    """Skip where this filesystem has no atomic exchange of two folders: the writers then swap a
    group in by two renames, with a gap no test can time."""
    probe = [tmp_path / "exchange_a", tmp_path / "exchange_b"]
    for p in probe:
        p.mkdir()
    if not readers._exchange(*probe):
        pytest.skip("no atomic exchange here: a group is swapped in by two renames, with a gap this test cannot time")


def exchange_at_first_read(tmp_path, monkeypatch, prefix: str | tuple[str, ...], group, replacement) -> list[str]:
    """Swap the folder `replacement` into `group`'s place, as analyse, predict and gates swap a new
    version in (one atomic exchange), at zarr's first read of a key starting with `prefix`; returns
    the list the key read then is put in (empty: never read)."""
    from zarr.storage import LocalStore

    skip_without_exchange(tmp_path)
    real_get, swapped = LocalStore.get, []

    async def get(self, key, *args, **kwargs):
        if not swapped and key.startswith(prefix):
            assert readers._exchange(replacement, group)
            swapped.append(key)
        return await real_get(self, key, *args, **kwargs)

    monkeypatch.setattr(LocalStore, "get", get)
    return swapped


def open_swapped_while_read(tmp_path, monkeypatch, old: xr.Dataset, new: xr.Dataset, on_get, **load) -> xr.Dataset:
    """``open_analysis(...).load()`` of run r1, whose analysis `old` is swapped for `new` (staged
    whole in advance) where ``await on_get(key, read, swap)``, which zarr's every read goes
    through, calls ``swap()``: analyse's swap, done at that very moment (zarr's own writes cannot
    run inside its event loop), by one atomic exchange as analyse makes it (two renames left a
    gap in which zarr's member reads, running on other threads, sometimes found no group)."""
    from zarr.storage import LocalStore

    path, other = tmp_path / "s.zarr", tmp_path / "new.zarr"
    for p, ds in ((path, old), (other, new)):
        write_run(p, "r1")
        store.write_analysis(p, "r1", ds)
    skip_without_exchange(tmp_path)
    real_get, swapped = LocalStore.get, []

    def swap() -> None:
        if not swapped:
            assert readers._exchange(other / "analysis" / "r1", path / "analysis" / "r1")
            swapped.append(True)

    async def get(self, key, *args, **kwargs):
        return await on_get(key, lambda: real_get(self, key, *args, **kwargs), swap)

    monkeypatch.setattr(LocalStore, "get", get)
    got = store.open_analysis(path, "r1", stale="allow", **load)
    got = got if load else got.load()
    assert swapped
    return got


def test_a_reader_during_an_analysis_rewrite_sees_the_old_group_or_the_new_one(tmp_path, monkeypatch):
    # The rewrite swapped the group in by two renames, the old one aside and then the new one in:
    # `dynamics report` or `predict` reading between them found no analysis, and the predictor
    # left that run out without a word.
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    store.write_analysis(path, "r1", analysis(1.0))
    seen = []

    def observing(step):
        def wrapped(*args, **kwargs):
            out = step(*args, **kwargs)
            got = store.open_analysis(path, "r1", stale="allow")  # what a reader in another process finds right now
            seen.append(None if got is None else got.attrs["marker"])
            return out

        return wrapped

    monkeypatch.setattr(os, "rename", observing(os.rename))
    if hasattr(readers, "_exchange"):
        monkeypatch.setattr(readers, "_exchange", observing(readers._exchange))
    store.write_analysis(path, "r1", analysis(2.0))
    assert seen and set(seen) <= {1.0, 2.0}, seen
    assert seen[-1] == 2.0
    np.testing.assert_array_equal(store.open_analysis(path, "r1", stale="allow").score.values, np.full(4, 2.0))


def test_where_there_is_no_atomic_exchange_the_group_is_still_replaced_whole(tmp_path, monkeypatch):
    # Other platforms and filesystems swap by two renames, as before.
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    store.write_analysis(path, "r1", analysis(1.0))
    monkeypatch.setattr(readers, "_exchange", lambda a, b: False)
    store.write_analysis(path, "r1", analysis(2.0))
    assert store.open_analysis(path, "r1", stale="allow").attrs["marker"] == 2.0
    assert sorted(p.name for p in path.iterdir()) == ["analysis", "derived", "runs", "zarr.json"]


def test_an_analysis_is_rewritten_where_there_is_no_c_library_to_ask(tmp_path, monkeypatch):
    # Windows: ctypes.CDLL(None) raises TypeError there (it tests `'/' in name`), not OSError,
    # so looking for renameat2 made every analysis write fail on a platform the store supports
    # with two renames. Both facts of that platform are set here, as Windows has them.
    import ctypes
    import sys

    def windows_cdll(name, *args, **kwargs):
        if name is None:
            raise TypeError("argument of type 'NoneType' is not iterable")
        raise OSError(f"no {name} here")

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    store.write_analysis(path, "r1", analysis(1.0))
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(ctypes, "CDLL", windows_cdll)
    readers._libc.cache_clear()
    try:
        store.write_analysis(path, "r1", analysis(2.0))
    finally:
        readers._libc.cache_clear()  # this machine's libc for the tests after this one
    assert store.open_analysis(path, "r1", stale="allow").attrs["marker"] == 2.0


def test_a_run_that_finishes_while_its_status_is_read_is_not_called_stopped(tmp_path, monkeypatch):
    # run_status read the attrs ("running"), then probed the run lock. A run that finished in
    # between (its final status written, then its lock released) read as "stopped", killed:
    # `dynamics status`, the report and analyse said so of a run that had just completed.
    from dynamics.store import checkpoints

    path = tmp_path / "s.zarr"
    write_run(path, "r1", attrs={"status": "running"})
    trainer = store.run_lock(path, "r1")
    trainer.__enter__()
    attrs = store.run_attrs(path, "r1")
    real_probe = checkpoints.run_lock_held

    def finish_then_probe(*args):
        if trainer is not None:
            store.update_run_attrs(path, "r1", status="completed")
            trainer.__exit__(None, None, None)
        return real_probe(*args)

    monkeypatch.setattr(checkpoints, "run_lock_held", finish_then_probe)
    assert store.run_status(path, "r1", attrs) == "completed"
    # A run killed (its lock free, its attrs still "running") is still named stopped.
    store.update_run_attrs(path, "r1", status="running")
    trainer = None
    assert store.run_status(path, "r1", store.run_attrs(path, "r1")) == "stopped"


def test_an_analysis_rewritten_while_it_is_opened_is_not_called_damaged(tmp_path, monkeypatch):
    # Before zarr opens a group, each member's zarr.json is checked: read once to see it is
    # there, and again to parse it. A rewrite without that member in between (a newer analyser
    # version drops a variable) made the second read find nothing: "cannot be read (damaged)".
    from dynamics.store import _loc

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    store.write_analysis(path, "r1", analysis(1.0).assign(extra=("head", np.zeros(4))))
    real_get, rewritten = _loc._Loc.get, []

    def get_then_rewrite(self, key):
        got = real_get(self, key)
        if key == "analysis/r1/extra/zarr.json" and not rewritten:
            rewritten.append(key)  # the rewrite's own reads go as usual
            store.write_analysis(path, "r1", analysis(2.0))
        return got

    monkeypatch.setattr(_loc._Loc, "get", get_then_rewrite)
    got = store.open_analysis(path, "r1", stale="allow")
    assert rewritten and got.attrs["marker"] == 2.0 and "extra" not in got


def test_a_store_deleted_while_its_root_is_checked_is_not_called_damaged(tmp_path, monkeypatch):
    # damaged_root read the root zarr.json twice, to see it there and then to parse it; a store
    # removed between the reads was named damaged ("restore it from a backup"), not absent.
    import shutil

    from dynamics.store import _loc

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    real_get = _loc._Loc.get

    def get_then_delete(self, key):
        got = real_get(self, key)
        if key == "zarr.json" and path.exists():
            shutil.rmtree(path)
        return got

    monkeypatch.setattr(_loc._Loc, "get", get_then_delete)
    assert store.damaged_root(path) is None


def test_an_analysis_swapped_while_zarr_reads_its_members_opens_as_one_version(tmp_path, monkeypatch):
    # zarr reads a group's zarr.json, then each member's. An analysis swapped in between (an
    # `analyse` finishing while the report opens it) opened as a mix: the old group's attributes
    # and members, the new group's chunks, and NaN for an old member the new group lacks.
    async def on_get(key, read, swap):
        got = await read()
        if key.endswith("analysis/r1/extra/zarr.json"):
            swap()
        return got

    got = open_swapped_while_read(tmp_path, monkeypatch, analysis(1.0).assign(extra=("head", np.zeros(4))),
                                  analysis(2.0), on_get)
    assert got.attrs["marker"] == 2.0 and set(got.data_vars) == {"score"}, got
    np.testing.assert_array_equal(got.score.values, np.full(4, 2.0))


def test_an_analysis_swapped_into_a_mix_that_cannot_open_is_opened_again(tmp_path, monkeypatch):
    # A swap between two members' metadata reads, where the versions differ in a dim's length,
    # made the open itself fail ("conflicting sizes for dimension"); only a mix that opened was
    # opened again, so the reader got a ValueError instead of either version.
    import asyncio

    def sized(n: int, marker: float) -> xr.Dataset:
        return xr.Dataset({"v": ("x", np.full(n, marker)), "w": ("x", np.full(n, marker))}, attrs={"marker": marker})

    members: list[str] = []
    first_read = asyncio.Event()

    async def on_get(key, read, swap):
        if not (key.startswith("analysis/r1/") and key.count("/") == 3 and key.endswith("/zarr.json")):
            return await read()
        members.append(key)
        if len(members) == 1:  # read whole from the old group
            got = await read()
            first_read.set()
            return got
        if len(members) == 2:  # zarr reads members at once: this one waits, and reads the new group
            await first_read.wait()
            swap()
        return await read()

    got = open_swapped_while_read(tmp_path, monkeypatch, sized(80, 1.0), sized(50, 2.0), on_get)
    assert got.attrs["marker"] == 2.0 and got.sizes["x"] == 50
    np.testing.assert_array_equal(got.v.values, np.full(50, 2.0))


def _finished_at_the_lock_probe(tmp_path, monkeypatch, write=write_run):
    """Run r1 "running" at checkpoint 40 of 200 under a trainer's lock, which finishes it (its last
    attributes, then the lock let go) just as a reader probes that lock."""
    from dynamics.store import checkpoints

    path = tmp_path / "s.zarr"
    write(path, "r1", attrs={"status": "running", "steps_total": 200, "steps_done": 0, "checkpoint_step": 40})
    trainer = store.run_lock(path, "r1")
    trainer.__enter__()
    real_probe = checkpoints.run_lock_held

    def finish_then_probe(*args):
        store.update_run_attrs(path, "r1", status="completed", steps_done=200, checkpoint_step=200, last_loss=0.5)
        trainer.__exit__(None, None, None)
        monkeypatch.setattr(checkpoints, "run_lock_held", real_probe)
        return real_probe(*args)

    monkeypatch.setattr(checkpoints, "run_lock_held", finish_then_probe)
    return path


def test_a_status_row_of_a_run_that_finishes_while_it_is_read_is_all_of_one_moment(tmp_path, monkeypatch):
    # The status now read again (above), the rest of the row came from the attributes read
    # before: "completed  40/200  40", a finished run shown with a checkpoint to resume from.
    from dynamics.status import status_table

    path = _finished_at_the_lock_probe(tmp_path, monkeypatch)
    _, [row], _ = status_table(str(path))
    assert row == ["r1", "completed", "200/200", "-", "0.5000"], row


def test_open_run_of_a_run_that_finishes_while_it_is_opened_has_the_attributes_it_ended_with(tmp_path, monkeypatch):
    # its status as it ended beside the rest as read: "completed" with no last loss, 0 steps done
    path = _finished_at_the_lock_probe(tmp_path, monkeypatch)
    got = store.open_run(path, "r1").attrs
    assert {k: got.get(k) for k in ("status", "steps_done", "checkpoint_step", "last_loss", "run_id")} == {
        "status": "completed", "steps_done": 200, "checkpoint_step": 200, "last_loss": 0.5, "run_id": "r1"}


def test_opening_a_group_that_is_not_there_says_so_not_that_it_was_rewritten(tmp_path):
    # a failed open is retried only when another directory is there after it: with none before
    # or after, five tries ended in "was rewritten 5 times while being opened"
    import zarr.errors

    from dynamics.store._loc import _Loc, _open_group_ds

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    # zarr's own error for a missing group (a FileNotFoundError) as it raised it, not rewrapped
    with pytest.raises(zarr.errors.GroupNotFoundError, match="No group found in store .* at path 'analysis/nope'") as raised:
        _open_group_ds(_Loc(str(path)), "analysis/nope")
    assert isinstance(raised.value, FileNotFoundError)
    assert "rewritten" not in str(raised.value)


def test_a_run_created_while_the_runs_are_listed_is_not_called_damaged(tmp_path, monkeypatch):
    # zarr makes runs/<id>/ before it renames zarr.json into it. A listing that read zarr.json as
    # absent, and then found it there on a second read, named a run being created as damaged
    # (seen in CI: a test polling a store while `dynamics run` started).
    from dynamics.store import _loc

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    (path / "runs" / "r2").mkdir()
    real_get, created = _loc._Loc.get, []

    def get_then_create(self, key):
        got = real_get(self, key)
        if key == "runs/r2/zarr.json" and not created:
            created.append(key)  # the writer's own lookups read as usual
            write_run(path, "r2", seed=1)
        return got

    monkeypatch.setattr(_loc._Loc, "get", get_then_create)
    assert store.list_runs(path) == ["r1", "r2"]
    assert created == ["runs/r2/zarr.json"]


def test_analyse_of_a_run_that_finishes_as_its_status_is_read_analyses_it(tmp_path, monkeypatch):
    # skipped as unfinished ("completed ... not analysed"), its status read again beside the rest as read
    from dynamics.analyse import analyse_one
    from tests.test_store_integrity import write_whole_run

    path = _finished_at_the_lock_probe(tmp_path, monkeypatch, write_whole_run)
    row = analyse_one(str(path), "r1")
    # analysed as the finished run it is: refused only for its 3 snapshots (too few for the noise band)
    assert (row["status"], row["reason"]) == ("completed", "only 3 snapshot(s) recorded; analysis needs >= 4"), row


def test_a_running_run_whose_lock_cannot_be_read_is_running_not_stopped(tmp_path, monkeypatch):
    # run_lock_held is None where the filesystem cannot tell (no flock): not evidence of a kill
    from dynamics.store import checkpoints
    from tests.test_store import write_run

    path = tmp_path / "s.zarr"
    write_run(path, "r1", attrs={"status": "running", "steps_done": 3})
    stale = store.run_attrs(path, "r1")
    monkeypatch.setattr(checkpoints, "run_lock_held", lambda *a: None)
    assert store.run_status(path, "r1", stale) == "running"
    monkeypatch.undo()
    store.update_run_attrs(path, "r1", status="completed", steps_done=10)  # it ended meanwhile
    status, attrs = store.run_now(path, "r1", stale)
    assert status == "completed" and attrs["steps_done"] == 10


def test_a_runs_folder_made_while_it_is_checked_is_not_called_damaged(tmp_path, monkeypatch):
    # check_sections looked twice (is_dir, then exists): a sweep's first run made `runs` in between,
    # and a test polling the store read it as damaged ("restore it from a backup"; seen in CI).
    from dynamics.store import _loc

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    runs, aside = path / "runs", tmp_path / "runs-aside"
    runs.rename(aside)
    real_stat, made = os.stat, []

    def stat_then_make(p, *args, **kwargs):
        if os.fspath(p) == os.fspath(runs) and not made:
            made.append(p)
            try:
                return real_stat(p, *args, **kwargs)  # absent at this look
            finally:
                aside.rename(runs)  # and there at the next
        return real_stat(p, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat_then_make)
    _loc.check_sections(_loc._Loc(path), ("runs",))
    assert made and runs.is_dir()


@pytest.mark.parametrize("what", ["folder link", "dangling link", "file link", "link to itself"])
def test_a_section_that_is_a_link_is_damaged_only_where_it_leads_to_no_folder(tmp_path, what):
    from dynamics.store import StoreError, _loc

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    runs, aside = path / "runs", tmp_path / "runs-aside"
    runs.rename(aside)
    target = {"folder link": aside, "dangling link": tmp_path / "gone", "file link": tmp_path / "f",
              "link to itself": runs}[what]
    (tmp_path / "f").write_text("x")
    runs.symlink_to(target)
    if what == "folder link":
        _loc.check_sections(_loc._Loc(path), ("runs",))
        assert store.list_runs(path) == ["r1"]
    else:
        with pytest.raises(StoreError, match="runs is not a folder"):
            _loc.check_sections(_loc._Loc(path), ("runs",))
        with pytest.raises(StoreError, match="runs is not a folder"):
            store.list_runs(path)


def test_the_sections_of_a_path_that_is_a_file_are_not_called_damaged(tmp_path):
    # a file on the way (ENOTDIR) is what "not a dynamics store" names, before any section is read
    (tmp_path / "f").write_text("x")
    store.check_folders(tmp_path / "f", ("analysis", "runs"))


@pytest.mark.parametrize("section", ["analysis", "derived"])
def test_a_group_rewritten_between_its_open_and_its_chunk_count_is_not_called_damaged(tmp_path, monkeypatch, section):
    # open_analysis and open_derived opened one version (checked whole) and then counted the chunk
    # files of whatever version was at the path: a rewrite without a variable in between (a newer
    # analyser's) read as "array extra has 1 of its 1 chunk(s) missing", and the report named the
    # run damaged. The count is now of the version opened, or the open is made again.
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    write, gpath = ((lambda ds: store.write_analysis(path, "r1", ds), "analysis/r1") if section == "analysis" else
                    (lambda ds: store.write_derived(path, "gates", ds), "derived/gates"))
    write(analysis(1.0).assign(extra=("head", np.zeros(4))))
    real_whole, rewritten = readers._whole, []

    def rewrite_then_count(loc, at, ds):
        if at == gpath and not rewritten:
            rewritten.append(at)
            write(analysis(2.0))
        return real_whole(loc, at, ds)

    monkeypatch.setattr(readers, "_whole", rewrite_then_count)
    got = (store.open_analysis(path, "r1", stale="allow") if section == "analysis" else
           store.open_derived(path, "gates"))
    assert rewritten and got.attrs["marker"] == 2.0 and "extra" not in got
    assert float(got.score[0]) == 2.0


def _read_as_zarr_renames(tmp_path, monkeypatch, ending: str, read, write) -> list:
    """What `read()` returns (or the warning it raises, this file's warnings being errors) at the
    moment zarr has written a zarr.json ending in `ending` as ``zarr.<uuid>.partial`` and is about
    to rename it into place, inside `write()`: another process reading the store just then."""
    import pathlib

    real_replace, out = pathlib.Path.replace, []

    def replace(self, target):
        if not out and self.name.endswith(".partial") and str(target).endswith(ending):
            assert self.exists()
            try:
                out.append(read())
            except Exception as e:  # noqa: BLE001 - the test names what was raised
                out.append(e)
        return real_replace(self, target)

    monkeypatch.setattr(pathlib.Path, "replace", replace)
    write()
    assert out, f"zarr wrote no {ending} by a rename"
    return out


@pytest.mark.parametrize("reader", ["open_run", "open_sweep", "unreadable_chunk"])
def test_a_run_read_while_its_attributes_are_rewritten_reads_without_a_warning(tmp_path, monkeypatch, reader):
    # A run's attributes are rewritten at every checkpoint: zarr lists the group's folder, found
    # its zarr.<uuid>.partial there, and warned "Object at zarr.<uuid>.partial is not recognized as
    # a component of a Zarr hierarchy" to `dynamics report` run during training.
    path = tmp_path / "s.zarr"
    write_run(path, "r1", attrs={"status": "running", "checkpoint_step": 0})
    read = {"open_run": lambda: sorted(store.open_run(path, "r1").data_vars),
            "open_sweep": lambda: sorted(store.open_sweep(path).data_vars),
            "unreadable_chunk": lambda: store.unreadable_chunk(path, "r1")}[reader]
    expected = read()
    got = _read_as_zarr_renames(tmp_path, monkeypatch, "runs/r1/zarr.json", read,
                                lambda: store.update_run_attrs(path, "r1", checkpoint_step=5))
    assert got == [expected]
    assert store.run_attrs(path, "r1")["checkpoint_step"] == 5


def test_a_run_opened_while_its_arrays_are_created_reads_those_made_without_a_warning(tmp_path, monkeypatch):
    # A new run's arrays are made outside the store's lock: each array's folder, then its
    # zarr.json renamed into it. zarr warned "Object at attention is not recognized" in between.
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    got = _read_as_zarr_renames(tmp_path, monkeypatch, "runs/r2/attention/zarr.json",
                                lambda: store.open_run(path, "r2"),
                                lambda: write_run(path, "r2", attrs={"status": "running"}, seed=1))
    assert isinstance(got[0], xr.Dataset), got
    assert "attention" not in got[0]
    assert "attention" in store.open_run(path, "r2")


@pytest.mark.parametrize("load", [True, ["score", "extra", "absent"]])
@pytest.mark.parametrize("dask", [True, False])
def test_an_analysis_swapped_while_its_values_are_loaded_is_read_as_one_version(tmp_path, monkeypatch, load, dask):
    # The report opened a run's analysis, checked its attributes, and loaded its values after: a
    # swap in between gave the old attributes with the new values, and NaN for a variable the new
    # version lacks. With `load`, the values are read inside the open's version check.
    async def on_get(key, read, swap):
        if key.startswith("analysis/r1/") and "/c" in key:  # the first chunk read: the swap lands now
            swap()
        return await read()

    got = open_swapped_while_read(tmp_path, monkeypatch, current(analysis(1.0).assign(extra=("head", np.zeros(4)))),
                                  current(analysis(2.0)), on_get, load=load, dask=dask)
    assert got.attrs["marker"] == 2.0 and set(got.data_vars) == {"score"}, got
    np.testing.assert_array_equal(got.score.values, np.full(4, 2.0))
    assert got.score.variable._in_memory


def current(ds: xr.Dataset) -> xr.Dataset:
    from dynamics.schema import ANALYSIS_VERSION

    return ds.assign_attrs(analysis_version=ANALYSIS_VERSION)


def test_an_analysis_loaded_by_name_holds_only_the_names_it_has(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    store.write_analysis(path, "r1", current(analysis(1.0).assign(extra=("head", np.arange(4.0)))))
    got = store.open_analysis(path, "r1", load=("extra", "absent"), dask=False)
    assert set(got.data_vars) == {"extra"} and got.attrs["marker"] == 1.0 and got.extra.variable._in_memory
    np.testing.assert_array_equal(got.extra.values, np.arange(4.0))
    assert set(store.open_analysis(path, "r1", load=True).data_vars) == {"score", "extra"}


@pytest.mark.parametrize("version", [None, 1])
def test_an_analysis_of_other_analysers_is_left_unread_by_load(tmp_path, version):
    # The report opened and loaded one, then set it aside as stale: a chunk of it failing its
    # checksum made a run that only needed `dynamics analyse` read as damaged (exit 1).
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    store.write_analysis(path, "r1", analysis(1.0).assign_attrs(**({} if version is None else
                                                                   {"analysis_version": version})))
    chunk = next(p for p in sorted((path / "analysis" / "r1" / "score").rglob("*")) if p.is_file() and "c" in p.parts)
    chunk.write_bytes(b"not a chunk")
    got = store.open_analysis(path, "r1", stale="allow", load=True, dask=False)
    assert got.attrs.get("analysis_version") == version and not got.score.variable._in_memory
    with pytest.raises(Exception):  # noqa: B017 - the codec's own error: the chunk is read when asked for
        got.load()


def test_open_derived_load_true_keeps_the_whole_group(tmp_path):
    # load=True took a list of the data variables, which dropped a coordinate on a dim no
    # variable has (a review helper); the lazy open keeps it
    write_run(tmp_path / "s.zarr", "r1")
    ds = xr.Dataset({"score": ("horizon", [0.1, 0.2, 0.3])},
                    coords={"horizon": [0.0, 0.5, 1.0], "seed": ("seed", [0, 1, 2, 3])})
    store.write_derived(tmp_path / "s.zarr", "curves", ds)
    lazy = store.open_derived(tmp_path / "s.zarr", "curves")
    loaded = store.open_derived(tmp_path / "s.zarr", "curves", load=True)
    assert dict(loaded.sizes) == dict(lazy.sizes) == {"horizon": 3, "seed": 4}
    xr.testing.assert_identical(loaded, lazy.load())
    assert list(store.open_derived(tmp_path / "s.zarr", "curves", load=["score", "gone"]).data_vars) == ["score"]
