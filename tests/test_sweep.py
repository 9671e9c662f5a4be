"""Sweep grid expansion, run ids, input errors and the launcher (fast: no cluster but one tiny one)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr

from dynamics import store
from dynamics.config import ConfigError, from_dict, load_config, with_values
from dynamics.sweep import (
    expand_grid,
    lock_path,
    run_point,
    run_sweep,
)
from dynamics.train import train_run

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16},
    "task": {"name": "induction", "min_period": 2, "max_period": 6},
    "train": {"steps": 12, "batch_size": 4, "warmup_steps": 2, "eval_batches": 1},
    "record": {"dense_until": 4, "every": 6, "n_probe": 2, "eval_batch_size": 4},
}


def tiny(sweep: dict | None = None, **sections) -> dict:
    raw = json.loads(json.dumps(TINY))
    for name, table in sections.items():
        raw[name].update(table)
    if sweep is not None:
        raw["sweep"] = sweep
    return raw


def write_toml(path: Path, raw: dict) -> Path:
    lines = []
    for section, table in raw.items():
        lines.append(f"[{section}]")
        for key, value in table.items():
            lines.append(f'"{key}" = {json.dumps(value)}')
    path.write_text("\n".join(lines) + "\n")
    return path


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dynamics", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


# --------------------------------------------------------------------------- grid


def test_full_grid_crosses_axes_in_order():
    cfg = from_dict(tiny({"model.init_scale": [0.5, 1.0, 2.0], "train.seed": [0, 1]}))
    points = expand_grid(cfg)
    assert [tuple(p.values.values()) for p in points] == [
        (0.5, 0), (0.5, 1), (1.0, 0), (1.0, 1), (2.0, 0), (2.0, 1)]
    for p in points:
        assert list(p.values) == ["model.init_scale", "train.seed"]
        assert p.cfg.model.init_scale == p.values["model.init_scale"]
        assert p.cfg.train.seed == p.values["train.seed"]
        assert p.cfg.sweep.axes == {}
        assert p.run_id == p.cfg.run_id() == with_values(cfg, p.values).run_id()
    assert len({p.run_id for p in points}) == 6
    assert [p.run_id for p in expand_grid(cfg)] == [p.run_id for p in points]  # stable


def test_a_setting_a_point_does_not_read_is_left_out_of_its_run_id():
    # pos = "learned" does not read rope_base: swept again under --set model.rope_base=100 the
    # learned point got another run id, trained bitwise alike, and status read rope_base as mattering.
    plain = expand_grid(from_dict(tiny({"model.pos": ["rope", "learned"]})))
    based = expand_grid(from_dict(tiny({"model.pos": ["rope", "learned"]}, model={"rope_base": 100.0})))
    assert plain[0].run_id != based[0].run_id and based[0].cfg.model.rope_base == 100.0  # rope reads it
    assert plain[1].run_id == based[1].run_id and based[1].cfg.model.rope_base == 10000.0
    assert based[1].cfg == plain[1].cfg


def test_a_point_records_its_values_as_its_config_holds_them():
    # init_scale written 1 is 1.0 in the run's config and id; recorded as written, a sweep of
    # [1, 2] and one of [1.0, 2.0] into one store read as four points, "1" and "1.0", in status,
    # the report and predict's groups.
    ints = expand_grid(from_dict(tiny({"model.init_scale": [1, 2]})))
    floats = expand_grid(from_dict(tiny({"model.init_scale": [1.0, 2.0]})))
    assert [p.run_id for p in ints] == [p.run_id for p in floats]
    for p, q in zip(ints, floats, strict=True):
        assert p.values == q.values and type(p.values["model.init_scale"]) is float


def test_zip_pairs_axes_and_crosses_the_rest():
    cfg = from_dict(tiny({"model.n_heads": [1, 2], "train.seed": [0, 1, 2], "model.init_scale": [0.5, 1.0, 2.0],
                          "zip": [["train.seed", "model.init_scale"]]}))
    points = expand_grid(cfg)
    assert len(points) == 6
    pairs = {(p.values["train.seed"], p.values["model.init_scale"]) for p in points}
    assert pairs == {(0, 0.5), (1, 1.0), (2, 2.0)}
    assert [p.values["model.n_heads"] for p in points] == [1, 1, 1, 2, 2, 2]
    assert len({p.run_id for p in points}) == 6


def test_run_id_is_the_resolved_config_id():
    """The same point reached with --set on a config without a sweep table is the same run."""
    cfg = from_dict(tiny({"train.seed": [3, 4], "task.min_period": [2, 3]}))
    point = expand_grid(cfg)[-1]
    single = from_dict(tiny(train={"seed": 4}, task={"min_period": 3}))
    assert point.run_id == single.run_id()
    assert point.label == "train.seed=4, task.min_period=3"


def test_no_axes_is_the_base_point():
    cfg = from_dict(tiny())
    [point] = expand_grid(cfg)
    assert point.values == {} and point.run_id == cfg.run_id() and point.label == "base"


def test_list_valued_axis_round_trips():
    cfg = from_dict(tiny({"task.components": [["induction", "markov"], ["markov"]]}, task={"name": "mixture", "components": ["induction"]}))
    points = expand_grid(cfg)
    assert [p.values["task.components"] for p in points] == [["induction", "markov"], ["markov"]]
    assert points[0].cfg.task.components == ("induction", "markov")
    json.dumps([p.values for p in points])


def test_invalid_point_is_named():
    cfg = from_dict(tiny({"model.n_heads": [2, 3], "train.seed": [0]}))
    with pytest.raises(ConfigError, match=r"^sweep point model.n_heads=3, train.seed=0: model.n_heads: 3 does not divide"):
        expand_grid(cfg)


def test_a_point_whose_corpus_split_has_no_windows_is_named():
    cfg = from_dict(tiny({"task.holdout": [0.1, 1e-9]}, task={"name": "corpus"}, model={"vocab_size": 256}))
    with pytest.raises(ConfigError, match=r"^sweep point task.holdout=1e-09: task.holdout: 1e-09 leaves no held-out"):
        expand_grid(cfg)


def test_points_that_are_the_same_run_are_refused():
    for axis in ({"train.device": ["cpu", "cuda"]}, {"train.seed": [0, 1, 0]}):
        with pytest.raises(ConfigError, match="are the same experiment .* a value repeats, or they differ only in"):
            expand_grid(from_dict(tiny(axis)))


def test_an_axis_over_a_task_key_the_task_does_not_read_is_refused():
    # task.delta under induction: two runs of bitwise the same data and model under two run ids,
    # read as "delta has no effect"
    with pytest.raises(ConfigError, match=r"^sweep points task.delta=2 and task.delta=3 train the same data and "
                                          r"model: they differ only in task.delta, which induction does not read$"):
        expand_grid(from_dict(tiny({"task.delta": [2, 3]})))
    crossed = tiny({"task.name": ["offset_copy", "induction"], "task.p": [0.5, 0.9]})
    with pytest.raises(ConfigError, match=r'task.name="induction", task.p=0.5 and task.name="induction", task.p=0.9'):
        expand_grid(from_dict(crossed))
    # read by a component of the mixture, or zipped with the task that reads it: every point differs
    mixture = tiny({"task.delta": [2, 3]}, task={"name": "mixture", "components": ["induction", "offset_copy"]})
    assert len(expand_grid(from_dict(mixture))) == 2
    crossed["sweep"]["zip"] = [["task.name", "task.p"]]
    assert len(expand_grid(from_dict(crossed))) == 2
    # set in the base config, read by no point: every run id changes, and no run trains with it
    with pytest.raises(ConfigError, match=r"^task.delta = 5: no point of the sweep trains a task that reads it "
                                          r"\(only offset_copy does\)"):
        expand_grid(from_dict(tiny({"train.seed": [0, 1]}, task={"name": "induction", "delta": 5})))
    assert len(expand_grid(from_dict(tiny({"task.name": ["induction", "offset_copy"]}, task={"delta": 5})))) == 2


def test_learned_gate_keys_under_fixed_gates_are_refused_as_unread():
    # gate_init and gate_l1 are read by learned gates alone: under fixed gates an axis over them
    # trained one run several times under several run ids
    with pytest.raises(ConfigError, match=r"differ only in model.gate_l1, which fixed gates \(model.gates = "
                                          r"\"fixed\"\) do not read$"):
        expand_grid(from_dict(tiny({"model.gate_l1": [0.01, 0.1]})))
    with pytest.raises(ConfigError, match=r"^model.gate_init = 5.0: no point of the sweep reads it \(fixed gates "
                                          r"\(model.gates = \"fixed\"\) do not read it\), so every run .* or sweep "
                                          r"model.gates$"):
        expand_grid(from_dict(tiny({"train.seed": [0, 1]}, model={"gate_init": 5.0})))
    assert len(expand_grid(from_dict(tiny({"model.gate_l1": [0.01, 0.1]}, model={"gates": "learned"})))) == 2
    crossed = tiny({"model.gates": ["fixed", "learned"]}, model={"gate_init": 5.0})  # read by the learned point
    assert len(expand_grid(from_dict(crossed))) == 2


def test_settings_read_only_under_a_condition_are_refused_where_no_point_reads_them():
    # TINY is attention-only: an axis over d_mlp trained one run twice, reading as "d_mlp has no effect"
    with pytest.raises(ConfigError, match=r"differ only in model.d_mlp, which an attention-only model "
                                          r"\(model.attn_only = true\) does not read$"):
        expand_grid(from_dict(tiny({"model.d_mlp": [64, 128]})))
    assert len(expand_grid(from_dict(tiny({"model.d_mlp": [64, 128]}, model={"attn_only": False})))) == 2
    sgd = {"optimizer": "sgd"}
    with pytest.raises(ConfigError, match=r"differ only in train.beta2, which SGD \(train.optimizer = \"sgd\"\)"):
        expand_grid(from_dict(tiny({"train.beta2": [0.9, 0.99]}, train=sgd)))
    with pytest.raises(ConfigError, match=r"^record.chg_steps = 5: no point of the sweep reads it .* or sweep "
                                          r"record.chg_every$"):
        expand_grid(from_dict(tiny({"train.seed": [0, 1]}, record={"chg_steps": 5})))
    # read by one point: both train differently
    crossed = tiny({"model.pos": ["rope", "learned"]}, model={"rope_base": 500.0})
    assert len(expand_grid(from_dict(crossed))) == 2
    # two kinds at once are both named
    both = tiny({"model.d_mlp": [64, 128], "model.gate_l1": [0.01, 0.5], "zip": [["model.d_mlp", "model.gate_l1"]]})
    with pytest.raises(ConfigError, match=r"which an attention-only model \(model.attn_only = true\) does not read, "
                                          r"nor which fixed gates \(model.gates = \"fixed\"\) do not read$"):
        expand_grid(from_dict(both))


def test_points_whose_tasks_come_to_the_same_data_are_refused():
    import numpy as np

    from dynamics.tasks import make_batch

    # equal weights, however written, draw the same rows; a mixture of one component makes the
    # very batches of that task: each pair trained bitwise the same run under two run ids
    mix = {"name": "mixture", "components": ["induction", "markov"]}
    with pytest.raises(ConfigError, match=r"^sweep points task.weights=\[\] and task.weights=\[1, 1\] train the "
                                          r"same data and model: they differ only in task.weights, which come to "
                                          r"the same task"):
        expand_grid(from_dict(tiny({"task.weights": [[], [1, 1], [2, 2]]}, task=mix)))
    assert len(expand_grid(from_dict(tiny({"task.weights": [[1, 2], [2, 1], [2, 4.5]]}, task=mix)))) == 3
    one = tiny({"task.name": ["induction", "mixture"], "task.components": [[], ["induction"]],
                "zip": [["task.name", "task.components"]]})
    with pytest.raises(ConfigError, match=r"differ only in task.name, task.components, which come to the same task"):
        expand_grid(from_dict(one))
    plain = from_dict(tiny())
    alone = from_dict(tiny(task={"name": "mixture", "components": ["induction"]}))
    for split in ("train", "eval", "probe"):  # the known answer the refusal rests on
        a, b = make_batch(plain, split, 3, 8), make_batch(alone, split, 3, 8)
        np.testing.assert_array_equal(a.tokens, b.tokens)


def test_each_point_intervention_is_checked_before_any_work():
    raw = tiny({"train.seed": [0, 1]})
    raw["intervene"] = {"templates": {"heads": [{"layer": 5, "head": 0, "pattern": "uniform"}]}}
    with pytest.raises(ConfigError, match=r"^sweep point train.seed=0: .*layer 5"):
        expand_grid(from_dict(raw))


def test_a_point_that_cannot_fit_in_memory_is_refused_before_the_store_is_made(tmp_path):
    # checked for every point: the typo was trained by a worker, which failed with a MemoryError
    cfg = from_dict(tiny({"train.batch_size": [16, 10**8]}))
    out = tmp_path / "s.zarr"
    with pytest.raises(ConfigError, match=r"^sweep point train.batch_size=100000000: config needs at least .* for a "
                                          r"training step\), more than the"):
        run_sweep(cfg, str(out), workers=1, progress=False)
    assert not out.exists()


def test_cli_invalid_point_exits_2_with_one_line_and_writes_nothing(tmp_path):
    config = write_toml(tmp_path / "bad.toml", tiny({"model.n_heads": [2, 5], "train.seed": [0, 1]}))
    out = tmp_path / "store.zarr"
    r = cli("sweep", str(config), "--out", str(out))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "sweep point model.n_heads=5, train.seed=0: model.n_heads: 5 does not divide" in lines[0]
    assert r.stdout == ""
    assert not out.exists()


def test_cli_unknown_axis_exits_2(tmp_path):
    config = write_toml(tmp_path / "bad.toml", tiny({"model.nope": [1, 2]}))
    r = cli("sweep", str(config), "--out", str(tmp_path / "s.zarr"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["dynamics: error: sweep: unknown axis 'model.nope'"]
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("content, needle", [
    ("{}", 'not a scheduler file (no "address" in its JSON)'),
    ("[1, 2]", 'not a scheduler file (no "address" in its JSON)'),
    ('{"address": ""}', 'not a scheduler file (no "address" in its JSON)'),
    ('{"address": null}', 'not a scheduler file (no "address" in its JSON)'),
    ('{"address": 5}', 'not a scheduler file (its "address" is 5, not a string)'),  # was "no address"
    ("", "not a readable scheduler file"),
    ("garbage", "not a readable scheduler file"),
])
def test_a_damaged_scheduler_file_is_refused_in_one_line(tmp_path, content, needle):
    # Dask's own reading of these raised a bare AssertionError (or TypeError): a traceback, exit 1
    from dynamics.sweep.launcher import check_scheduler

    (tmp_path / "scheduler.json").write_text(content)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        check_scheduler(str(tmp_path / "scheduler.json"))


def test_a_scheduler_address_dask_cannot_use_is_refused_in_one_line():
    from dynamics.sweep.launcher import check_scheduler

    # tls:// without TLS settings: Dask raised a TypeError, not a connection error
    with pytest.raises(ConfigError, match="cannot reach a Dask scheduler there .*TLS"):
        check_scheduler("tls://127.0.0.1:1")


def test_an_address_that_answers_but_is_no_scheduler_is_refused_not_waited_on():
    # The dashboard's port (or any socket that accepts and says nothing): the Client's timeout
    # covered the connection, not Dask's handshake after it, and the sweep waited for ever, silent.
    import socket

    from distributed import LocalCluster

    from dynamics.sweep.launcher import check_scheduler

    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        with pytest.raises(ConfigError, match=f"^--scheduler tcp://127.0.0.1:{port}: no Dask scheduler answered "
                                              f"there within 1 s$"):
            check_scheduler(f"tcp://127.0.0.1:{port}", timeout=1.0)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"}) as cluster:
        [worker] = cluster.workers.values()
        with pytest.raises(ConfigError, match="a Dask Worker answers there, not a scheduler"):
            check_scheduler(worker.address)
        check_scheduler(cluster.scheduler_address)


def test_check_scheduler_reaches_a_tls_cluster_and_runs_inside_an_event_loop(tmp_path):
    # Asked without the TLS settings of Dask's config, a tls:// cluster the sweep reaches was
    # refused; and asyncio.run inside a running loop (run_sweep in a notebook) was "cannot reach".
    import asyncio

    import dask
    from distributed import LocalCluster
    from distributed.security import Security

    from dynamics.sweep.launcher import check_scheduler

    made = Security.temporary()
    files = {}
    for name, text in (("ca", made.tls_ca_file), ("cert", made.tls_client_cert), ("key", made.tls_client_key)):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text(text)
    tls = {"distributed.comm.tls.ca-file": str(files["ca"])}
    for role in ("client", "scheduler", "worker"):
        tls |= {f"distributed.comm.tls.{role}.cert": str(files["cert"]), f"distributed.comm.tls.{role}.key": str(files["key"])}
    with dask.config.set(tls), LocalCluster(n_workers=0, processes=False, protocol="tls://", security=Security(),
                                            dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"}) as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        check_scheduler(cluster.scheduler_address)

        async def in_a_loop() -> None:
            check_scheduler(cluster.scheduler_address)

        asyncio.run(in_a_loop())


def test_progress_counts_only_finished_runs():
    # After Ctrl-C the plain log read "[sweep] 4/4 rc cancelled" with two of the four runs not
    # trained: every run that ended was counted as done. Only completed and diverged runs are
    # finished; the others train again on the next launch. On a terminal, the overall bar likewise,
    # and a run's note went to stdout while the bars drew on stderr.
    import io

    from dynamics.sweep.progress import _Bars, _Display

    log = io.StringIO()
    display = _Display(5, 1, stream=log, every=0)  # one run already finished before this launch
    display.starting(4, 2)  # in a log, the first line came ten seconds in, with the first step report
    display.step("rb", 5, 12, 1.0)
    display.tick()
    for run_id, status in [("ra", "completed"), ("rb", "interrupted"), ("rc", "cancelled"), ("rd", "failed"),
                           ("re", "diverged")]:
        display.finished(run_id, status)
    assert log.getvalue().splitlines() == [
        "[sweep] 4 run(s) to train on 2 worker(s), 1 of 5 already finished; a line as each ends, and the running "
        "ones every 0 s",
        "[sweep] 1/5 finished; running: rb 5/12", "[sweep] ra completed (2/5 finished)",
        "[sweep] rb interrupted (2/5 finished)", "[sweep] rc cancelled (2/5 finished)",
        "[sweep] rd failed (2/5 finished)", "[sweep] re diverged (3/5 finished)"]
    given = io.StringIO()
    _Display(2, 0, stream=given, every=0).starting(2, "tcp://10.0.0.5:8786")  # its size is the cluster's own
    assert given.getvalue().startswith("[sweep] 2 run(s) to train on the cluster at tcp://10.0.0.5:8786, 0 of 2 ")
    term = io.StringIO()
    bars = _Bars(5, 1, stream=term)
    bars.finished("ra", "completed")
    bars.finished("rc", "cancelled")
    assert bars.overall.n == 2 and "rc cancelled" in term.getvalue()
    bars.close()


# --------------------------------------------------------------------------- runs


def test_run_point_returns_a_failure_instead_of_raising(tmp_path):
    cfg = from_dict(tiny(train={"device": "cuda:7"}))
    out = run_point(cfg, str(tmp_path / "s.zarr"), cfg.run_id(), {"train.device": "cuda:7"})
    assert out["status"] == "failed" and out["run_id"] == cfg.run_id()
    assert out["error"] and "Traceback" in out["traceback"]


def test_a_worker_that_makes_other_data_than_the_launcher_refuses_the_point_untouched(tmp_path):
    # A worker on another Python (its standard library is the corpus) trained its points on other
    # data than the launcher's machine and the cluster's other workers: one sweep, two datasets.
    from dynamics.tasks import data_hash

    cfg = from_dict(tiny())
    path = str(tmp_path / "s.zarr")
    out = run_point(cfg, path, cfg.run_id(), {}, data="0" * 64)
    assert out["status"] == "failed" and out["traceback"] is None
    assert out["error"] == (f"this worker makes other data for task 'induction' than the launcher's machine (data hash "
                            f"{data_hash(cfg)[:16]}... against 0000000000000000...: another Python's standard library, "
                            f"for the corpus?); not trained here, so that the sweep's runs all train on the same data")
    assert not store.is_store(path)  # nothing written: the same sweep on a cluster of one Python trains it
    assert run_point(cfg, path, cfg.run_id(), {}, data=data_hash(cfg))["status"] == "completed"


def test_a_late_failure_record_never_overwrites_a_finished_run(tmp_path):
    # A task failing after another process finished its run (or while it trains it, holding the
    # lock) must leave that run as it is: its failure goes to the sweep summary only. Likewise the
    # launcher's marking of runs left "running" after Ctrl-C: a locked one is another's, live.
    from dynamics.sweep.launcher import _mark_interrupted
    from dynamics.sweep.task import _record_failure

    cfg = from_dict(tiny())
    path = str(tmp_path / "s.zarr")
    train_run(cfg, path)
    _record_failure(path, cfg.run_id(), "Traceback: late")
    attrs = store.run_attrs(path, cfg.run_id())
    assert attrs["status"] == "completed" and not attrs.get("traceback")
    store.update_run_attrs(path, cfg.run_id(), status="running")
    with store.run_lock(path, cfg.run_id()):
        _record_failure(path, cfg.run_id(), "Traceback: late")
        _mark_interrupted(path, [cfg.run_id()])
    assert store.run_attrs(path, cfg.run_id())["status"] == "running"
    _mark_interrupted(path, [cfg.run_id()])  # nobody holds it now: it was cut short
    assert store.run_attrs(path, cfg.run_id())["status"] == "interrupted"


def test_run_sweep_then_rerun_skips_everything(tmp_path, threaded_cluster, monkeypatch):
    cfg = from_dict(tiny({"train.seed": [0, 1]}))
    path = str(tmp_path / "s.zarr")
    summary = run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert summary.ok and summary.counts == {"completed": 2} and summary.failed == [], summary.lines()
    points = expand_grid(cfg)
    assert sorted(store.list_runs(path)) == sorted(p.run_id for p in points)
    index = store.read_sweep_index(path)
    assert index["axes"] == ["train.seed"]
    assert index["runs"] == {p.run_id: p.values for p in points}
    for p in points:
        attrs = store.run_attrs(path, p.run_id)
        assert attrs["status"] == "completed" and attrs["sweep_values"] == p.values
    assert not Path(lock_path(path)).exists()

    # A worker killed between a run's last attrs and their root-index entry: plain xarray, which
    # reads the index, saw it running, and a rerun skipping it as finished left it so.
    from dynamics.store import root as store_root

    root = Path(path) / "zarr.json"
    meta = json.loads(root.read_text())
    for p in points:
        meta["consolidated_metadata"]["metadata"][f"runs/{p.run_id}"]["attributes"]["status"] = "running"
    root.write_text(json.dumps(meta))
    before = {p.run_id: store.run_attrs(path, p.run_id) for p in points}
    writes = []
    real_write = store_root._write_root
    monkeypatch.setattr(store_root, "_write_root", lambda loc, meta: (writes.append(1), real_write(loc, meta)))
    again = run_sweep(cfg, path, progress=False)  # nothing to do: no cluster is even started
    assert len(writes) == 2  # the sweep index, then every stale entry at once (one each was quadratic)
    assert again.skipped == [p.run_id for p in points] and again.counts == {"completed": 2}
    assert {p.run_id: store.run_attrs(path, p.run_id) for p in points} == before
    for p in points:
        assert xr.open_zarr(path, group=f"runs/{p.run_id}").attrs == before[p.run_id]


def test_a_task_cancelled_on_the_cluster_ends_the_sweep_with_a_summary(tmp_path, threaded_cluster, monkeypatch):
    # A task cancelled on the cluster (another client; the scheduler lost, whose futures Dask cancels
    # as "scheduler-connection-lost") made Dask's wait() raise FuturesCancelledError: a 30-line
    # traceback from `dynamics sweep`, no summary, the other runs' results unreported.
    import threading

    from distributed import Client, Future

    from dynamics import train as train_module

    cfg = from_dict(tiny({"train.steps": [24, 12]}))
    slow, cut = expand_grid(cfg)
    path = str(tmp_path / "s.zarr")
    other = Client(threaded_cluster, timeout=30)  # connected before the sweep starts: the race is only the poll's
    cancelled = threading.Event()
    real_train_run = train_module.train_run

    def held_train_run(cfg, *args, **kwargs):  # the one-thread worker holds the first point until then
        cancelled.wait(60)
        return real_train_run(cfg, *args, **kwargs)

    monkeypatch.setattr(train_module, "train_run", held_train_run)  # task.py imports it at each call

    def cancel_second() -> None:  # the second point is queued behind the first
        try:
            for _ in range(3000):
                keys = other.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks))
                mine = [k for k in keys if str(k).startswith(f"dynamics-train-{cut.run_id}-")]
                if mine:
                    Future(mine[0], other).cancel(force=True)
                    return
                time.sleep(0.005)
        finally:
            cancelled.set()

    canceller = threading.Thread(target=cancel_second)
    canceller.start()
    try:
        summary = run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    finally:
        canceller.join()
        other.close()
    assert summary.counts == {"completed": 1, "cancelled": 1} and not summary.ok, summary.lines()
    assert summary.cancelled == [cut.run_id] and summary.failed == []
    assert f"  cancelled {cut.run_id} [train.steps=12]: its task was cancelled on the cluster (" in summary.lines()[1]
    assert store.run_attrs(path, slow.run_id)["status"] == "completed"
    assert cut.run_id not in store.list_runs(path)  # queued when cancelled: nothing written


def test_experiment_configs_are_valid_sweeps():
    for name in ("quickstart", "init_scale", "learning_rate", "head_count", "positional"):
        cfg = load_config(ROOT / "experiments" / f"{name}.toml")
        points = expand_grid(cfg)
        assert len(cfg.sweep.axes["train.seed"]) >= 3, name
        assert len(points) >= 8, name
    quick = load_config(ROOT / "experiments" / "quickstart.toml")
    assert len(quick.sweep.axes) >= 2
    assert load_config(ROOT / "experiments" / "init_scale.toml").sweep.axes["model.init_scale"] == (
        0.25, 0.5, 1.0, 2.0, 4.0)
    heads = load_config(ROOT / "experiments" / "head_count.toml")
    assert heads.model.d_model == 64 and heads.sweep.axes["model.n_heads"] == (2, 4, 8, 16)
    assert load_config(ROOT / "experiments" / "positional.toml").sweep.axes["model.pos"] == ("rope", "learned", "none")


def test_a_later_sweep_into_the_store_keeps_every_runs_swept_values(tmp_path, threaded_cluster):
    # Sweep init_scale, then seeds into the same store: the seed-0 point is the run already there
    # (init_scale 1.0 is the default). The index must keep its init_scale and give the new run its
    # own (from its config), so status and the report do not show them blank.
    path = str(tmp_path / "s.zarr")
    first = run_sweep(from_dict(tiny({"model.init_scale": [1.0]})), path, scheduler=threaded_cluster, progress=False)
    second = run_sweep(from_dict(tiny({"train.seed": [0, 1]})), path, scheduler=threaded_cluster, progress=False)
    assert first.ok and second.ok and len(second.skipped) == 1, second.lines()
    index = store.read_sweep_index(path)
    assert index["axes"] == ["model.init_scale", "train.seed"]
    [old] = first.labels
    [new] = [rid for rid in second.labels if rid != old]
    assert index["runs"] == {old: {"model.init_scale": 1.0, "train.seed": 0},
                             new: {"model.init_scale": 1.0, "train.seed": 1}}


def test_status_shows_a_pending_points_steps_from_the_index(tmp_path):
    # A point not started has no attrs: status showed "0/?". The launcher's index now holds each
    # point's train.steps, merged over sweeps (a later sweep's points beside the earlier ones').
    from dynamics.status import status_table
    from dynamics.sweep.launcher import _write_index

    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    first = expand_grid(from_dict(tiny({"train.seed": [0, 1]})))
    later = expand_grid(from_dict(tiny({"train.seed": [2]}, train={"steps": 30})))
    _write_index(path, first)
    _write_index(path, later)
    _, rows, _ = status_table(path)
    steps = {row[0]: row[-3] for row in rows}
    assert steps == {first[0].run_id: "0/12", first[1].run_id: "0/12", later[0].run_id: "0/30"}
    assert all(row[-4] == "pending" for row in rows)


def test_a_finished_run_of_a_points_id_but_another_config_is_not_skipped_as_that_point(tmp_path, threaded_cluster):
    # A run recorded under a point's id with another config (dynamics run --run-id) was counted
    # finished, and status and open_sweep gave it the point's values; then its task refused it,
    # after every other point had trained. Now refused before any point trains.
    path = str(tmp_path / "s.zarr")
    cfg = from_dict(tiny({"model.init_scale": [1.0, 2.0]}))
    point, other = expand_grid(cfg)
    train_run(with_values(point.cfg, {"train.lr": 0.01}), path, point.run_id)
    with pytest.raises(store.StoreError, match=rf"sweep point model.init_scale=1.0: run {point.run_id} in .* was "
                                               r"recorded with a different config"):
        run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert store.list_runs(path) == [point.run_id] and store.read_sweep_index(path) is None  # nothing trained
    assert store.run_attrs(path, point.run_id)["config"]["train"]["lr"] == 0.01  # left as it was


def _two_points_the_first_interrupted(tmp_path):
    """A store path, a two-point grid and its points, the first trained 8 steps and interrupted."""
    from tests.conftest import interrupt_at

    path = str(tmp_path / "s.zarr")
    cfg = from_dict(tiny({"model.init_scale": [1.0, 2.0]}))
    point, other = expand_grid(cfg)
    with pytest.raises(KeyboardInterrupt):
        train_run(point.cfg, path, point.run_id, progress=interrupt_at(8))
    return path, cfg, point, other


def test_a_point_whose_checkpoint_is_lost_is_refused_before_any_point_trains(tmp_path, threaded_cluster):
    path, cfg, point, _ = _two_points_the_first_interrupted(tmp_path)
    store.checkpoint_path(path, point.run_id).unlink()
    with pytest.raises(store.StoreError, match=rf"run {point.run_id} in .* recorded training up to step \d+, but "
                                               r"its checkpoint .* is missing"):
        run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert store.list_runs(path) == [point.run_id]  # the other point was not trained


def test_a_point_recorded_on_other_data_is_refused_before_any_point_trains(tmp_path, threaded_cluster):
    # Its task refused it (train_run), but only after every other point had trained: exit 1 then.
    from dynamics.tasks import data_hash

    path, cfg, point, other = _two_points_the_first_interrupted(tmp_path)
    store.update_run_attrs(path, point.run_id, data_hash="0000aaaa0000")  # as if made from another stdlib
    with pytest.raises(store.StoreError, match=rf"sweep point model.init_scale=1.0: run {point.run_id} in .* was "
                                               r"recorded on data with hash 0000aaaa0000, but this machine makes "):
        run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert store.list_runs(path) == [point.run_id]  # the other point was not trained

    # Finished there, it is skipped (its recordings are its own), but the other point, on the same
    # data here, would have trained on this machine's: one grid, two datasets.
    store.update_run_attrs(path, point.run_id, status="completed")
    with pytest.raises(store.StoreError, match=rf"sweep point model.init_scale=2.0: this machine makes data with hash "
                                               rf"{data_hash(other.cfg)} for task 'induction', but point "
                                               rf"model.init_scale=1.0 \(run {point.run_id}\) finished in .* on data "
                                               r"with hash 0000aaaa0000 "):
        run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert store.list_runs(path) == [point.run_id]
    store.update_run_attrs(path, point.run_id, data_hash=data_hash(point.cfg))
    assert run_sweep(cfg, path, scheduler=threaded_cluster, progress=False).ok


SUBMITTED_CWDS: list = []


def _run_point_recording_cwd(cfg, path, run_id, values, token="", cwd=None, data=None):
    SUBMITTED_CWDS.append(cwd)  # module-level, so the in-process worker finds this very list
    return {"run_id": run_id, "status": "completed", "steps_done": 0, "skipped": False, "error": None,
            "traceback": None}  # what run_point does with it is the test's second half


def test_a_relative_teacher_path_is_to_the_launchers_directory(tmp_path, monkeypatch, threaded_cluster):
    # On an external cluster a worker runs in its own working directory: the student's relative
    # teacher path failed there "not found", or named another store that happened to be there.
    launcher, worker = tmp_path / "launcher", tmp_path / "worker"
    launcher.mkdir()
    worker.mkdir()
    monkeypatch.chdir(launcher)
    teacher = train_run(from_dict(tiny()), "runs/teacher.zarr")
    raw = tiny()
    raw["intervene"] = {"distill": {"teacher": "runs/teacher.zarr"}}
    student = from_dict(raw)  # no axes: the sweep's one point is this config
    path = str(launcher / "s.zarr")

    # the launcher sends its directory with each task (the threaded worker shares this process's cwd);
    # it names the task's function by module and name, looked up on the worker
    import dynamics.sweep.task

    SUBMITTED_CWDS.clear()
    monkeypatch.setattr(dynamics.sweep.task, "run_point", _run_point_recording_cwd)
    summary = run_sweep(student, path, scheduler=threaded_cluster, progress=False)
    assert summary.ok and SUBMITTED_CWDS == [str(launcher)], (summary.lines(), SUBMITTED_CWDS)

    # and the task resolves against it, wherever the worker runs
    monkeypatch.chdir(worker)
    out = run_point(student, path, student.run_id(), {}, "", str(launcher))
    assert out["status"] == "completed", out["error"]
    attrs = store.run_attrs(path, student.run_id())
    assert attrs["config"]["intervene"]["distill"]["teacher"] == "runs/teacher.zarr"  # as written: the same run id
    distilled = attrs["interventions"]["distill"]
    assert distilled["teacher_store"] == str(launcher / "runs" / "teacher.zarr")
    assert distilled["teacher_run"] == teacher.run_id
