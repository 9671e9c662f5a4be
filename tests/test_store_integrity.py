"""check_recorded: which lost chunks of a finished run it names, and which absent ones are no loss;
unreadable_chunk: a chunk cut short, named with its run and array."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from dynamics import store
from dynamics.store import StoreError
from tests.test_store import P, T, spec, write_run

pytestmark = pytest.mark.filterwarnings("error")

N_SNAP, HEADS = 3, 2


def recorded(path, attrs, *, steps=10, n_snap=N_SNAP, cosine_at=None, earlier=False):
    """A finished run of `n_snap` snapshots (steps 0, 5, 10, ...) and `steps` train steps, every
    value written; ``grad_cosine`` finite only at the snapshots `cosine_at` (default all but the
    first, which has no previous gradient), NaN elsewhere. `earlier`: marked as a run from before
    the writer stored every chunk (zarr kept no all-NaN chunk then: none for those NaN cosines)."""
    variables = {
        "gate": (("snapshot", "head"), (n_snap, HEADS), "float32"),
        "grad_norm": (("snapshot", "head"), (n_snap, HEADS), "float32"),
        "grad_cosine": (("snapshot", "head"), (n_snap, HEADS), "float32"),
        "loss": (("train_step",), (steps,), "float32"),
    }
    coords = {"step": ("snapshot", np.arange(n_snap) * 5), "head": ("head", np.arange(HEADS) + 1)}
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs=attrs)
    cosine_at = range(1, n_snap) if cosine_at is None else cosine_at
    for i in range(n_snap):
        w.write_snapshot(i, {"gate": np.ones(HEADS), "grad_norm": np.ones(HEADS)})
        if i in cosine_at or not earlier:
            w.write_snapshot(i, {"grad_cosine": np.ones(HEADS) if i in cosine_at else np.full(HEADS, np.nan)})
    w.write_region("loss", 0, np.ones(steps, np.float32))
    if earlier:
        store.update_run_attrs(path, "r1", empty_chunks_written=False)
    return path / "runs" / "r1"


def test_a_lost_loss_chunk_of_a_diverged_run_is_named_with_the_steps_it_held(tmp_path):
    # diverged at step 5: the first loss chunk (steps 0..9) holds steps it trained, so it is checked
    run = recorded(tmp_path / "s.zarr", {"status": "diverged", "diverged_step": 5})
    store.check_recorded(tmp_path / "s.zarr")
    (run / "loss" / "c" / "0").unlink()
    with pytest.raises(StoreError, match=r"run r1: array loss at train steps 0..9: its chunk runs/r1/loss/c/0 is "
                                         r"missing, though the run wrote it"):
        store.check_recorded(tmp_path / "s.zarr")


def test_the_last_loss_chunk_is_named_with_the_steps_the_run_has(tmp_path):
    # 5000 steps in chunks of 4096: the last chunk holds steps 4096..4999, not ..8191
    run = recorded(tmp_path / "s.zarr", {"status": "completed"}, steps=5000)
    (run / "loss" / "c" / "1").unlink()
    with pytest.raises(StoreError, match=r"array loss at train steps 4096..4999: its chunk runs/r1/loss/c/1 is"):
        store.check_recorded(tmp_path / "s.zarr")


def test_a_diverged_run_that_names_no_diverging_step_is_not_checked(tmp_path):
    # which snapshots it recorded is unknown: none is named lost, and nothing fails
    run = recorded(tmp_path / "s.zarr", {"status": "diverged"})
    (run / "gate" / "c" / "2" / "0").unlink()
    store.check_recorded(tmp_path / "s.zarr")


def test_a_nan_gradient_at_an_earlier_runs_last_snapshot_is_no_loss_but_a_lost_file_is(tmp_path):
    # grad_norm's chunk at a completed run's last snapshot is absent when the gradient there was
    # NaN; grad_cosine's chunk there tells: absent too (NaN), or present (a finite gradient).
    path = tmp_path / "s.zarr"
    run = recorded(path, {"status": "completed"}, cosine_at=[1], earlier=True)  # NaN gradient at snapshot 2
    (run / "grad_norm" / "c" / "2" / "0").unlink()
    store.check_recorded(path)
    (run / "grad_norm" / "c" / "1" / "0").unlink()  # not the last snapshot: lost
    with pytest.raises(StoreError, match=r"array grad_norm at snapshot 1 \(step 5\): its chunk runs/r1/grad_norm/c/1/0 "
                                         r"is missing"):
        store.check_recorded(path)


def test_a_lost_gradient_chunk_at_the_last_snapshot_is_named_where_the_gradient_was_finite(tmp_path):
    path = tmp_path / "s.zarr"
    run = recorded(path, {"status": "completed"}, earlier=True)  # grad_cosine written at snapshot 2
    (run / "grad_norm" / "c" / "2" / "0").unlink()
    with pytest.raises(StoreError, match=r"array grad_norm at snapshot 2 \(step 10\): .* is missing"):
        store.check_recorded(path)


def test_a_run_of_one_snapshot_has_no_cosine_to_excuse_a_lost_gradient_chunk(tmp_path):
    # grad_cosine is NaN at a run's first snapshot whatever the gradient: with one snapshot its
    # absence says nothing, and the lost grad_norm chunk is named
    path = tmp_path / "s.zarr"
    run = recorded(path, {"status": "completed"}, n_snap=1, earlier=True)
    (run / "grad_norm" / "c" / "0" / "0").unlink()
    with pytest.raises(StoreError, match=r"array grad_norm at snapshot 0 \(step 0\): .* is missing"):
        store.check_recorded(path)


def test_a_run_that_stored_every_chunk_has_its_lost_gradient_chunk_named_whatever_its_cosine(tmp_path):
    # this writer stores a NaN gradient's chunk too: an absent one was lost, with or without grad_cosine's
    path = tmp_path / "s.zarr"
    run = recorded(path, {"status": "completed"}, cosine_at=[1])
    (run / "grad_norm" / "c" / "2" / "0").unlink()
    with pytest.raises(StoreError, match=r"array grad_norm at snapshot 2 \(step 10\): .* is missing"):
        store.check_recorded(path)


def test_a_run_that_stored_every_chunk_has_a_lost_chunk_of_any_snapshot_array_named(tmp_path):
    # Only attention, gradients, gate, eval loss and weights were checked: a lost chunk of
    # grad_cosine, CHG or an intervention's arrays (template_kl, conditioned_gate, ...) read as
    # NaN (distill_source as -1, "no teacher head") without a word, though this writer stores them all.
    path = tmp_path / "s.zarr"
    run = recorded(path, {"status": "completed"})
    store.check_recorded(path)
    (run / "grad_cosine" / "c" / "0" / "0").unlink()  # the first snapshot's, all NaN
    with pytest.raises(StoreError, match=r"array grad_cosine at snapshot 0 \(step 0\): .* is missing"):
        store.check_recorded(path)
    # from an earlier writer, which stored no all-NaN chunk, an absent one is no evidence
    run = recorded(tmp_path / "e.zarr", {"status": "completed"}, earlier=True)
    store.check_recorded(tmp_path / "e.zarr")
    (run / "grad_cosine" / "c" / "1" / "0").unlink()
    store.check_recorded(tmp_path / "e.zarr")


def test_a_lost_chunk_of_an_analysis_or_derived_group_is_named_not_read_as_its_fill_value(tmp_path):
    # A lost `role` chunk of a stored analysis read as role 0 (previous_token) for every head, and
    # `dynamics predict` took that as the runs' final roles
    import xarray as xr

    path = tmp_path / "s.zarr"
    recorded(path, {"status": "completed"})
    ds = xr.Dataset({"role": (("layer", "head"), np.array([[3, 4]], np.int8)),
                     "step": ((), 10), "never": (("head",), np.full(2, np.nan))})  # all fill: stored all the same
    store.write_analysis(path, "r1", ds)
    store.write_derived(path, "curve", ds)
    assert int(store.open_analysis(path, "r1", stale="allow")["step"]) == 10
    for group, opened in (("analysis/r1", lambda: store.open_analysis(path, "r1", stale="allow")),
                          ("derived/curve", lambda: store.open_derived(path, "curve"))):
        for name, chunk in (("never", "c/0"), ("role", "c/0/0"), ("step", "c")):
            lost = path / group / name / chunk
            kept = lost.read_bytes()
            lost.unlink()
            if name == "role":  # a stray file beside the lost one does not stand in for it
                (lost.parent / "0.orig").write_bytes(kept)
            with pytest.raises(StoreError, match=f"^{path}: {group}: array {name} has 1 of its 1 chunk\\(s\\) missing, "
                                                 f"though all were written \\(zarr would read them as its fill value\\); "
                                                 f"the command that wrote {group} writes it again$"):
                opened()
            lost.write_bytes(kept)
        opened()
    # a group written before the mark: zarr stored no all-fill chunk then, so one missing may be no loss
    meta = path / "analysis" / "r1" / "zarr.json"
    text = meta.read_text()
    meta.write_text(text.replace('"empty_chunks_written": true', '"other": true'))
    assert '"other": true' in meta.read_text()
    (path / "analysis" / "r1" / "never" / "c" / "0").unlink()
    assert np.isnan(store.open_analysis(path, "r1", stale="allow")["never"].values).all()


def write_whole_run(path, run_id, **kw):
    """`write_run`, and its loss and probe tokens, as a run of `dynamics run` writes them."""
    write_run(path, run_id, **kw)
    variables, coords = spec(kw.get("n_heads", 4))
    w = store.RunWriter(path, run_id, variables=variables, coords=coords, attrs={}, resume=True)
    w.write_region("loss", 0, np.arange(10, dtype=np.float32))
    w.write_region("probe_tokens", 0, np.arange(1, P * (T + 1) + 1).reshape(P, T + 1))


def test_a_chunk_a_finished_run_wrote_that_is_gone_is_named_not_read_as_nan(tmp_path):
    # zarr reads a missing chunk file as the fill value: a deleted snapshot of attention read as NaN
    # (`dynamics analyse` then said "bifurcation never, roles none:4", exit 0), a lost step chunk as step 0.
    path = tmp_path / "s.zarr"
    write_whole_run(path, "r1")
    store.check_recorded(path, "r1")
    run = path / "runs" / "r1"
    (run / "attention" / "c" / "2" / "0" / "0" / "0" / "0" / "0").unlink()
    with pytest.raises(StoreError, match=r"run r1: array attention at snapshot 2 \(step 10\): its chunk "
                                         r"runs/r1/attention/c/2/0/0/0/0/0 is missing, though the run wrote it: "
                                         r"zarr would read it as nan; restore runs/r1"):
        store.check_recorded(path, "r1")
    (run / "step" / "c" / "0").unlink()
    with pytest.raises(StoreError, match=r"array attention at snapshot 2: .* \(and 1 more chunk"):
        store.check_recorded(path, "r1")

    # what a run may leave unwritten is not damage: a run still training, and a diverged run's
    # snapshots from its diverging step on
    store.update_run_attrs(path, "r1", status="running")
    store.check_recorded(path, "r1")
    write_whole_run(path, "div", n_heads=1, attrs={"status": "diverged", "diverged_step": 5})  # steps 0, 5, 10
    # a one-head coordinate [0] is all fill value: written all the same, so its loss is named
    head = path / "runs" / "div" / "head" / "c" / "0"
    assert head.exists()
    head.unlink()
    with pytest.raises(StoreError, match=r"run div: array head: its chunk runs/div/head/c/0 is missing"):
        store.check_recorded(path, "div")
    store.update_run_attrs(path, "div", empty_chunks_written=False)  # as written before: no chunk for [0]
    store.check_recorded(path, "div")
    (path / "runs" / "div" / "gate" / "c" / "1" / "0" / "0").unlink()
    (path / "runs" / "div" / "gate" / "c" / "2" / "0" / "0").unlink()
    store.check_recorded(path, "div")
    (path / "runs" / "div" / "gate" / "c" / "0" / "0" / "0").unlink()
    with pytest.raises(StoreError, match=r"run div: array gate at snapshot 0 \(step 0\)"):
        store.check_recorded(path, "div")


def test_a_lost_probe_is_named_and_a_probe_of_token_0_alone_is_not_a_lost_chunk(tmp_path):
    # A markov chain whose token 0 leads only to itself (vocab_size 4, markov_branching 1, seed 0,
    # n_probe 1) draws a probe of 0s, which zarr stored as no chunk: a lost probe chunk (every role
    # score then computed against token 0) could not be told from it. The writer now stores it.
    path = tmp_path / "s.zarr"
    write_whole_run(path, "r1")
    variables, coords = spec()
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={}, resume=True)
    w.write_region("probe_tokens", 0, np.zeros((P, T + 1), np.int64))
    chunk = path / "runs" / "r1" / "probe_tokens" / "c" / "0" / "0"
    assert chunk.exists()
    store.check_recorded(path, "r1")
    chunk.unlink()
    with pytest.raises(StoreError, match=r"run r1: array probe_tokens: its chunk runs/r1/probe_tokens/c/0/0 is "
                                         r"missing, though the run wrote it: zarr would read it as 0"):
        store.check_recorded(path, "r1")
    # a run from before the writer stored such chunks: its probe of 0s had none, and is not damage
    store.update_run_attrs(path, "r1", empty_chunks_written=False)
    store.check_recorded(path, "r1")


def test_a_chunk_cut_short_is_named_with_its_run_and_array(tmp_path):
    # zarr's own error, "Zstd decompression error: invalid input data", named neither
    path = tmp_path / "s.zarr"
    write_whole_run(path, "r1")
    assert store.unreadable_chunk(path, "r1") is None
    chunk = path / "runs" / "r1" / "grad_norm" / "c" / "1" / "0" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:5])
    e = store.unreadable_chunk(path, "r1")
    assert isinstance(e, StoreError)
    assert f"{path}: run r1: array grad_norm at snapshot 1 (step 5): its chunk runs/r1/grad_norm/c/1/0/0/0 cannot be " \
           f"decoded (damaged: " in str(e) and "\n" not in str(e)


def test_an_array_whose_whole_folder_is_gone_is_named(tmp_path, tiny_config):
    # zarr lists a group's arrays from its folders: one whose folder is gone is not listed, so no
    # chunk of it was checked, and a predictor dropped its grad_norm features for every run unsaid
    from dynamics.config import load_config
    from dynamics.train import train_run

    path = tmp_path / "s.zarr"
    run_id = train_run(load_config(tiny_config(steps=10, every=5)), str(path)).run_id
    store.check_recorded(path, run_id)
    run = path / "runs" / run_id
    shutil.rmtree(run / "grad_norm")
    with pytest.raises(StoreError, match=rf"^{path}: run {run_id}: array grad_norm is missing, though the run wrote "
                                         rf"it: its folder runs/{run_id}/grad_norm is gone; restore runs/{run_id}"):
        store.check_recorded(path, run_id)
    shutil.rmtree(run / "layer")
    with pytest.raises(StoreError, match=rf"run {run_id}: array grad_norm \(and layer\) is missing"):
        store.check_recorded(path, run_id)


def _chunk_of(path, run_id, name, snapshot):
    folder = os.path.join(path, "runs", run_id, name, "c", str(snapshot))
    [hit] = [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]
    return hit


def test_a_changed_byte_is_named_as_a_checksum_mismatch_in_zarrs_own_words(tmp_path):
    # failed_checksum matches zarr's Crc32cCodec message: if it drifted, a flipped byte read as
    # zarr's raw error (both sums' bytes), not the line naming the chunk
    path = str(tmp_path / "s.zarr")
    write_whole_run(path, "r1")
    chunk = _chunk_of(path, "r1", "attention", 1)
    data = bytearray(Path(chunk).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(chunk).write_bytes(bytes(data))
    text = str(store.unreadable_chunk(path, "r1"))
    assert "array attention at snapshot 1 (step 5)" in text and "its CRC32C checksum does not match" in text


def test_a_resume_checks_the_snapshot_at_its_checkpoint_step_too(tmp_path):
    # "the snapshots up to that step": the one at the checkpoint's step is written before it
    path = str(tmp_path / "s.zarr")
    write_whole_run(path, "r1", attrs={"status": "interrupted", "checkpoint_step": 5})  # snapshots at 0, 5, 10
    store.check_recorded(path, "r1", so_far=True)
    os.remove(_chunk_of(path, "r1", "attention", 2))  # after the checkpoint: a resume writes it
    store.check_recorded(path, "r1", so_far=True)
    os.remove(_chunk_of(path, "r1", "attention", 1))
    with pytest.raises(StoreError, match=r"array attention at snapshot 1 \(step 5\)"):
        store.check_recorded(path, "r1", so_far=True)


def test_a_run_checkpointed_at_step_0_has_its_first_snapshot_checked(tmp_path):
    # integrity._checkpointed: `step >= 0` -> `step > 0` left a run interrupted right after its
    # step-0 checkpoint unchecked, its lost snapshot-0 attention read as NaN by the report
    path = str(tmp_path / "s.zarr")
    write_whole_run(path, "r1", attrs={"status": "interrupted", "checkpoint_step": 0})  # snapshots at 0, 5, 10
    os.remove(_chunk_of(path, "r1", "attention", 2))  # after the checkpoint: not yet written, no loss
    store.check_recorded(path, "r1", so_far=True)
    os.remove(_chunk_of(path, "r1", "attention", 0))
    with pytest.raises(StoreError, match=r"array attention at snapshot 0 \(step 0\)"):
        store.check_recorded(path, "r1", so_far=True)


def test_a_diverged_runs_last_kept_snapshot_gets_no_nan_gradient_excuse(tmp_path):
    # integrity._unexplained: only a *completed* run's last snapshot may hold a NaN gradient never
    # written (a diverged run's NaN one is at its diverging step, which is not checked). With the
    # status test widened (`!= "completed"` -> `== "running"`), both files of a diverged run's
    # last kept snapshot going missing went unnamed.
    path = tmp_path / "s.zarr"
    run = recorded(path, {"status": "diverged", "diverged_step": 10}, n_snap=3, earlier=True)  # keeps 0, 5
    store.check_recorded(path)
    (run / "grad_norm" / "c" / "1" / "0").unlink()
    (run / "grad_cosine" / "c" / "1" / "0").unlink()
    with pytest.raises(StoreError, match=r"array grad_norm at snapshot 1 \(step 5\): .* is missing"):
        store.check_recorded(path)


def test_a_lost_step_coordinate_of_an_earlier_run_is_named_as_the_coordinate(tmp_path):
    # integrity: `step` is a coordinate though its dim is `snapshot` (is_coord by name). Mutant
    # `name in (dims[0], "step")` -> `name == dims[0]` skipped it in a run from before
    # EMPTY_CHUNKS_WRITTEN (not a WRITTEN_EVERY_SNAPSHOT variable): every snapshot then read as
    # step 0. And _where's `name != "step"` keeps "at snapshot 0" out of the coordinate's own line.
    path = tmp_path / "s.zarr"
    run = recorded(path, {"status": "completed"}, earlier=True)
    store.check_recorded(path)
    (run / "step" / "c" / "0").unlink()
    with pytest.raises(StoreError, match=r": run r1: array step: its chunk runs/r1/step/c/0 is missing, though the run "
                                         r"wrote it: zarr would read it as 0;"):
        store.check_recorded(path)


def test_a_run_checkpointed_at_step_0_has_no_loss_to_check(tmp_path):
    # integrity: `train_steps` 0 (checkpoint at step 0) means no loss chunk was written before the
    # checkpoint; testing it for truth (`train_steps is not None` -> `train_steps`, mutant I37)
    # checked every loss chunk and named an unwritten one as lost
    path = str(tmp_path / "s.zarr")
    write_whole_run(path, "r1", attrs={"status": "interrupted", "checkpoint_step": 0})
    os.remove(os.path.join(path, "runs", "r1", "loss", "c", "0"))
    store.check_recorded(path, "r1", so_far=True)
