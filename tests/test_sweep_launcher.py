"""The launcher (dynamics.sweep.launcher): the sweep index it writes."""

from dynamics import store
from dynamics.config import from_dict
from dynamics.sweep import expand_grid
from tests.test_sweep import tiny


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


def test_the_local_cluster_sets_no_memory_limit_per_worker():
    # Dask's default gives each worker an equal share of the machine and restarts one past 95% of
    # it: an 11.8 GiB run on two workers of a 23.5 GiB machine, which workers_that_fit lets through
    from dynamics.sweep.launcher import local_cluster

    cluster = local_cluster(1)
    try:
        limits = [w["memory_limit"] for w in cluster.scheduler_info["workers"].values()]
    finally:
        cluster.close()
    assert limits in ([0], [None]), limits


def test_a_sweep_leaves_the_launchers_environment_as_it_found_it(tmp_path, monkeypatch):
    # Dask's nannies set OMP_NUM_THREADS=1 (and MKL_, OPENBLAS_, PYTHONHASHSEED) in the launcher's
    # own os.environ before each worker spawn: a notebook's later torch work, and every process
    # it started, ran on one thread after a sweep
    import os

    from dynamics.sweep import run_sweep

    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED")
    for key in keys:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")  # one of Dask's set here: kept as it was
    summary = run_sweep(from_dict(tiny({"train.seed": [0]})), str(tmp_path / "s.zarr"), workers=1, progress=False)
    assert summary.ok
    assert {k: os.environ.get(k) for k in (*keys, "MALLOC_TRIM_THRESHOLD_")} == {**dict.fromkeys(keys),
                                                                               "MALLOC_TRIM_THRESHOLD_": "12345"}


def test_a_cluster_that_fails_to_start_leaves_the_environment_as_it_found_it(tmp_path, monkeypatch):
    # The nannies set OMP_NUM_THREADS=1 as the cluster starts: a client that then failed to
    # connect left it behind, the launcher's restore being in the sweep's own try
    import os

    import distributed

    from dynamics.sweep import run_sweep

    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED")
    for key in keys:
        monkeypatch.delenv(key, raising=False)

    def refused(*args, **kwargs):
        assert os.environ.get("OMP_NUM_THREADS") == "1"  # the cluster's workers are up: the nannies set it
        raise OSError("no client today")

    monkeypatch.setattr(distributed, "Client", refused)
    try:
        run_sweep(from_dict(tiny({"train.seed": [0]})), str(tmp_path / "s.zarr"), workers=1, progress=False)
    except OSError as e:
        assert "no client today" in str(e)
    else:
        raise AssertionError("the sweep ran without a client")
    assert {k: os.environ.get(k) for k in keys} == dict.fromkeys(keys)
