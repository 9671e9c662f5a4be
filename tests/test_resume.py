"""dynamics.resume: what a second start of a recorded run refuses before it writes (another
config under its id, other data, losses or snapshots missing before its checkpoint), leaving
every byte, and what it says of a session on another thread count, CPU kernels or code."""

import subprocess
import sys
from pathlib import Path

import pytest

from dynamics import store
from dynamics.config import load_config, with_values
from dynamics.tasks import data_hash
from dynamics.train import train_run
from tests.conftest import TINY, interrupt_at


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text(TINY.format(steps=30, every=10))
    return load_config(p)


def test_a_finished_run_id_with_another_config_is_refused_not_skipped(cfg, tmp_path):
    path = str(tmp_path / "s.zarr")
    train_run(cfg, path, run_id="mine")
    # naming the setting: "a different config" alone left no way to tell which to --set back
    with pytest.raises(store.StoreError, match=r"recorded with a different config \(train.lr: recorded 0.003, "
                                               r"here 0.001\); refusing to mix them$"):
        train_run(with_values(cfg, {"train.lr": 1e-3}), path, run_id="mine")
    again = train_run(cfg, path, run_id="mine")
    assert again.skipped and again.status == "completed"


def test_a_resume_on_other_data_is_refused_before_writing(cfg, tmp_path):
    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12))
    store.update_run_attrs(path, cfg.run_id(), data_hash="0000aaaa0000")  # as if made from another stdlib
    name_an_earlier_holder(path, cfg.run_id())
    before = tree_bytes(path)
    with pytest.raises(store.StoreError, match="recorded on data with hash 0000aaaa0000"):
        train_run(cfg, path)
    assert tree_bytes(path) == before

    # A store copied while the run trained (runs/ before snapshot step 10 landed, checkpoints/
    # later): a resume from the later checkpoint would never record step 10.
    store.update_run_attrs(path, cfg.run_id(), data_hash=data_hash(cfg))
    steps = store.open_run(path).step.values.tolist()
    for chunk in Path(path, "runs", cfg.run_id(), "importance", "c", str(steps.index(10))).rglob("*"):
        if chunk.is_file():
            chunk.unlink()
    with pytest.raises(store.StoreError, match=r"checkpoint is at step \d+, but the snapshots at steps 10 were never"):
        train_run(cfg, path)
    assert store.run_attrs(path, cfg.run_id())["status"] == "interrupted"


@pytest.mark.parametrize("damage", ["lost", "flipped"])
def test_a_resume_over_a_lost_or_damaged_loss_chunk_is_refused_before_writing(cfg, tmp_path, damage):
    # The resume writes its losses into the chunk holding the checkpoint's step: a lost chunk was
    # written again, NaN over every earlier step, and the run ended "completed" with nothing for
    # check_recorded to name; a damaged one failed the run at its first loss write, naming no chunk.
    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12))
    [chunk] = [p for p in Path(path, "runs", cfg.run_id(), "loss", "c").rglob("*") if p.is_file()]
    if damage == "lost":
        chunk.unlink()
    else:
        blob = bytearray(chunk.read_bytes())
        blob[len(blob) // 2] ^= 0x10
        chunk.write_bytes(bytes(blob))
    runs = tree_bytes(Path(path, "runs"))
    want = "reads as NaN: its chunk .*/loss/c/0 is missing" if damage == "lost" else "loss .*/loss/c/0 cannot be decoded"
    with pytest.raises(store.StoreError, match=want):
        train_run(cfg, path)
    assert tree_bytes(Path(path, "runs")) == runs


def test_a_resume_over_a_lost_attention_chunk_is_refused_before_writing(cfg, tmp_path):
    # Only importance and loss were checked: the run resumed over the hole, ended "completed",
    # and only a later `dynamics analyse` named the chunk.
    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12))
    steps = store.open_run(path).step.values.tolist()
    [chunk] = [p for p in Path(path, "runs", cfg.run_id(), "attention", "c", str(steps.index(10))).rglob("*")
               if p.is_file()]
    chunk.unlink()
    runs = tree_bytes(Path(path, "runs"))
    with pytest.raises(store.StoreError, match=r"array attention at snapshot \d+ \(step 10\): its chunk .* is missing"):
        train_run(cfg, path)
    assert tree_bytes(Path(path, "runs")) == runs


