"""`dynamics analyse` over a store: every finished run, in worker processes, same results as one process."""

import contextlib
import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from dynamics import cli, store
from dynamics.analyse import analyse_store
from dynamics.analysis.pipeline import ANALYSIS_VERSION
from dynamics.analysis.roles import RoleThresholds
from dynamics.config import from_dict, load_config, with_values
from dynamics.tables import print_consistency
from dynamics.train import train_run


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """Three finished tiny runs and one that stopped half-way, in one store."""
    from tests.conftest import TINY, interrupt_at

    d = tmp_path_factory.mktemp("analyse")
    cfg_path = d / "tiny.toml"
    cfg_path.write_text(TINY.format(steps=30, every=10))
    base = load_config(cfg_path)
    path = str(d / "s.zarr")
    for seed in (0, 1, 2):
        train_run(with_values(base, {"train.seed": seed}), path)

    unfinished = with_values(base, {"train.seed": 3})
    with pytest.raises(KeyboardInterrupt):
        train_run(unfinished, path, progress=interrupt_at(12))
    return path, unfinished.run_id()


def _unanalysed_copy(src, dst) -> None:
    """A copy of the fixture's store without its analyses: the first test analyses the fixture's
    store in place, and `analyse` keeps an analysis written from the recording a run holds (the
    tests after it, of interrupts, worker deaths and SIGTERM, then timed no analysis)."""
    from pathlib import Path

    shutil.copytree(src, dst, ignore=lambda folder, names: ["analysis"] if Path(folder) == Path(src) else [])


def test_worker_processes_give_the_single_process_results(three_runs, tmp_path):
    path, unfinished = three_runs
    serial = str(tmp_path / "serial.zarr")
    _unanalysed_copy(path, serial)
    rows_serial = analyse_store(serial, workers=1)
    rows = analyse_store(path, workers=2)  # spawned worker processes, as `dynamics analyse` does
    assert rows == rows_serial
    assert [r["run"] for r in rows] == store.list_runs(path)
    assert [r for r in rows if r.get("skipped")] == [{"run": unfinished, "status": "interrupted", "skipped": True,
                                                         "reason": "unfinished"}]
    for r in rows:
        if r.get("skipped"):
            assert store.open_analysis(path, r["run"]) is None
            continue
        a, b = store.open_analysis(path, r["run"]).load(), store.open_analysis(serial, r["run"]).load()
        xr.testing.assert_identical(a, b)
        # plain xarray reads the group written through the in-memory staging
        plain = xr.open_zarr(path, group=f"analysis/{r['run']}")
        assert plain.role.dims == ("snapshot", "layer", "head") and plain.step.size == a.step.size
        # the thresholds predict compares before it reads a stored role target survive the store
        assert a.attrs["role_thresholds"] == dataclasses.asdict(RoleThresholds())
        assert a.attrs["analysis_version"] == ANALYSIS_VERSION  # readers recompute any other


