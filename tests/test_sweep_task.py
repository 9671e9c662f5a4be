"""The Dask task (dynamics.sweep.task): what run_point returns for a point it cannot train."""

from dynamics import store
from dynamics.config import from_dict
from dynamics.sweep import run_point
from tests.test_sweep import tiny


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