def tree_bytes(path) -> dict:
    return {str(p): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}


def name_an_earlier_holder(path, run_id: str) -> None:
    # a start from this process within the same second would write the same pid and time
    Path(path, "checkpoints", run_id, "train.lock").write_text('{"pid": 1, "host": "earlier"}')


@pytest.mark.parametrize("finished", [True, False])
def test_a_run_id_with_another_config_is_refused_leaving_every_byte(cfg, tmp_path, finished):
    # the lock file's holder line included: a refusal is not a start
    path = str(tmp_path / "s.zarr")
    if finished:
        train_run(cfg, path, run_id="mine")
    else:
        with pytest.raises(KeyboardInterrupt):
            train_run(cfg, path, run_id="mine", progress=interrupt_at(12))
    name_an_earlier_holder(path, "mine")
    before = tree_bytes(path)
    with pytest.raises(store.StoreError, match="recorded with a different config"):
        train_run(with_values(cfg, {"train.lr": 1e-3}), path, run_id="mine")
    assert tree_bytes(path) == before


def test_a_resume_on_another_thread_count_says_so(cfg, tmp_path, capsys):
    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12))
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(22))  # the same command: nothing to say
    assert "note" not in capsys.readouterr().err
    at = store.run_attrs(path, cfg.run_id())["checkpoint_step"]
    try:
        train_run(with_values(cfg, {"train.threads": 2}), path)  # the same run id: an execution key
    finally:
        import torch

        torch.set_num_threads(1)  # train_run set 2 for this process
    err = capsys.readouterr().err
    assert f"{cfg.run_id()} resumes at step {at} with train.threads 1 -> 2" in err
    attrs = store.run_attrs(path, cfg.run_id())
    assert [r["threads"] for r in attrs["resumes"]] == [1, 2] and attrs["status"] == "completed"
    # the first session's thread count: the config was rewritten with the last start's
    assert attrs["config"]["train"]["threads"] == 1


@pytest.mark.parametrize("threads, note", [(2, True), (1, False)])
def test_a_resume_compares_with_the_session_that_trained_its_kept_steps(cfg, tmp_path, capsys, threads, note):
    # A session on 2 threads stopped before its first checkpoint keeps nothing: the next resume's
    # steps before the checkpoint were all trained on 1. Compared with that session instead, a
    # resume on 2 threads said nothing (its steps then differ from an uninterrupted run's), and
    # one on 1 thread said they changed (it is bitwise an uninterrupted run).
    import torch

    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12))  # on 1 thread
    at = store.run_attrs(path, cfg.run_id())["checkpoint_step"]
    try:
        with pytest.raises(KeyboardInterrupt):
            train_run(with_values(cfg, {"train.threads": 2}), path, progress=interrupt_at(12))  # keeps nothing
        capsys.readouterr()
        train_run(with_values(cfg, {"train.threads": threads}), path)
    finally:
        torch.set_num_threads(1)  # train_run set the session's count for this process
    err = capsys.readouterr().err
    assert [r["step"] for r in store.run_attrs(path, cfg.run_id())["resumes"]] == [at, at]  # the second kept none
    assert (f"{cfg.run_id()} resumes at step {at} with train.threads 1 -> 2" in err) == note, err
    assert ("note" in err) == note, err


