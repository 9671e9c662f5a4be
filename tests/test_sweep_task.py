"""The Dask task (dynamics.sweep.task): what run_point returns for a point it cannot train."""

import contextlib

import pytest

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


def test_a_failure_the_store_could_not_record_says_so(tmpfs, monkeypatch):
    # A disk that filled up mid-sweep: neither train_run nor the task could record the failure, so
    # the run stayed marked running (`dynamics status`: stopped) while the sweep's summary said
    # "failed" as of a run holding its traceback; `dynamics run` says which it is, and now so does it.
    from dynamics import train
    from dynamics.sweep.task import _failure_recorded

    fs = tmpfs("64m")
    cfg = from_dict(tiny(train={"steps": 60}, record={"every": 5}))
    path, run_id = str(fs / "s.zarr"), cfg.run_id()
    store.init_store(path)
    fill = fs / "fill"
    save_checkpoint = train._save_checkpoint

    # The disk fills up while the run trains, between two of its writes: filled from a thread
    # of the test's own, it raced the writer, whose half-written file, deleted as its write
    # failed, made room for the failure's record (CI, stop 39). On the writer's own thread,
    # right after a checkpoint, nothing is half-written and every later write finds no room.
    def fill_after_checkpoint(at, rid, state, writer, step, *rest) -> None:
        save_checkpoint(at, rid, state, writer, step, *rest)
        if step >= 10 and not fill.exists():
            with contextlib.suppress(OSError), open(fill, "wb") as f:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()

    monkeypatch.setattr(train, "_save_checkpoint", fill_after_checkpoint)
    out = run_point(cfg, path, run_id, {})
    monkeypatch.undo()
    assert out["status"] == "failed" and "No space left on device" in out["error"], out
    assert store.run_attrs(path, run_id)["status"] == "running"  # nothing could be written
    assert out["error"].endswith(" (its traceback could not be recorded in the store)")

    fill.unlink()  # room again: the same point resumes, and a failure it records is not said unrecorded
    again = run_point(cfg, path, run_id, {})
    assert again["status"] == "completed", again
    store.update_run_attrs(path, run_id, traceback="Traceback ...\nOSError: [Errno 28] No space left on device")
    assert _failure_recorded(path, run_id, OSError(28, "No space left on device"))
    assert not _failure_recorded(path, "rnotthere", OSError(28, "No space left on device"))


def test_a_point_refused_for_its_remade_teacher_is_not_marked_failed(tmp_path):
    # A resume refused because the checkpoint names another teacher run is a ConfigError, as
    # `dynamics run` refuses it: the task marked the interrupted student failed, with a traceback.
    import shutil

    from dynamics.train import train_run
    from tests.conftest import interrupt_at

    teacher = str(tmp_path / "t.zarr")
    train_run(from_dict(tiny()), teacher)
    raw = tiny(train={"seed": 1, "steps": 40}, record={"every": 10})
    raw["intervene"] = {"distill": {"teacher": teacher}}
    cfg, path = from_dict(raw), str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(20))
    shutil.rmtree(teacher)
    train_run(from_dict(tiny(train={"seed": 2})), teacher)
    out = run_point(cfg, path, cfg.run_id(), {})
    assert out["status"] == "failed" and "refusing to resume with another teacher" in out["error"]
    attrs = store.run_attrs(path, cfg.run_id())
    assert attrs["status"] == "interrupted" and not attrs.get("traceback")
