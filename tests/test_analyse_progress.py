"""analyse_store's progress calls, the shortest run it analyses, and a URL store it keeps to itself."""

import shutil
import uuid

import fsspec
import pytest

from dynamics import store
from dynamics.analyse import analyse_store
from dynamics.analysis import AnalysisOptions
from dynamics.config import load_config, with_values
from dynamics.train import train_run


@pytest.fixture(scope="module")
def shortest(tmp_path_factory):
    """A store of a completed run with exactly the snapshots analysis needs (steps 0-3, all
    recorded), and a run interrupted at its first step."""
    from tests.conftest import TINY, interrupt_at

    d = tmp_path_factory.mktemp("progress")
    (d / "tiny.toml").write_text(TINY.format(steps=3, every=10))
    cfg = load_config(d / "tiny.toml")
    path = str(d / "s.zarr")
    train_run(cfg, path)
    with pytest.raises(KeyboardInterrupt):
        train_run(with_values(cfg, {"train.seed": 1}), path, progress=interrupt_at(1))
    assert store.open_run(path, cfg.run_id()).sizes["snapshot"] == AnalysisOptions().baseline_snapshots + 1 == 4
    return path, cfg.run_id()


def test_progress_counts_each_run_out_of_all_and_the_shortest_run_is_analysed(shortest, tmp_path):
    path, completed = shortest
    copy = str(tmp_path / "s.zarr")
    shutil.copytree(path, copy)
    calls = []
    rows = analyse_store(copy, workers=1, progress=lambda done, total, row: calls.append((done, total, row["run"])))
    ids = store.list_runs(copy)
    assert calls == [(1, 2, ids[0]), (2, 2, ids[1])]
    [row] = [r for r in rows if r["run"] == completed]
    assert not row.get("skipped"), row  # four snapshots: as many as the noise band needs
    assert store.open_analysis(copy, completed).sizes["snapshot"] == 4


def test_a_url_store_is_analysed_by_this_process_alone(shortest):
    # A memory:// store is this process's dict: a worker process would find no store there (and
    # a URL store's root index has no cross-process lock)
    path, completed = shortest
    url = f"memory://dynamics-test-{uuid.uuid4().hex}/s.zarr"
    fs, root = fsspec.core.url_to_fs(url)
    fs.put(path, root, recursive=True)
    try:
        rows = analyse_store(url, workers=2)
        assert [(r["run"], r.get("skipped", False), "error" in r) for r in rows] == \
            [(rid, rid != completed, False) for rid in store.list_runs(path)]
        assert store.open_analysis(url, completed) is not None
    finally:
        fs.rm(root, recursive=True)


def test_a_diverged_run_is_analysed_on_as_few_finite_snapshots_as_analysis_needs(shortest, tmp_path):
    # marked diverged at a step whose snapshot is finite (a NaN gradient under a finite loss): that
    # snapshot counts among the finite ones
    from dynamics.analyse import analyse_one

    path, completed = shortest
    copy = str(tmp_path / "s.zarr")
    shutil.copytree(path, copy)
    store.update_run_attrs(copy, completed, status="diverged", diverged_step=3)
    assert not analyse_one(copy, completed).get("skipped")
    store.update_run_attrs(copy, completed, status="diverged", diverged_step=2)
    assert analyse_one(copy, completed) == {"run": completed, "status": "diverged", "skipped": True,
                                            "reason": "diverged at step 2 after 3 finite snapshots; analysis needs >= 4"}


def test_an_empty_selection_of_runs_analyses_none(shortest, tmp_path):
    # run_ids=[] (a script's filter that matched nothing) was read as "every run": the whole
    # store analysed, every earlier analysis rewritten
    path, completed = shortest
    copy = str(tmp_path / "s.zarr")
    shutil.copytree(path, copy)
    assert analyse_store(copy, [], workers=2) == []
    assert store.open_analysis(copy, completed) is None


def test_a_run_named_twice_is_analysed_once_and_an_unknown_run_is_refused_before_any(shortest, tmp_path):
    # a duplicate id sent two workers writing one run's analysis at once, the progress counting
    # to 2 of 2 rows for one run; an unknown id was analysed as a "damaged" run
    path, completed = shortest
    copy = str(tmp_path / "s.zarr")
    shutil.copytree(path, copy)
    with pytest.raises(ValueError, match=f"^no run 'nope' in {copy}$"):
        analyse_store(copy, [completed, "nope"], workers=2)
    assert store.open_analysis(copy, completed) is None  # refused before any run was analysed
    calls = []
    rows = analyse_store(copy, [completed, completed], workers=2,
                         progress=lambda done, total, row: calls.append((done, total, row["run"])))
    assert [r["run"] for r in rows] == [completed] and not rows[0].get("skipped")
    assert calls == [(1, 1, completed)]


def test_runs_are_analysed_and_said_in_the_sweep_grids_order(shortest, tmp_path):
    # `status` and the table list runs in the grid's order; analyse's lines came in run-id order
    path, _ = shortest
    copy = str(tmp_path / "s.zarr")
    shutil.copytree(path, copy)
    ids = store.list_runs(copy)  # by id
    grid = list(reversed(ids))
    store.write_sweep_index(copy, {"axes": ["train.seed"], "runs": {r: {"train.seed": i} for i, r in enumerate(grid)}})
    calls = []
    rows = analyse_store(copy, workers=1, progress=lambda done, total, row: calls.append(row["run"]))
    assert calls == grid and [r["run"] for r in rows] == grid