def test_a_run_past_the_in_memory_size_is_read_in_blocks_to_the_same_analysis(three_runs, tmp_path, monkeypatch):
    # The lazy path read a run one snapshot per dask task; it now reads blocks of snapshots,
    # each one zarr read (read_in_blocks). Blocks of 2 snapshots here, so edges fall inside.
    from dynamics import analyse
    from dynamics.analysis import pipeline

    path, _ = three_runs
    eager, lazy = str(tmp_path / "eager.zarr"), str(tmp_path / "lazy.zarr")
    _unanalysed_copy(path, eager)
    _unanalysed_copy(path, lazy)
    rows = analyse_store(eager)
    run = rows[0]["run"]
    attention = store.open_run(path, run, dask=False).attention
    seen = []
    blocks = pipeline.read_in_blocks

    def spy(ds):
        seen.append(blocks(ds))
        return seen[-1]

    monkeypatch.setattr(analyse, "IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(pipeline, "STAGE_BYTES", 2 * attention.nbytes // attention.sizes["snapshot"])
    monkeypatch.setattr(pipeline, "read_in_blocks", spy)
    assert analyse_store(lazy) == rows
    assert len(seen) == 3 and seen[0].attention.chunksizes["snapshot"] == (2, 2, 2, 2)  # 8 snapshots
    assert seen[0].probe_tokens.chunks is None  # no snapshot dim: read whole
    for r in rows:
        if not r.get("skipped"):
            xr.testing.assert_identical(store.open_analysis(lazy, r["run"]).load(),
                                        store.open_analysis(eager, r["run"]).load())


def test_rewriting_an_analysis_replaces_it_whole(three_runs):
    path, _ = three_runs
    run_id = store.list_runs(path)[0]
    store.write_analysis(path, run_id, xr.Dataset({"only": ("x", [1.0, 2.0])}))
    assert list(store.open_analysis(path, run_id, stale="allow").data_vars) == ["only"]
    [row] = analyse_store(path, [run_id])
    assert "role" in store.open_analysis(path, run_id) and "only" not in store.open_analysis(path, run_id)
    assert row["run"] == run_id


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie (exited, not yet reaped) does not. An orphan is
    reaped by whatever this container runs as pid 1, which need not do it promptly."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _children(pid: int) -> set[int]:
    import pathlib

    kids = set()
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended since the glob
            kids |= {int(k) for k in (task / "children").read_text().split()}
    return kids


def _interrupted_in_the_join(monkeypatch, path: str, interrupts: int, broken: bool = False) -> list[str]:
    """analyse_store(workers=2) with `interrupts` KeyboardInterrupts raised in the main thread's
    wait for the worker's feeder, as SIGTERM lands there once the main thread's runs are done;
    what happened, in order: the progress calls (with " error" for a run not analysed) and the
    raise. ``broken``: the worker dies of the same signal (SIGTERM to the process group), its
    pool broken, as the interrupt comes."""
    import concurrent.futures
    import concurrent.futures.process
    import threading
    import types

    import dynamics.analyse as mod

    interrupted, events, left = threading.Event(), [], [interrupts]

    class Pool(concurrent.futures.ProcessPoolExecutor):
        def submit(self, *args, **kwargs):
            # the feeder's run ends only after the interrupt (waited for here, not in progress(),
            # which runs under analyse_store's lock: the main thread could not take its runs)
            future = concurrent.futures.Future() if broken else super().submit(*args, **kwargs)
            assert interrupted.wait(120)
            if broken:
                future.set_exception(concurrent.futures.process.BrokenProcessPool("a child process terminated abruptly"))
            return future

    class Feeder(threading.Thread):
        def join(self, timeout=None):
            if left[0]:
                left[0] -= 1
                interrupted.set()
                raise KeyboardInterrupt("signal 15")
            return super().join(timeout)

    def progress(done, total, row):
        if threading.current_thread() is not threading.main_thread():
            time.sleep(1.0)  # the worker's line takes a while
        events.append(f"progress {row['run']}" + (" error" if row.get("error") else ""))

    futures = types.SimpleNamespace(ProcessPoolExecutor=Pool, process=concurrent.futures.process)
    monkeypatch.setattr(mod, "threading", types.SimpleNamespace(Thread=Feeder, Lock=threading.Lock))
    monkeypatch.setattr(mod, "concurrent", types.SimpleNamespace(futures=futures))
    with pytest.raises(KeyboardInterrupt):
        analyse_store(path, workers=2, progress=progress)
    events.append("raised")
    time.sleep(2.0)  # a feeder still going would print now
    return events


def test_an_interrupt_while_the_workers_finish_waits_for_their_lines(three_runs, tmp_path, monkeypatch, capsys):
    # Interrupted there, analyse_store raised at once and the feeder printed its worker's
    # "[analyse] n/4" line after the caller's "dynamics: interrupted". The first interrupt now
    # waits for the runs in hand, as one during the main thread's own runs did, and says so (a
    # silent wait of seconds had users pressing Ctrl-C again and again).
    path = str(tmp_path / "s.zarr")
    _unanalysed_copy(three_runs[0], path)
    events = _interrupted_in_the_join(monkeypatch, path, 1)
    assert events[-1] == "raised" and len(events) == 5, events  # all four runs: one was in hand
    assert sorted(events[:-1]) == sorted(f"progress {r}" for r in store.list_runs(path)), events
    assert capsys.readouterr().err == ("dynamics: stopping once the 1 run(s) in hand in other processes are analysed "
                                       "(Ctrl-C again to abandon them)\n")


def test_a_second_interrupt_leaves_at_once_and_nothing_prints_after_it(three_runs, tmp_path, monkeypatch):
    path = str(tmp_path / "s.zarr")
    _unanalysed_copy(three_runs[0], path)
    events = _interrupted_in_the_join(monkeypatch, path, 2)
    # the main thread's three runs, and the worker's only if its line was already being printed
    assert events[-1] == "raised" and len(events) in (4, 5), events


def test_an_interrupt_while_the_analysers_import_lands_after_their_imports(monkeypatch):
    # Module initialisation is not safe to interrupt: a SIGTERM inside scipy's pybind11 extension
    # came out as "ImportError: initialization failed", taken for the run's own failure, and the
    # analyse went on and ended in a traceback (the SIGTERM test above, now and then, in CI).
    from dynamics import analyse
    from dynamics.signals import sigterm_as_interrupt

    finished = []

    def signalled_while_importing():
        signal.raise_signal(signal.SIGTERM)
        finished.append(True)  # not reached if the interrupt lands here
        return {}

    monkeypatch.setattr(xr.backends, "list_engines", signalled_while_importing)
    with sigterm_as_interrupt(), pytest.raises(KeyboardInterrupt):
        analyse.import_analysers()
    assert finished == [True]


def test_an_interrupt_wrapped_in_another_error_still_stops_the_analysis(monkeypatch, three_runs):
    from dynamics import analyse

    def wrapped(path, run_id, again=False):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise ImportError("initialization failed") from e  # as pybind11 reports it

    monkeypatch.setattr(analyse, "analyse_one", wrapped)
    with pytest.raises(KeyboardInterrupt):
        analyse.analyse_or_report(str(three_runs[0]), store.list_runs(str(three_runs[0]))[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for child processes")
def test_sigterm_stops_a_multi_process_analyse_with_its_workers(three_runs, tmp_path):
    # The launcher analyses runs in its own main thread while the worker starts: on a loaded
    # machine it once analysed all four before the worker was seen, and the signal was never
    # sent (Popen.send_signal sends nothing to a process that has exited; exit 0). An attempt
    # whose signal was not sent, or came after the work, tests nothing: made again on a fresh copy.
    for attempt in range(3):
        path = str(tmp_path / f"t{attempt}.zarr")
        _unanalysed_copy(three_runs[0], path)
        proc = subprocess.Popen([sys.executable, "-m", "dynamics", "analyse", path, "--workers", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while len(kids := _children(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the spawned worker and multiprocessing's resource tracker
        assert len(kids) >= 2 or proc.returncode is not None, "the worker process never started"
        proc.send_signal(signal.SIGTERM)  # while the worker still imports: nothing can have finished
        not_sent = proc.returncode is not None  # send_signal found it exited and sent nothing
        out, err = proc.communicate(timeout=120)
        # or it arrived once every run was analysed, where the default action (exit -15) is right
        too_late = proc.returncode == -signal.SIGTERM and "[analyse] 4/4" in err
        if not (not_sent or too_late):
            break
    else:
        pytest.skip("the analysis finished before SIGTERM could reach it, 3 times (machine too loaded)")
    # 130 from main(); under `python -m` CPython 3.11 instead exits by SIGINT (-2) when the
    # KeyboardInterrupt first escaped an exec'd string (a dataclass being defined mid-import)
    # before it was caught. A shell sees 130 either way.
    assert proc.returncode in (130, -signal.SIGINT), (out, err)
    assert "Traceback" not in err and "interrupted" in err.splitlines()[-1]
    assert "resumable" not in err and "previous analysis" in err  # no run is resumed by analysing it again
    deadline = time.monotonic() + 30
    while any(map(_alive, kids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [k for k in kids if _alive(k)], "worker processes outlived the analyse"


def _analysing_a_copy(three_runs, path) -> subprocess.Popen:
    """`dynamics analyse --workers 2` started, output dropped, on a copy of the fixture's store without analyses."""
    _unanalysed_copy(three_runs[0], str(path))
    return subprocess.Popen([sys.executable, "-m", "dynamics", "analyse", str(path), "--workers", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for child processes")
def test_the_workers_of_an_analyse_killed_outright_exit_with_it(three_runs, tmp_path):
    # After SIGKILL (no handler runs) the worker and the resource tracker waited on their pipes
    # for ever, ~160 MB each: a worker holds both ends of its own task pipe.
    proc = _analysing_a_copy(three_runs, tmp_path / "k.zarr")
    deadline = time.monotonic() + 60
    while len(kids := _children(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is not None:
        pytest.skip("the analysis finished before its workers could be seen (machine too loaded)")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30  # the workers look for their parent twice a second
    while any(map(_alive, kids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [k for k in kids if _alive(k)], "worker processes outlived the killed analyse"


def test_a_worker_process_that_dies_loses_its_run_not_the_others(three_runs, tmp_path):
    # SIGKILL of a worker (the OOM killer, say) broke the process pool: BrokenProcessPool ended the
    # whole analyse in a traceback, no table, the runs still queued never analysed
    import multiprocessing
    import os
    import threading

    path = str(tmp_path / "k.zarr")
    _unanalysed_copy(three_runs[0], path)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(analyse_store(path, workers=2)))
    worker.start()
    deadline = time.monotonic() + 60
    while not (kids := multiprocessing.active_children()) and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kids, "no worker process was seen"
    for kid in kids:
        os.kill(kid.pid, signal.SIGKILL)
    worker.join(120)
    [rows] = result
    assert [r["run"] for r in rows] == store.list_runs(path)
    lost = [r for r in rows if "analysis process died" in r.get("error", "")]
    assert len(lost) == 1 and lost[0]["skipped"] and lost[0]["status"] == "completed"
    finished = [r for r in rows if r["status"] == "completed" and r not in lost]
    assert len(finished) == 2 and all(not r.get("skipped") for r in finished)  # the main process took them
    assert all(store.open_analysis(path, r["run"]) is not None for r in finished)


def test_a_worker_killed_by_the_groups_interrupt_is_not_named_as_a_lost_run(three_runs, tmp_path, monkeypatch):
    # SIGTERM to the process group (Ctrl-C's kin: `kill -TERM -PGID`, a batch system's stop) kills
    # the workers at once while this process's handler waits for its main thread: the worker's run
    # was printed "not analysed (analysis failed: its analysis process died (killed by a signal,
    # or out of memory ...)" above the "interrupted" line, blaming the data or memory.
    path = str(tmp_path / "g.zarr")
    _unanalysed_copy(three_runs[0], path)
    events = _interrupted_in_the_join(monkeypatch, path, 1, broken=True)
    assert events[-1] == "raised" and len(events) == 4, events  # the main thread's three runs; no lost one
    assert not [e for e in events if e.endswith(" error")], events


def test_a_second_interrupt_stops_the_workers_runs_in_hand(three_runs, tmp_path, monkeypatch):
    # The workers ignore Ctrl-C and finish their runs, so the second Ctrl-C's raise waited for
    # them as it left the pool; a third cut that wait short and the command hung for good
    # (Python 3.11 and 3.12: the pool's manager thread read as stopped, its workers never told
    # to exit). The second now terminates them: their run in hand (here a 30 s one) ends at once.
    import concurrent.futures
    import threading
    import types

    import dynamics.analyse as mod

    path = str(tmp_path / "t.zarr")
    _unanalysed_copy(three_runs[0], path)
    busy, procs, left = threading.Event(), [], [2]

    class Pool(concurrent.futures.ProcessPoolExecutor):
        def submit(self, *args, **kwargs):
            future = super().submit(time.sleep, 30)  # a long run in hand
            procs.extend(self._processes.values())
            busy.set()
            return future

    class Feeder(threading.Thread):
        def join(self, timeout=None):
            if left[0] and busy.wait(60):
                left[0] -= 1
                raise KeyboardInterrupt("signal 2")
            return super().join(timeout)

    futures = types.SimpleNamespace(ProcessPoolExecutor=Pool, process=concurrent.futures.process)
    monkeypatch.setattr(mod, "threading", types.SimpleNamespace(Thread=Feeder, Lock=threading.Lock))
    monkeypatch.setattr(mod, "concurrent", types.SimpleNamespace(futures=futures))
    with pytest.raises(KeyboardInterrupt):
        analyse_store(path, workers=2)
    assert procs and all(p.exitcode == -signal.SIGTERM for p in procs), [p.exitcode for p in procs]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for signal masks")
def test_the_workers_leave_ctrl_c_to_the_process_that_started_them(three_runs, tmp_path):
    # Ctrl-C reaches every process of the group: each worker printed a KeyboardInterrupt
    # traceback (while it imported) or zarr's "Task was destroyed" lines over the one
    # "interrupted" line. They are spawned with SIGINT blocked, and finish the runs in hand.
    proc = _analysing_a_copy(three_runs, tmp_path / "w.zarr")
    masks: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 60
        while not masks and proc.poll() is None and time.monotonic() < deadline:
            for kid in _children(proc.pid):
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    cmd = Path(f"/proc/{kid}/cmdline").read_bytes()  # open().read() left them to the collector
                    status = Path(f"/proc/{kid}/status").read_text()
                    if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
                        masks[kid] = int(status.split("SigBlk:")[1].split()[0], 16)
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()
    if not masks:
        pytest.skip("the analysis finished before its worker could be seen (machine too loaded)")
    assert all(mask & (1 << (signal.SIGINT - 1)) for mask in masks.values()), masks
    assert not any(mask & (1 << (signal.SIGTERM - 1)) for mask in masks.values()), masks  # SIGTERM still ends them


def test_bad_workers_is_one_line_exit_2(three_runs, capsys):
    path, _ = three_runs
    assert cli.main(["analyse", path, "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "dynamics: error: --workers: must be >= 1, got 0"


def test_a_killed_run_is_listed_as_stopped_as_status_lists_it(three_runs, tmp_path):
    # analyse's table said "running" for a run that `dynamics status` called "stopped" (killed:
    # marked running, its lock held by no process)
    from dynamics.analyse import analyse_one

    path, unfinished = three_runs
    copy = str(tmp_path / "s.zarr")
    _unanalysed_copy(path, copy)
    store.update_run_attrs(copy, unfinished, status="running")  # as SIGKILL leaves it
    row = analyse_one(copy, unfinished)
    assert row["skipped"] and row["status"] == "stopped" == store.run_status(copy, unfinished, store.run_attrs(copy, unfinished))


def test_a_run_whose_loss_rose_to_a_huge_finite_value_is_said_so(three_runs, tmp_path, capsys):
    # lr 10 on learning_rate.toml: 242 nats at the end against 4.2 at step 0, finite, so "completed",
    # and its heads got roles and slash counts like any run's, with no word on it
    import zarr

    from dynamics.analyse import analyse_one
    from dynamics.tables import print_analysis

    path, _ = three_runs
    copy = str(tmp_path / "s.zarr")
    _unanalysed_copy(path, copy)
    blown, fine = [r for r in store.list_runs(copy) if store.run_attrs(copy, r)["status"] == "completed"][:2]
    # on the fixed eval batches, not two training batches: one batch at each end rose on healthy
    # runs of a low learning rate by their noise alone
    store.update_run_attrs(copy, fine, last_loss=242.0)  # a noisy last batch: no note
    evals = zarr.open_array(f"{copy}/runs/{blown}/eval_loss", mode="r+")
    evals[-1] = 242.0
    first = float(np.float64(evals[0]).mean())
    flat = zarr.open_array(f"{copy}/runs/{fine}/eval_loss", mode="r+")
    flat[-1] = flat[0]  # no lower than at step 0, but not above it: not "rose"
    rows = [analyse_one(copy, blown), analyse_one(copy, fine)]
    assert rows[0]["loss_rose"] == (first, 242.0) and "loss_rose" not in rows[1]
    print_analysis(rows)
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"loss rose in 1 completed run(s): the eval loss at the last snapshot is above that at step 0, so training made "
        f"them worse and their heads' figures are not those of a model that learned its task: {blown} ({first:.4g} "
        f"-> 242 nats)")


def test_a_file_size_limit_stops_the_analysis_as_a_full_disk_does():
    # EFBIG (ulimit -f): every run was analysed, then each named as failing on its own
    import errno

    from dynamics import analyse

    for code in ("ENOSPC", "EDQUOT", "EFBIG", "EROFS"):
        e = OSError(getattr(errno, code), "refused")
        wrapped = RuntimeError("writing the analysis")
        wrapped.__cause__ = e
        assert analyse.disk_full(wrapped) is e
    assert analyse.disk_full(OSError(errno.ENOENT, "gone")) is None


def test_a_run_too_short_for_the_noise_band_is_said_not_analysed(tmp_path, capsys):
    from tests.conftest import TINY

    cfg_path = tmp_path / "tiny.toml"
    cfg_path.write_text(TINY.format(steps=2, every=10))
    path = str(tmp_path / "short.zarr")
    train_run(load_config(cfg_path), path)  # snapshots at steps 0, 1, 2
    assert store.open_run(path).sizes["snapshot"] == 3
    assert cli.main(["analyse", path]) == 0
    out = capsys.readouterr().out
    assert "not analysed (only 3 snapshot(s) recorded; analysis needs >= 4)" in out
    assert store.open_analysis(path) is None


def test_seed_consistency_groups_runs_by_their_config(three_runs, tmp_path):
    from dynamics.analyse import seed_consistency

    path = str(tmp_path / "c.zarr")
    _unanalysed_copy(three_runs[0], path)
    base = store.run_attrs(path, store.list_runs(path)[0])["config"]
    cfg = from_dict({k: v for k, v in base.items() if k != "sweep"})
    other = with_values(cfg, {"train.lr": 1e-3})  # another config, one seed: a group of its own
    train_run(other, path)
    analyse_store(path, workers=1)
    seeds = [r for r in store.list_runs(path)
             if store.open_analysis(path, r) is not None and r != other.run_id()]
    assert len(seeds) == 3
    # Known answer: every seed's final profiles are the first seed's with its heads permuted
    first = store.open_analysis(path, seeds[0]).load()
    for r in seeds[1:]:
        score = first.role_score
        store.write_analysis(path, r, first.assign(role_score=(score.dims, score.isel(head=[1, 0]).values)))
    [(label, similarity, unmatched, n, lone)] = seed_consistency(path)
    assert n == 3 and not lone and label == f"train.lr={base['train']['lr']}"  # what sets the group apart
    assert similarity == pytest.approx(1.0, abs=1e-12)  # the lr=1e-3 run is not lumped in
    # the reference: the first seed's 2 heads of each layer set against each other, all pairs
    final = first.role_score.isel(snapshot=-1).fillna(0.0)
    unit = final / ((final**2).sum("role_name") ** 0.5)
    cross = (unit.rename(head="h") * unit.rename(head="h_b")).sum("role_name").mean(["h", "h_b"])
    assert unmatched == pytest.approx(float(cross.mean("layer")), abs=1e-12)
    assert unmatched < similarity
    derived = store.open_derived(path, "consistency")
    assert derived is not None and derived.similarity.sizes["group"] == 2


@pytest.fixture(scope="module")
def two_slow_seeds(three_runs, tmp_path_factory):
    """A copy of the store with two seeds of its config at train.lr 1e-3 added, every run analysed:
    (path, its completed runs before, their stored config, the added configs). Trained and analysed
    once for the tests below, which copy it: seed_consistency reads the sweep index they write
    when it is called, so they need not analyse again."""
    path = str(tmp_path_factory.mktemp("slow") / "s.zarr")
    _unanalysed_copy(three_runs[0], path)
    done = [r for r in store.list_runs(path) if store.run_attrs(path, r)["status"] == "completed"]
    base = store.run_attrs(path, done[0])["config"]
    cfg = from_dict({k: v for k, v in base.items() if k != "sweep"})
    slow = [with_values(cfg, {"train.lr": 1e-3, "train.seed": s}) for s in (0, 1)]
    for c in slow:
        train_run(c, path)
    analyse_store(path, workers=1)
    return path, done, base, slow


def _with_two_slow_seeds(two_slow_seeds, path):
    """A copy of the `two_slow_seeds` store at `path`, and what the fixture returns of it."""
    shutil.copytree(two_slow_seeds[0], path)
    return str(path), *two_slow_seeds[1:]


def test_seed_consistency_names_groups_that_share_their_swept_values(two_slow_seeds, tmp_path):
    # A second sweep of the same axis from another base config (--set train.lr=...) into the store:
    # both groups have the same swept values, and their lines must still say which is which.
    from dynamics.analyse import seed_consistency

    path, done, base, slow = _with_two_slow_seeds(two_slow_seeds, tmp_path / "m.zarr")
    scale = base["model"]["init_scale"]
    points = {r: {"model.init_scale": scale, "train.seed": store.run_attrs(path, r)["config"]["train"]["seed"]}
              for r in [*done, *(c.run_id() for c in slow)]}
    store.write_sweep_index(path, {"axes": ["model.init_scale", "train.seed"], "runs": points})
    rows = {label: n for label, _, _, n, _ in seed_consistency(path)}
    swept = json.dumps({"model.init_scale": scale})
    assert rows == {f"{swept}, train.lr={base['train']['lr']}": 3, f"{swept}, train.lr=0.001": 2}


def test_seed_consistency_lines_come_in_the_grids_order(two_slow_seeds, tmp_path):
    # They came in the order of their groups' config hashes, under a table in the grid's order.
    from dynamics.analyse import seed_consistency

    path, done, base, slow = _with_two_slow_seeds(two_slow_seeds, tmp_path / "o.zarr")
    lr = base["train"]["lr"]
    runs = {r: {"train.lr": lr, "train.seed": store.run_attrs(path, r)["config"]["train"]["seed"]} for r in done}
    runs |= {c.run_id(): {"train.lr": 1e-3, "train.seed": c.train.seed} for c in slow}
    for first in (lr, 1e-3):  # the index lists this lr's runs first: its line comes first
        ordered = dict(sorted(runs.items(), key=lambda kv: kv[1]["train.lr"] != first))
        store.write_sweep_index(path, {"axes": ["train.lr", "train.seed"], "runs": ordered})
        labels = [label for label, *_ in seed_consistency(path)]
        assert labels == [json.dumps({"train.lr": v}) for v in (first, 1e-3 if first == lr else lr)]


def test_seed_consistency_of_a_group_with_fewer_heads_than_the_store(three_runs, tmp_path):
    # Runs of 2 and 4 heads share one stacked array, so the 2-head runs' heads 2-3 are padding:
    # they must be missing (matched to nothing), not all-zero heads that match each other at 0.
    from dynamics.analyse import seed_consistency

    path = str(tmp_path / "h.zarr")
    _unanalysed_copy(three_runs[0], path)
    base = store.run_attrs(path, store.list_runs(path)[0])["config"]
    wide = [with_values(from_dict({k: v for k, v in base.items() if k != "sweep"}),
                        {"model.n_heads": 4, "model.d_model": 32, "train.seed": s}) for s in (0, 1)]
    for cfg in wide:
        train_run(cfg, path)
    analyse_store(path, workers=1)
    narrow = [r for r in store.list_runs(path) if store.open_analysis(path, r) is not None
              and store.run_attrs(path, r)["config"]["model"]["n_heads"] == 2]
    assert len(narrow) == 3
    # Known answer: within each group, every seed's final profiles are its first seed's, heads permuted
    for runs, perm in ((narrow, [1, 0]), ([c.run_id() for c in wide], [2, 0, 3, 1])):
        first = store.open_analysis(path, runs[0]).load()
        for r in runs[1:]:
            score = first.role_score
            store.write_analysis(path, r, first.assign(role_score=(score.dims, score.isel(head=perm).values)))
    rows = seed_consistency(path)
    assert sorted(n for *_, n, _ in rows) == [2, 3]
    for _, similarity, _, _, _ in rows:
        assert similarity == pytest.approx(1.0, abs=1e-12)


def test_seed_consistency_compares_completed_runs_with_this_versions_analysis_only(three_runs, tmp_path, capsys):
    # `dynamics analyse` printed "over 3 seeds" for a group holding a run that diverged (its last finite
    # snapshot may sit a few steps from init: no final profile), and counted a run whose analysis had just
    # failed from the analysis an earlier version had left in the store; derived/consistency named
    # its groups by config hash only and its pairs by no run.
    from dynamics.analyse import seed_consistency
    from dynamics.analysis import ROLES

    path = str(tmp_path / "c.zarr")
    _unanalysed_copy(three_runs[0], path)
    seeds = [r for r in store.list_runs(path) if store.run_attrs(path, r)["status"] == "completed"]
    store.update_run_attrs(path, seeds[2], status="diverged", diverged_step=20)
    # Known answer: seed 1 is seed 0 with its heads swapped (1.0); the diverged seed 2 is unlike both
    profile = np.random.default_rng(0).random((len(ROLES) - 1, 1, 2, 2))  # (role_name, snapshot, layer, head)
    for rid, p in zip(seeds, (profile, profile[..., ::-1], profile[::-1] ** 4), strict=True):
        store.write_analysis(path, rid, xr.Dataset({"role_score": (("role_name", "snapshot", "layer", "head"), p)},
                                                   coords={"role_name": list(ROLES[:-1]), "layer": [0, 1], "head": [0, 1]},
                                                   attrs={"analysis_version": ANALYSIS_VERSION}))
    rows = [{"run": r, "status": store.run_attrs(path, r)["status"]} for r in seeds]  # as analyse_store gives them
    print_consistency(path, rows)
    out = capsys.readouterr().out
    assert ": 1.000 over 2 seeds" in out and "over 3 seeds" not in out
    assert out.endswith(f"cross-seed consistency leaves out 1 finished run(s) without a final profile (it compares "
                        f"completed, analysed runs): {seeds[2]} (diverged)\n")
    derived = store.open_derived(path, "consistency").load()
    assert f"cross-seed consistency {derived.label.item()}: " in out
    assert [derived.run_a.item(), derived.run_b.item()] == seeds[:2]
    # an older analysers' result (left by an analysis that failed this time) is not mixed in
    old = store.open_analysis(path, seeds[1]).load()
    store.write_analysis(path, seeds[1], old.assign_attrs(analysis_version=ANALYSIS_VERSION - 1))
    assert seed_consistency(path) == []
    # and the group written above is gone from derived/consistency, not left to read as current
    assert store.open_derived(path, "consistency").sizes["group"] == 0
    # A diverged run with no seed to be compared with (another config) is left out of nothing:
    # the line listed every diverged run of a store of different configs.
    config = store.run_attrs(path, seeds[2])["config"]
    store.update_run_attrs(path, seeds[2], config={**config, "train": {**config["train"], "lr": 0.5}})
    capsys.readouterr()
    print_consistency(path, rows)
    assert "leaves out" not in capsys.readouterr().out


def test_seed_consistency_of_one_head_per_layer_says_matching_has_nothing_to_undo(three_runs, tmp_path, capsys):
    # Heads are matched within a layer, so one head per layer leaves the identity the only
    # permutation: the matched and unmatched figures are one number, which the line set side by
    # side as if one were the other's reference. Said on the group's own line: a note under all
    # of them fired where no group of such runs had two seeds.
    from dynamics.analyse import seed_consistency
    from dynamics.analysis import ROLES

    path = str(tmp_path / "c.zarr")
    _unanalysed_copy(three_runs[0], path)
    seeds = [r for r in store.list_runs(path) if store.run_attrs(path, r)["status"] == "completed"][:2]
    rng = np.random.default_rng(1)

    def write(rid, heads_by_layer):  # the heads past a layer's count padded with NaN, as a sweep pads them
        scores = rng.random((len(ROLES) - 1, 1, 2, 2))  # (role_name, snapshot, layer, head)
        for layer, heads in enumerate(heads_by_layer):
            scores[:, :, layer, heads:] = np.nan
        store.write_analysis(path, rid, xr.Dataset(
            {"role_score": (("role_name", "snapshot", "layer", "head"), scores)},
            coords={"role_name": list(ROLES[:-1]), "layer": [0, 1], "head": [0, 1]},
            attrs={"analysis_version": ANALYSIS_VERSION}))

    for rid in seeds:
        write(rid, (1, 1))  # a padded head is no head: the count is of heads with a score
    rows = [{"run": r, "status": "completed"} for r in seeds]
    (label, matched, unmatched, n, lone), = seed_consistency(path, seeds)
    assert lone and n == 2 and matched == pytest.approx(unmatched, abs=1e-12)
    print_consistency(path, rows)
    [line] = capsys.readouterr().out.splitlines()
    assert line == (f"cross-seed consistency {label}: {matched:.3f} over 2 seeds (one head per layer, so no permutation "
                    f"to undo: how alike the seeds' heads are, with no unmatched reference to read it against)")
    # a second head in one layer (the second) of one run: there is a permutation to find, and
    # the reference is read
    write(seeds[1], (1, 2))
    assert not seed_consistency(path, seeds)[0][-1]
    print_consistency(path, rows)
    assert "unmatched heads give" in capsys.readouterr().out


def test_a_diverged_run_is_analysed_on_the_snapshots_it_recorded(tmp_path):
    # SGD at lr 100 blows up a few steps in; every step is a snapshot, so the schedule's later
    # snapshots are never written and read as NaN. The "final" figures must come from the last
    # finite snapshot, not from that fill value.
    from tests.conftest import TINY

    cfg_path = tmp_path / "tiny.toml"
    cfg_path.write_text(TINY.format(steps=60, every=1))
    cfg = with_values(load_config(cfg_path), {"train.lr": 100.0, "train.grad_clip": 0.0, "train.optimizer": "sgd",
                                              "train.warmup_steps": 50, "record.dense_until": 0})
    path = str(tmp_path / "d.zarr")
    assert train_run(cfg, path).status == "diverged"
    diverged = store.run_attrs(path, cfg.run_id())["diverged_step"]
    assert store.open_run(path).attention.isel(snapshot=-1).isnull().all()  # the unwritten tail

    [row] = analyse_store(path)
    assert not row.get("skipped")
    result = store.open_analysis(path, cfg.run_id())
    assert result.step.values.max() < diverged
    assert (row["read_at_step"], row["diverged_step"]) == (int(result.step.values.max()), diverged)  # the table's note
    assert result.sizes["snapshot"] >= 4
    assert row["final_divergence"] == pytest.approx(float(result.mean_divergence[-1]))
    assert result.mean_divergence.notnull().all() and result.redundancy_fraction.notnull().all()
    assert "none" not in row["roles"] or row["roles"]["none"] < 4  # not every head an empty snapshot


def test_a_lost_or_damaged_chunk_is_named_not_analysed_as_nan(three_runs, tmp_path):
    # A deleted attention chunk read as NaN: the run was analysed "bifurcation never, roles none:4",
    # exit 0. A chunk cut short failed as "RuntimeError: Zstd decompression error", naming no array.
    from dynamics.analyse import analyse_or_report

    path, _ = three_runs
    s = tmp_path / "s.zarr"
    _unanalysed_copy(path, s)
    rid = store.list_runs(s)[0]
    step = store.open_run(s, rid).step.values
    attention = s / "runs" / rid / "attention" / "c"
    (attention / "3" / "0" / "0" / "0" / "0" / "0").unlink()
    row = analyse_or_report(str(s), rid)
    assert row["skipped"] and row["error"].startswith(f"StoreError: {s}: run {rid}: array attention at snapshot 3 "
                                                      f"(step {step[3]}): its chunk runs/{rid}/attention/c/3/0/0/0/0/0 is "
                                                      f"missing, though the run wrote it: zarr would read it as nan")
    chunk = attention / "4" / "0" / "0" / "0" / "0" / "0"
    shutil.copy(chunk, attention / "3" / "0" / "0" / "0" / "0" / "0")
    chunk.write_bytes(chunk.read_bytes()[:50])
    row = analyse_or_report(str(s), rid)
    assert row["error"].startswith(f"StoreError: {s}: run {rid}: array attention at snapshot 4 (step {step[4]}): its chunk "
                                   f"runs/{rid}/attention/c/4/0/0/0/0/0 cannot be decoded (damaged: ")
    assert not (s / "analysis" / rid).exists() or store.open_analysis(s, rid) is not None  # nothing half-written
    # one bit flipped in a whole chunk: zstd decoded it, without a checksum, to one wrong number
    shutil.copy(attention / "3" / "0" / "0" / "0" / "0" / "0", chunk)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    row = analyse_or_report(str(s), rid)
    assert row["error"] == (f"StoreError: {s}: run {rid}: array attention at snapshot 4 (step {step[4]}): its chunk "
                            f"runs/{rid}/attention/c/4/0/0/0/0/0 cannot be decoded (damaged: its CRC32C checksum does "
                            f"not match: its bytes changed, or were cut short, after they were written); restore runs/{rid} from a backup, "
                            f"or move runs/{rid} and checkpoints/{rid} out of the store to go on without that run")


def test_analyse_of_one_run_it_could_not_analyse_exits_1_naming_why(three_runs, tmp_path, capsys):
    # `dynamics analyse STORE --run X` for a run not finished printed "analysed no run" and exited
    # 0, which a script reads as done
    from dynamics import cli

    path, unfinished = three_runs
    copy = str(tmp_path / "s.zarr")
    _unanalysed_copy(path, copy)
    assert cli.main(["analyse", copy, "--run", unfinished]) == 1
    out, err = capsys.readouterr()
    assert "analysed no run" in out
    assert err.strip().splitlines()[-1] == f"dynamics: run {unfinished} was not analysed: unfinished (interrupted)"
    assert store.open_analysis(copy, unfinished) is None


def test_a_failed_run_is_not_analysed_and_its_error_and_what_finishes_it_are_said(three_runs, tmp_path):
    # analyse said only "unfinished" and the report "once it has finished", as if it would: a
    # failed run's error was shown by no command but the `dynamics run` that failed
    import html
    import re

    from dynamics.report import write_report

    path, unfinished = three_runs
    s = str(tmp_path / "s.zarr")
    _unanalysed_copy(path, s)
    store.update_run_attrs(s, unfinished, status="failed",
                           traceback="Traceback (most recent call last):\n  ...\nRuntimeError: boom\n")
    (row,) = [r for r in analyse_store(s, [unfinished]) if r.get("skipped")]
    assert row == {"run": unfinished, "status": "failed", "skipped": True,
                   "reason": "unfinished: it failed with RuntimeError: boom; the command that trained it resumes it"}
    page = write_report(s, tmp_path / "rep", run_id=unfinished, compute_missing=False)
    text = re.sub(r"<[^>]+>", "", html.unescape(page.read_text()))
    assert ("no stored analysis (unfinished: it failed with RuntimeError: boom; the command that trained it resumes "
            "it; dynamics analyse analyses it once it has finished") in text


def test_a_learned_gate_runs_winner_take_all_is_of_michels_importance(tmp_path):
    # analyse reads the gates with the importance: winner_take_all is the Gini of g |dL/dg|
    # (Michel et al.'s |dL/dxi|), not of |dL/dg|, which made a shut head its layer's largest
    from dynamics.analysis.bifurcation import head_importance, winner_take_all
    from tests.conftest import TINY

    cfg_path = tmp_path / "tiny.toml"
    cfg_path.write_text(TINY.format(steps=8, every=4))
    cfg = with_values(load_config(cfg_path), {"model.gates": "learned", "model.gate_init": -1.0})
    path = str(tmp_path / "gates.zarr")
    train_run(cfg, path)
    [row] = analyse_store(path)
    assert not row.get("skipped")
    run = store.open_run(path).load()
    assert float(run.gate.max()) < 0.5  # sigmoid(-1) = 0.27: far from fixed gates' 1
    got = store.open_analysis(path).winner_take_all.values
    np.testing.assert_allclose(got, winner_take_all(head_importance(run.importance, run.gate)).values, rtol=1e-6)
    assert not np.allclose(got, winner_take_all(run.importance).values, rtol=1e-3)