def test_a_run_records_the_code_that_trains_it_and_a_resume_by_other_code_says_so(cfg, tmp_path, capsys):
    # `version` is one release while the code changes: code_hash tells two checkouts' runs apart
    from dynamics.provenance import code_hash

    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12))
    assert store.run_attrs(path, cfg.run_id())["code_hash"] == code_hash()
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(22))  # the same code: nothing to say
    assert "note" not in capsys.readouterr().err
    at = store.run_attrs(path, cfg.run_id())["checkpoint_step"]
    # the last session's entry is what the resume compares against, not the first start's
    resumes = store.run_attrs(path, cfg.run_id())["resumes"]
    store.update_run_attrs(path, cfg.run_id(), resumes=[{**resumes[0], "code_hash": "ab" * 32}])
    train_run(cfg, path)
    assert capsys.readouterr().err == (
        f"dynamics: note: {cfg.run_id()} resumes at step {at} with other dynamics code than its last session "
        f"(code hash abababababababab... -> {code_hash()[:16]}...); its later steps are that code's "
        f"(recorded in the run's 'resumes')\n")
    attrs = store.run_attrs(path, cfg.run_id())
    assert attrs["code_hash"] == code_hash() and [r["code_hash"] for r in attrs["resumes"]] == ["ab" * 32, code_hash()]


def test_a_resume_on_other_cpu_kernels_says_so_and_records_them(cfg, tmp_path):
    # Another vector instruction set (another machine, or ATEN_CPU_CAPABILITY) rounds differently:
    # measured on the demo, 3 of 96 final roles moved. A run records the kernels it started on, and
    # a resume on others says so, as for threads. Here the resume really runs torch's DEFAULT kernels.
    import os

    import torch

    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12))
    here = torch.backends.cpu.get_cpu_capability()
    assert store.run_attrs(path, cfg.run_id())["cpu_capability"] == here
    if here == "DEFAULT":
        pytest.skip("this CPU has no vector kernels to switch away from")
    toml = tmp_path / "tiny.toml"
    at = store.run_attrs(path, cfg.run_id())["checkpoint_step"]
    r = subprocess.run([sys.executable, "-m", "dynamics", "run", str(toml), "--out", path], capture_output=True,
                       text=True, env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}, cwd=Path(__file__).parents[1])
    assert r.returncode == 0, r.stderr
    assert f"{cfg.run_id()} resumes at step {at} with CPU kernels {here} -> DEFAULT" in r.stderr
    attrs = store.run_attrs(path, cfg.run_id())
    assert attrs["cpu_capability"] == here and [x["cpu_capability"] for x in attrs["resumes"]] == ["DEFAULT"]


def test_a_run_begun_before_the_per_sequence_importance_keeps_the_batch_form_on_resume(cfg, tmp_path):
    # A run's importance is one form throughout: a run begun by code that recorded |dL/dg| of the
    # batch's mean loss (no importance_form attr) goes on recording that when resumed, and a run
    # begun with the per-sequence form resumes into the same arrays as a run never stopped.
    import numpy as np

    whole, old, new = (str(tmp_path / f"{name}.zarr") for name in ("whole", "old", "new"))
    train_run(cfg, whole)
    for path in (old, new):
        with pytest.raises(KeyboardInterrupt):
            train_run(cfg, path, progress=interrupt_at(12))
    at = store.run_attrs(old, cfg.run_id())["checkpoint_step"]
    attrs = store.run_attrs(old, cfg.run_id())
    assert attrs["importance_form"] == "per_sequence"
    store.update_run_attrs(old, cfg.run_id(), importance_form=None)  # as the code before wrote none
    train_run(cfg, old)
    train_run(cfg, new)
    assert store.run_attrs(old, cfg.run_id()).get("importance_form") is None
    assert store.run_attrs(new, cfg.run_id())["importance_form"] == "per_sequence"
    ref, kept, resumed = (store.open_run(p).load() for p in (whole, new, old))
    np.testing.assert_array_equal(kept.importance.values, ref.importance.values)
    before = ref.step.values < at
    np.testing.assert_array_equal(resumed.importance.values[before], ref.importance.values[before])
    # mean |dL(x)/dg| over sequences is at least |the mean's|, and above it where they disagree in sign
    assert (resumed.importance.values[~before] < ref.importance.values[~before]).all()
    for name in ("grad_norm", "attention", "loss"):  # the forms change nothing else
        np.testing.assert_array_equal(resumed[name].values, ref[name].values)
