"""`dynamics status`'s rows at their edges: what a run lacking an axis shows, and the steps and
resume step of runs that are not simply completed or interrupted (the rows' order: test_grid.py)."""

import shutil

import pytest

from dynamics import store
from dynamics.config import RunConfig, from_dict
from dynamics.status import row_labels, status_table
from dynamics.train import train_run

TINY = {
    "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16},
    "task": {"name": "induction", "min_period": 2, "max_period": 6},
    "train": {"steps": 12, "batch_size": 4, "warmup_steps": 2, "eval_batches": 1},
    "record": {"dense_until": 4, "every": 6, "n_probe": 2, "eval_batch_size": 4},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("status") / "s.zarr"
    return path, train_run(from_dict(TINY), str(path)).run_id


@pytest.fixture
def copy(trained, tmp_path):
    path, run_id = trained
    shutil.copytree(path, tmp_path / "s.zarr")
    return tmp_path / "s.zarr", run_id


def test_a_run_outside_the_index_whose_config_lacks_an_axis_shows_none():
    # an axis inside an [intervene] section the run has none of: "None", Python's word, read as a value
    index = {"axes": ["train.seed", "intervene.conditioned_gates.pool"],
             "runs": {"rp": {"train.seed": 1, "intervene.conditioned_gates.pool": "mean"}}}
    labels, shown = row_labels(index, {"rx": {"config": RunConfig().to_dict()}}, ["rx", "rp"])
    assert labels == ["train.seed", "intervene.conditioned_gates.pool"]
    assert shown("rx") == ["0", "none"] and shown("rp") == ["1", "mean"]


def test_a_diverged_run_is_never_resumed(copy):
    path, run_id = copy
    store.update_run_attrs(path, run_id, status="diverged")
    header, [row], _ = status_table(str(path))
    got = dict(zip(header, row, strict=True))
    assert (got["status"], got["steps"], got["resumes_at"]) == ("diverged", "12/12", "-")
    # its last loss not finite (stored as null, JSON holds no NaN): "-" read as never written
    store.update_run_attrs(path, run_id, last_loss=None)
    header, [row], _ = status_table(str(path))
    assert dict(zip(header, row, strict=True))["last_loss"] == "not finite"


@pytest.mark.parametrize("status", ["interrupted", "failed", "running"])
def test_an_unfinished_run_resumes_at_its_checkpoints_step_where_its_attrs_lag(copy, status):
    # Ctrl-C pressed three times: the writer thread was cut off between the checkpoint and its
    # attrs, and status said the checkpoint before (33) for a run that resumed at 34. Only a
    # stopped run's was read from the checkpoint itself.
    path, run_id = copy
    at = store.checkpoint_step(path, run_id)
    assert at
    store.update_run_attrs(path, run_id, status=status, steps_done=0, checkpoint_step=at - 2)
    header, [row], _ = status_table(str(path))
    got = dict(zip(header, row, strict=True))
    assert got["resumes_at"] == str(at)


def test_a_killed_runs_steps_are_its_checkpoints_even_where_that_checkpoint_is_gone(copy):
    # killed in its first session after the checkpoint at 6: steps_done still says where it started (0)
    path, run_id = copy
    store.update_run_attrs(path, run_id, status="running", steps_done=0, checkpoint_step=6)
    (path / "checkpoints" / run_id / "ckpt.pt").unlink()
    header, [row], _ = status_table(str(path))
    got = dict(zip(header, row, strict=True))
    assert (got["status"], got["steps"], got["resumes_at"]) == ("stopped", "6/12", "lost")


@pytest.mark.parametrize("status", ["interrupted", "running"])
def test_a_checkpoint_ahead_of_the_recordings_is_refused_not_offered(copy, status):
    # A store copied while the run trained (runs/ before checkpoints/): status offered a resume at
    # the checkpoint's step, which `run` then refused; an interrupted run is judged, a live one not.
    path, run_id = copy
    at = store.checkpoint_step(path, run_id)
    steps = store.open_run(path, run_id)["step"].values.tolist()
    store.update_run_attrs(path, run_id, status="interrupted")
    header, [row], _ = status_table(str(path))
    assert dict(zip(header, row, strict=True))["resumes_at"] == str(at)  # all recorded: resumable
    for chunk in (path / "runs" / run_id / "importance" / "c" / str(steps.index(4))).rglob("*"):
        if chunk.is_file():
            chunk.unlink()
    store.update_run_attrs(path, run_id, status=status)
    header, [row], _ = status_table(str(path))
    got = dict(zip(header, row, strict=True))
    # "running" with no process holding it is a killed run, "stopped": judged as well
    assert (got["status"], got["resumes_at"]) == ({"interrupted": "interrupted", "running": "stopped"}[status], "refused")


@pytest.mark.parametrize("array", ["step", "importance"])
def test_a_damaged_chunk_is_no_traceback_and_one_before_the_checkpoint_is_refused(copy, array):
    # A `step` chunk failing its checksum raised out of status (ValueError), no table for any run;
    # `run` refuses either damage, naming the chunk, so status says "refused", not the step.
    path, run_id = copy
    at = store.checkpoint_step(path, run_id)
    store.update_run_attrs(path, run_id, status="interrupted")
    chunk = next(p for p in (path / "runs" / run_id / array / "c").rglob("*") if p.is_file())
    blob = bytearray(chunk.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    chunk.write_bytes(bytes(blob))
    header, [row], _ = status_table(str(path))
    assert dict(zip(header, row, strict=True))["resumes_at"] == "refused"
    assert at  # a checkpoint it would otherwise offer


def test_a_pending_point_shows_the_steps_its_sweep_index_records(tmp_path):
    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    store.write_sweep_index(path, {"axes": ["train.lr"], "runs": {"rabc": {"train.lr": 0.1}}, "steps": {"rabc": 40}})
    header, rows, _ = status_table(path)
    assert rows[0][header.index("steps")] == "0/40" and rows[0][header.index("status")] == "pending"

# Known answers that mutants of this module passed (a mutation audit's): each pins a number, an
# order or a wording the other tests let move.


def test_status_gives_the_last_loss_to_four_decimals(tmp_path):
    # `:.4f` -> `:.3f` survived: no test read the last_loss column's value
    from dynamics import store
    from dynamics.status import status_table
    from tests.test_store import write_run

    path = tmp_path / "s.zarr"
    store.init_store(path)
    write_run(path, "r1", attrs={"status": "completed", "last_loss": 0.123456, "steps_done": 12, "steps_total": 12})
    header, [row], damaged = status_table(str(path))
    got = dict(zip(header, row, strict=True))
    assert (got["status"], got["steps"], got["resumes_at"], got["last_loss"]) == ("completed", "12/12", "-", "0.1235")
    assert damaged == {}


def test_a_sweep_point_left_as_a_checkpoint_without_its_group_is_one_damaged_row(tmp_path):
    # `r not in damaged` dropped from the pending rows survived: the point was listed twice, damaged and pending
    from dynamics import store
    from dynamics.status import status_table

    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_sweep_index(path, {"axes": ["train.lr"], "runs": {"rabc": {"train.lr": 0.1}}, "steps": {"rabc": 40}})
    (path / "checkpoints" / "rabc").mkdir(parents=True)
    (path / "checkpoints" / "rabc" / "ckpt.pt").write_bytes(b"not read")
    header, rows, damaged = status_table(str(path))
    assert rows == [["rabc", "0.1", "damaged", "-", "-", "-"]]
    assert list(damaged) == ["rabc"]


def test_runs_of_one_grid_point_keep_their_rank_when_a_table_value_lists_its_keys_in_another_order():
    # grid_order's json.dumps(sort_keys=True) -> repr survived: an [intervene] value recorded by
    # two sweeps with its keys in other orders ranked as two values, and its runs split apart
    from dynamics.status import grid_key

    axis = "intervene.conditioned_gates"
    index = {"axes": [axis], "runs": {"ra": {axis: {"a": 1, "b": 2}}, "rb": {axis: {"x": 0}},
                                      "rc": {axis: {"b": 2, "a": 1}}}}
    assert sorted(["rc", "rb", "ra"], key=grid_key(index)) == ["ra", "rc", "rb"]


def test_the_setting_columns_are_sorted_across_grid_points():
    # sorted(...) -> first-seen order survived: the columns' order followed which point was listed first
    from dynamics.status import setting_columns

    settings = {"ra": {"model.d_model": 16, "train.lr": 0.1}, "rb": {"model.d_model": 32, "train.lr": 0.1},
                "rc": {"model.d_model": 16, "train.lr": 0.1}, "rd": {"model.d_model": 16, "train.lr": 0.2}}
    points = {"ra": ["1"], "rb": ["1"], "rc": ["0"], "rd": ["0"]}
    assert setting_columns(settings, points) == ["model.d_model", "train.lr"]
    # runs at different points differ in what tells the points apart, not in a column of their own
    assert setting_columns({"ra": settings["ra"], "rd": settings["rd"]}, {"ra": ["1"], "rd": ["0"]}) == []


def test_status_gives_a_question_mark_for_a_total_the_attrs_do_not_record(tmp_path):
    # an older run's attrs without steps_total: "?" (unknown), not a total of 0
    from dynamics import store
    from dynamics.status import status_table
    from tests.test_store import write_run

    path = tmp_path / "s.zarr"
    store.init_store(path)
    write_run(path, "r1", attrs={"status": "completed", "steps_done": 7})
    header, [row], _ = status_table(str(path))
    assert dict(zip(header, row, strict=True))["steps"] == "7/?"


# --- `dynamics status` of a store with nothing to list, and of a hand-edited sweep index ---------


@pytest.mark.parametrize("index", [None, {"axes": ["train.seed"], "runs": {}}])
def test_a_store_of_no_runs_is_one_line_saying_what_trains_some_exit_2(tmp_path, capsys, index):
    # It printed the table's header alone, exit 0: read as runs that failed to show. `analyse`,
    # `report` and `gates` refuse a store of no runs with exit 2, and so does status now.
    from dynamics import cli

    path = tmp_path / "e.zarr"
    store.init_store(path)
    if index is not None:  # a sweep index of no runs: as empty
        store.write_sweep_index(path, index)
    assert cli.main(["status", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"dynamics: error: {path} holds no runs yet: `dynamics run CONFIG --out {path}` or `dynamics sweep CONFIG "
        f"--out {path}` trains some"]
    # a sweep's points not started yet are its rows, exit 0
    store.write_sweep_index(path, {"axes": ["train.seed"], "runs": {"rabc": {"train.seed": 0}}, "steps": {"rabc": 8}})
    assert cli.main(["status", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.splitlines()[1].split() == ["rabc", "0", "pending", "0/8", "-", "-"]


def test_a_sweep_index_entry_that_is_no_run_id_is_named_not_listed_pending(copy, capsys):
    # A hand-edited index: '../evil' was an ordinary pending row, a point for a sweep to train,
    # which none ever does (the launcher keeps it in the index as an earlier sweep's point).
    from dynamics import cli

    path, run_id = copy
    store.write_sweep_index(path, {"axes": ["train.seed"], "steps": {"rabc": 8},
                                   "runs": {run_id: {"train.seed": 0}, "../evil": {"train.seed": 5},
                                            "rabc": {"train.seed": 1}}})
    header, rows, damaged = status_table(str(path))
    assert [row[0] for row in rows] == [run_id, "rabc"] and damaged == {}
    assert cli.main(["status", str(path)]) == 1
    out, err = capsys.readouterr()
    assert [line.split()[:3] for line in out.splitlines()] == [["run", "train.seed", "status"],
                                                               [run_id, "0", "completed"], ["rabc", "1", "pending"]]
    assert err.splitlines() == [
        f"dynamics: {path}: the sweep index lists '../evil', which is no run id (use ASCII letters, digits, '.', '_' "
        "or '-', not starting with a symbol): not a sweep point, and no sweep trains it; delete it from the "
        "\"sweep\" attribute's runs in the store's root zarr.json"]
    assert cli.main(["analyse", str(path), "--workers", "1"]) == 0  # nor a pending row of analyse's table
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:3]] == [run_id, "rabc"] and not any("evil" in line for line in out)
    # nor a pending run of the report, counted in its header, a row of its table, or a note
    from dynamics.report import write_report

    page = write_report(path, path.parent / "rep", compute_missing=False).read_text()
    assert "evil" not in page and "1 completed, 1 pending (1 of 2 runs of the sweep index started)" in page
    # nor a run predict leaves out as pending, nor one `--run` calls a sweep point not started
    from dynamics.predict import PredictError
    from dynamics.predict.load import load_store

    with pytest.raises(PredictError, match=r"1 completed run\(s\) \(1 left out: rabc \(pending\)\); prediction needs"):
        load_store(str(path))
    assert cli.main(["analyse", str(path), "--run", "../evil"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"dynamics: error: no run '../evil' in {path}"]
    # an index of that entry alone lists nothing not started: the refusal names no pending runs
    empty = path.parent / "e.zarr"
    store.init_store(empty)
    store.write_sweep_index(empty, {"axes": ["train.seed"], "runs": {"../evil": {"train.seed": 5}}})
    capsys.readouterr()
    assert cli.main(["analyse", str(empty)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"dynamics: error: {empty} holds no runs to analyse"]


def test_a_run_failed_by_a_full_disk_shows_the_steps_and_loss_its_store_records(tmp_path, monkeypatch):
    # A write failed (ENOSPC) and the writer dropped every write after it, while training went on
    # until the error surfaced: status said the steps trained in memory (36/60) and the last of
    # their losses, of a run whose store held steps and losses to its checkpoint at 22.
    import errno

    import numpy as np

    full = {"snapshot": 5}  # snapshots at 0, 1, 2, 4, 6, 8: the one at step 8 finds the disk full
    write = store.RunWriter.write_snapshot

    def write_snapshot(self, index, arrays):
        if index >= full["snapshot"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, index, arrays)

    monkeypatch.setattr(store.RunWriter, "write_snapshot", write_snapshot)
    cfg = from_dict({**TINY, "train": {**TINY["train"], "steps": 20}, "record": {**TINY["record"], "every": 2}})
    path = tmp_path / "s.zarr"
    with pytest.raises(OSError, match="No space left"):
        train_run(cfg, str(path))
    run_id = cfg.run_id()
    attrs, at = store.run_attrs(path, run_id), store.checkpoint_step(path, run_id)
    loss = store.open_run(path, run_id)["loss"].values
    # trained past the checkpoint (how far depends on when the error surfaced), recorded to it
    assert attrs["status"] == "failed" and at == 6 and attrs["steps_done"] > at
    assert np.isfinite(loss[:at]).all() and np.isnan(loss[at:]).all()
    assert f"{attrs['last_loss']:.4f}" != f"{loss[at - 1]:.4f}"  # else the loss shown tells nothing
    header, [row], _ = status_table(str(path))
    got = dict(zip(header, row, strict=True))
    assert (got["status"], got["steps"], got["resumes_at"], got["last_loss"]) == (
        "failed", f"6/20 (+{attrs['steps_done'] - 6} unrecorded)", "6", f"{loss[5]:.4f}")


def test_a_setting_a_run_does_not_read_is_no_difference_and_shows_none():
    # A markov run beside induction ones at one swept point: its stored config holds the default
    # task.max_period, which no markov batch reads, and the column showed 16 against 12 as if it
    # differed; so did model.d_mlp for an attention-only model beside one with MLPs. Nor is a key
    # a column because one run does not read it: markov_order differs from no run that reads it.
    induction = from_dict({"model": {"d_mlp": 64}, "task": {"max_period": 12}}).to_dict()
    other = from_dict({"task": {"max_period": 8}}).to_dict()
    markov = from_dict({"model": {"attn_only": True}, "task": {"name": "markov"}}).to_dict()
    ids = ["ra", "rb", "rc"]
    index = {"axes": ["model.init_scale"], "runs": {r: {"model.init_scale": 1.0} for r in ids}}
    attrs = {"ra": {"config": induction}, "rb": {"config": markov}, "rc": {"config": other}}
    labels, shown = row_labels(index, attrs, ids)
    assert labels == ["model.init_scale", "model.attn_only", "model.d_mlp", "task.max_period", "task.name"]
    rows = {r: dict(zip(labels, shown(r), strict=True)) for r in ids}
    assert [rows[r]["task.max_period"] for r in ids] == ["12", "none", "8"]
    assert [rows[r]["model.d_mlp"] for r in ids] == ["64", "none", "256"]
    # two runs only, induction and markov: what tells them apart is the task's name and the model
    labels, _ = row_labels(index, {"ra": {"config": induction}, "rb": {"config": markov}}, ["ra", "rb"])
    assert labels == ["model.init_scale", "model.attn_only", "task.name"]
