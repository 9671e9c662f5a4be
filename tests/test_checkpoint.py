import io
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dynamics import store
from dynamics.checkpoint import checkpoint_bytes, checkpoint_state, copy_tensors, load_checkpoint, load_run_model
from dynamics.config import ConfigError, load_config
from dynamics.record import Recorder
from dynamics.store import StoreError
from dynamics.store.writer import RunWriter
from dynamics.tasks import make_batch
from dynamics.train import build, make_optimizer, train_run
from tests.conftest import TINY


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text(TINY.format(steps=6, every=2))
    return load_config(p)


def test_a_checkpoint_is_the_state_when_taken_though_serialised_after_more_steps(cfg):
    # The writer thread pickles the checkpoint while training goes on; the next optimiser step
    # updates parameters and Adam moments in place, which must not leak into it.
    model = build(cfg, torch.device("cpu"))
    opt = make_optimizer(cfg, model)
    recorder = Recorder(cfg, torch.device("cpu"))

    def step(s):
        tokens = torch.from_numpy(make_batch(cfg, "train", s, cfg.train.batch_size).tokens)  # (B, T+1)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
        opt.step()

    step(0)
    at_once = checkpoint_bytes(checkpoint_state(model, opt, 1, recorder.prev_grads, None))
    state = checkpoint_state(model, opt, 1, recorder.prev_grads, None)
    step(1)
    later = checkpoint_bytes(state)
    a, b = (torch.load(io.BytesIO(x), weights_only=False) for x in (at_once, later))
    for name, p in model.state_dict().items():
        torch.testing.assert_close(b["model"][name], a["model"][name], rtol=0, atol=0)
        assert not torch.equal(p, a["model"][name]) or "gate" in name  # step(1) did move it
    for i, s in a["optimizer"]["state"].items():
        for k, v in s.items():
            torch.testing.assert_close(b["optimizer"]["state"][i][k], v, rtol=0, atol=0)


def test_a_checkpoint_is_the_same_bytes_whatever_torchs_global_generator_holds(cfg):
    # It held torch.get_rng_state(), which torch seeds at random in each process: the same run's
    # checkpoint differed from one process to the next, against README's "bitwise the same
    # arrays and checkpoint on CPU". Drawing from the global generator stands in for that here.

    model = build(cfg, torch.device("cpu"))
    opt = make_optimizer(cfg, model)
    recorder = Recorder(cfg, torch.device("cpu"))

    def blob() -> bytes:
        return checkpoint_bytes(checkpoint_state(model, opt, 0, recorder.prev_grads, None))

    first = blob()
    torch.manual_seed(1234)
    torch.rand(3)
    assert blob() == first


def test_load_run_model_names_the_runs_to_choose_from_not_a_command_line_flag(tmp_path):
    # An empty store said "holds 0 runs; choose one with --run ()" to a Python caller.
    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    with pytest.raises(store.StoreError, match=r"^no runs in "):
        load_run_model(path)
    for run_id in ("r1", "r2"):
        RunWriter(path, run_id, variables={}, coords={}, attrs={"status": "completed"})
    with pytest.raises(store.StoreError, match=r"holds 2 runs; pass run_id, one of: r1, r2$"):
        load_run_model(path)
    with pytest.raises(store.StoreError, match=r"^no run 'r3' in .*; runs: r1, r2$"):
        load_run_model(path, "r3")


def test_loading_a_runs_model_leaves_the_callers_random_stream_alone(cfg, tmp_path):
    # The model was built from torch's global generator before its weights were overwritten:
    # a notebook's seeded draws after load_run_model came out different from the same draws without it.
    path = str(tmp_path / "s.zarr")
    train_run(cfg, path)
    torch.manual_seed(0)
    want = torch.rand(4)
    torch.manual_seed(0)
    model, _, step = load_run_model(path)
    assert torch.equal(torch.rand(4), want)
    assert step == cfg.train.steps and not model.training
    # built under a float64 default, it came back a float64 model, not the run's float32 one
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(RuntimeError, match="torch's default dtype is torch.float64"):
            load_run_model(path)
    finally:
        torch.set_default_dtype(torch.float32)


def test_loading_a_run_trained_through_forward_hooks_needs_bare(tmp_path):
    # A hard template replaced head (0, 0)'s attention through a hook the checkpoint does not hold:
    # the loaded weights gave another loss than the trained network, without a word.
    p = tmp_path / "hard.toml"
    p.write_text(TINY.format(steps=6, every=2) + '\n[intervene.templates]\nhard = true\n'
                 'heads = [{ layer = 0, head = 0, pattern = "uniform" }]\n')
    cfg = load_config(p)
    path = str(tmp_path / "s.zarr")
    run_id = train_run(cfg, path).run_id
    with pytest.raises(ConfigError, match=rf"run {run_id} in .* was trained with hard templates \(intervene\).*"
                                          r"pass bare=True"):
        load_run_model(path)
    model, got, step = load_run_model(path, bare=True)
    assert got == cfg and step == cfg.train.steps


def _flip_a_weight_byte(ckpt) -> None:
    """Flip one byte in the middle of the checkpoint's largest tensor, as a disk error would:
    the zip stays readable, only that member's CRC no longer matches."""
    import zipfile

    blob = bytearray(ckpt.read_bytes())
    with zipfile.ZipFile(ckpt) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    name_len, extra_len = int.from_bytes(blob[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(blob[info.header_offset + 28:info.header_offset + 30], "little")
    blob[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0xFF
    ckpt.write_bytes(bytes(blob))


def _flip_the_encrypted_flag(ckpt) -> None:
    """Set bit 0 (encrypted) of the first central-directory entry's flags: one flipped bit, after
    which zipfile refuses to read the member (RuntimeError), while torch's own reader may not care."""
    blob = bytearray(ckpt.read_bytes())
    at = blob.index(b"PK\x01\x02")
    blob[at + 8] |= 0x01
    ckpt.write_bytes(bytes(blob))


def _interrupted_run(tmp_path, steps: int):
    """A tiny run stopped at step 12, its checkpoint at step 10: (toml, cfg, store, checkpoint file)."""
    from pathlib import Path

    from tests.conftest import interrupt_at

    toml = tmp_path / "t.toml"
    toml.write_text(TINY.format(steps=steps, every=10))
    cfg, path = load_config(toml), str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12))
    return toml, cfg, path, Path(path, "checkpoints", cfg.run_id(), "ckpt.pt")


def _another_models_state(ckpt, what: str) -> None:
    """Rewrite the checkpoint whole (so every CRC holds) with a state that does not fit the run:
    a weight of another shape, a key lost, or the optimiser state of a model with fewer tensors."""
    state = torch.load(ckpt, weights_only=False)
    if what == "other_shape":  # as if copied in from a run of another width
        state["model"]["ln_final.weight"] = torch.ones(3)
    elif what == "no_model":
        del state["model"]
    else:
        state["optimizer"]["param_groups"][0]["params"] = state["optimizer"]["param_groups"][0]["params"][:2]
    ckpt.write_bytes(checkpoint_bytes(state))


@pytest.mark.parametrize("damage", ["truncated", "empty", "folder", "bitflip", "encrypted",
                                    "other_shape", "no_model", "other_optimizer"])
def test_a_damaged_checkpoint_is_refused_in_one_line_and_nothing_is_written(tmp_path, damage):
    # torch's unpickler raised from deep inside: `dynamics run` recorded the run as failed (its
    # status and traceback rewritten) and `dynamics gates` printed 25 lines, naming no file.
    # A flipped byte in a weight torch loaded without a word: the resume trained on from wrong
    # weights, and the run ended "completed" with other arrays than an uninterrupted run's
    from pathlib import Path

    from tests.conftest import cli_in_process

    toml, cfg, path, ckpt = _interrupted_run(tmp_path, steps=40)
    if damage == "folder":  # an IsADirectoryError traceback from gates
        ckpt.unlink()
        ckpt.mkdir()
    elif damage == "bitflip":
        _flip_a_weight_byte(ckpt)
    elif damage == "encrypted":
        _flip_the_encrypted_flag(ckpt)
    elif damage in ("other_shape", "no_model", "other_optimizer"):
        # a traceback from load_state_dict in gates; a resume recorded the run as failed
        _another_models_state(ckpt, damage)
    else:
        ckpt.write_bytes(ckpt.read_bytes()[:100] if damage == "truncated" else b"")
    Path(path, "checkpoints", cfg.run_id(), "train.lock").write_text('{"pid": 1, "host": "earlier"}')
    before = {str(p): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}
    misfit = {"other_shape": "size mismatch for ln_final.weight", "no_model": "it holds no 'model'",
              "other_optimizer": "parameter group"}.get(damage)
    # gates loads the model alone: an optimiser state of another model does not stop it
    gates = [] if damage == "other_optimizer" else [["gates", path, "--steps", "2", "--init-steps", "1"]]
    for args in [["run", toml, "--out", path], *gates]:
        done = cli_in_process(*args)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith(f"dynamics: error: run {cfg.run_id()}'s checkpoint in {path} is damaged (")
        assert ("fails its CRC check" in line) == (damage == "bitflip")  # torch.load names the others
        if misfit:
            assert "(it does not fit the run's model: " in line and misfit in line, line
        assert line.endswith("its recorded arrays are untouched")
    after = {str(p): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}
    if damage == "other_optimizer":  # found under the run's lock, as it is loaded: the lock names its latest holder
        lock = str(Path(path, "checkpoints", cfg.run_id(), "train.lock"))
        assert json.loads(after.pop(lock))["pid"] != 1 and before.pop(lock)
    assert after == before
    assert store.run_attrs(path, cfg.run_id())["status"] == "interrupted"
    if damage != "other_optimizer":
        with pytest.raises(store.StoreError, match="checkpoint in .* is damaged"):
            load_run_model(path, cfg.run_id())


def _interrupted(tmp_path):
    """(toml, cfg, store path) of a tiny run of 40 steps stopped by Ctrl-C at step 22, checkpointed."""
    from tests.conftest import interrupt_at

    toml = tmp_path / "t.toml"
    toml.write_text(TINY.format(steps=40, every=10))
    cfg, path = load_config(toml), str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(22))
    return toml, cfg, path


def test_a_run_whose_checkpoint_is_lost_is_not_trained_again_over_its_snapshots(tmp_path):
    # With ckpt.pt deleted (to save space, or left out of a copy), the same command started the
    # run again at step 0 and wrote over the snapshots it had recorded, while status still said
    # it resumes at its last checkpoint.
    from pathlib import Path

    from tests.conftest import cli_in_process

    toml, cfg, path = _interrupted(tmp_path)
    step = store.run_attrs(path, cfg.run_id())["checkpoint_step"]
    assert step > 0
    Path(path, "checkpoints", cfg.run_id(), "ckpt.pt").unlink()
    before = {str(p): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}
    done = cli_in_process("run", toml, "--out", path)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line == (f"dynamics: error: run {cfg.run_id()} in {path} recorded training up to step {step}, but its "
                    f"checkpoint (checkpoints/{cfg.run_id()}/ckpt.pt) is missing; refusing to train it again from "
                    f"step 0 over its recorded snapshots (train it into another store to start it afresh)")
    assert {str(p): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()} == before


def test_a_checkpoint_whose_run_group_is_gone_is_named_and_not_written_over(tmp_path):
    # runs/<id> deleted, checkpoints/<id> left: status showed an empty table (exit 0), and `run`
    # and `sweep` trained the run again from step 0 over that checkpoint (found by an audit helper)
    import shutil
    from pathlib import Path

    from tests.conftest import cli_in_process

    toml, cfg, path = _interrupted(tmp_path)
    rid = cfg.run_id()
    shutil.rmtree(Path(path, "runs", rid))
    before = {str(p): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}
    line = (f"run {rid} in {path} has a checkpoint (checkpoints/{rid}/ckpt.pt) but no run group (runs/{rid} is gone, "
            f"and what it recorded with it); refusing to train it again over that checkpoint: restore runs/{rid}, "
            f"or move checkpoints/{rid} out of the store to start afresh")
    swept = tmp_path / "sweep.toml"
    swept.write_text(toml.read_text() + '\n[sweep]\n"train.seed" = [0, 1]\n')
    for args, said in ((("run", toml, "--out", path), line),
                       (("sweep", swept, "--out", path, "--workers", "1"), f"sweep point train.seed=0: {line}")):
        done = cli_in_process(*args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [f"dynamics: error: {said}"]
    assert {str(p): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()} == before
    shown = cli_in_process("status", path)
    assert shown.returncode == 1 and line in shown.stderr, shown.stderr
    assert any(row.split()[:2] == [rid, "damaged"] for row in shown.stdout.splitlines()), shown.stdout


class _Code:
    """Not plain weights: a weights_only load refuses what a full load would run."""


def test_checkpoint_step_reads_plain_weights_only_and_no_torch(tmp_path, cfg, monkeypatch):
    import subprocess
    import sys

    from dynamics.store import checkpoint_step, checkpoints

    # opened, never read whole: only the zip's directory and the pickle are fetched
    monkeypatch.setattr(checkpoints, "read_checkpoint", lambda *a: pytest.fail("read whole"))

    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    assert checkpoint_step(path, "r1") is None  # none
    store.write_checkpoint(path, "r1", checkpoint_bytes({"step": 7, "model": {"w": torch.ones(2)}}))
    assert checkpoint_step(path, "r1") == 7
    model = build(cfg, torch.device("cpu"))
    state = checkpoint_state(model, make_optimizer(cfg, model), 5, None, None)  # what training writes
    store.write_checkpoint(path, "r1", checkpoint_bytes(state))
    assert checkpoint_step(path, "r1") == 5
    # status reads it without torch, whose import costs seconds (and could run a pickle's code)
    probe = (f"import sys; from dynamics.store import checkpoint_step; print(checkpoint_step({path!r}, 'r1'), "
             f"'torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout == "5 False\n"
    url = f"memory://{tmp_path.name}/s.zarr"  # through fsspec, as a URL store is
    store.init_store(url)
    store.write_checkpoint(url, "r1", checkpoint_bytes(state))
    assert checkpoint_step(url, "r1") == 5 and checkpoint_step(url, "r2") is None
    store.write_checkpoint(path, "r1", checkpoint_bytes({"step": 9, "extra": _Code()}))
    assert checkpoint_step(path, "r1") is None
    store.write_checkpoint(path, "r1", b"not a checkpoint")
    assert checkpoint_step(path, "r1") is None


def test_a_checkpoint_saved_without_crcs_still_resumes(tmp_path):
    # torch writes CRC 0 for every member when its (thread-local) serialization.config.save.
    # compute_crc32 is off: no mismatch, and such a checkpoint must resume, not be refused. The
    # run's own are saved on its writer thread, so the test saves the same state again that way.
    import io
    import zipfile

    import torch.utils.serialization as serialization

    from tests.conftest import assert_same_run_arrays

    _, cfg, path, ckpt = _interrupted_run(tmp_path, steps=30)
    state = torch.load(io.BytesIO(ckpt.read_bytes()), map_location="cpu", weights_only=False)
    # set and put back by hand: pytest 9.2's monkeypatch undoes it by deleting the setting (torch's
    # config proxy shows it to no static lookup), and every later torch.save of the process failed
    saved = serialization.config.save.compute_crc32
    serialization.config.save.compute_crc32 = False
    try:
        buf = io.BytesIO()
        torch.save(state, buf)
    finally:
        serialization.config.save.compute_crc32 = saved
    ckpt.write_bytes(buf.getvalue())
    with zipfile.ZipFile(ckpt) as z:
        assert all(i.CRC == 0 for i in z.infolist())
    assert train_run(cfg, path).status == "completed"
    ref = str(tmp_path / "ref.zarr")
    train_run(cfg, ref)
    assert_same_run_arrays(path, ref)


def test_a_checkpoint_copy_shares_no_array_with_what_training_goes_on_updating():
    # the recorder's previous gradients are numpy arrays, updated in place like the weights
    grads, weight = np.zeros(3), torch.zeros(2)
    state = copy_tensors({"prev_grads": (grads, [weight])})
    grads += 1
    weight += 1
    assert isinstance(state["prev_grads"], tuple) and isinstance(state["prev_grads"][1], list)
    assert not state["prev_grads"][0].any() and not state["prev_grads"][1][0].any()


def test_a_checkpoint_that_holds_no_training_state_is_refused_in_one_line(tmp_path):
    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    store.write_checkpoint(path, "r1", checkpoint_bytes({"model": {}}))
    with pytest.raises(store.StoreError, match=r"^run r1's checkpoint in .* is damaged \(it loads, but holds no "
                                               r"training state\); its recorded arrays are untouched$"):
        load_checkpoint(path, "r1")


class _Marks:
    """An object whose unpickling creates a file: what a crafted checkpoint could run instead."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (_touch, (self.marker,))


def _touch(path: str) -> None:
    open(path, "w").close()


def test_a_checkpoint_that_would_run_code_is_refused_and_its_code_never_runs(tmp_path, cfg):
    # torch.load(weights_only=False): a store from elsewhere (a colleague's, a paper's) ran its
    # checkpoint's code in `dynamics gates`, a resume, load_run_model and a distill teacher check
    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    marker = tmp_path / "ran"
    model = build(cfg, torch.device("cpu"))
    state = checkpoint_state(model, make_optimizer(cfg, model), 5, None, None)
    store.write_checkpoint(path, "r1", checkpoint_bytes({**state, "extra": _Marks(str(marker))}))
    with pytest.raises(store.StoreError, match=r"^run r1's checkpoint in .* is damaged \(\d[\d,]* bytes that torch "
                                               r"cannot load: "):
        load_checkpoint(path, "r1")
    assert not marker.exists()
    torch.load(io.BytesIO(store.read_checkpoint(path, "r1")), weights_only=False)  # the payload is real
    assert marker.exists()
    store.write_checkpoint(path, "r1", checkpoint_bytes(state))  # what training writes loads as it is
    assert load_checkpoint(path, "r1")["step"] == 5


def test_a_checkpoint_holds_the_interventions_state_as_taken(tmp_path):
    # conditioned gates train weights of their own: a resume without them starts the gates afresh
    from dynamics import interventions

    p = tmp_path / "gated.toml"
    p.write_text(TINY.format(steps=6, every=2) + "\n[intervene.conditioned_gates]\n")
    cfg = load_config(p)
    model = build(cfg, torch.device("cpu"))
    iv = interventions.build(cfg, model, torch.device("cpu"))
    state = checkpoint_state(model, make_optimizer(cfg, model, iv.parameters()), 3, None, iv)
    want = iv.state_dict()
    assert list(state["intervention"]) == list(want) == ["conditioned_gates"]
    for k, v in want["conditioned_gates"].items():
        assert torch.equal(state["intervention"]["conditioned_gates"][k], v), k


def test_a_sweep_whose_run_fails_exits_1_naming_it_failed(tmp_path):
    # README: a run that raises is recorded failed, the sweep goes on, and it exits non-zero (a
    # damaged checkpoint is such a run in a sweep: `run` refuses it up front, exit 2)
    from tests.conftest import cli_in_process

    toml, cfg, path, ckpt = _interrupted_run(tmp_path, steps=40)
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    done = cli_in_process("sweep", toml, "--out", path, "--workers", "1")
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("sweep: 1 run: 1 failed in "), done.stdout
    assert f"[sweep] {cfg.run_id()} failed: StoreError: run {cfg.run_id()}'s checkpoint in {path} is damaged (" \
        in done.stderr, done.stderr


def test_batch_loss_is_the_next_token_cross_entropy():
    # checkpoint.batch_loss: predictions at position t are scored against token t + 1; scored
    # against the inputs themselves (`tokens[:, :-1]`, mutant K8) it was still finite, so
    # `dynamics gates`' finiteness check could not tell
    import torch

    from dynamics.checkpoint import batch_loss
    from dynamics.config import RunConfig
    from dynamics.model import Transformer
    from dynamics.tasks import make_batch

    cfg = RunConfig()
    model = Transformer(cfg.model, generator=torch.Generator().manual_seed(0))
    tokens = torch.from_numpy(make_batch(cfg, "train", 0, 8).tokens)  # (8, T + 1)
    with torch.no_grad():
        logp = model(tokens[:, :-1]).log_softmax(-1)  # (8, T, V)
    nll = -np.take_along_axis(logp.numpy(), tokens[:, 1:].numpy()[..., None], axis=-1).mean()
    assert batch_loss(model, cfg) == pytest.approx(float(nll), rel=1e-5)


def test_a_checkpoint_that_does_not_fit_names_the_first_cause(tmp_path):
    # checkpoint.fitting: torch lists the causes under "Error(s) in loading state_dict for X:";
    # the first is named (missing keys here), not the last (mutant K22: the unexpected one)
    import torch

    from dynamics.checkpoint import fitting
    from dynamics.config import RunConfig
    from dynamics.model import Transformer

    model = Transformer(RunConfig().model, generator=torch.Generator())
    state = dict(model.state_dict())
    missing = sorted(state)[0]
    del state[missing]
    state["extra.weight"] = torch.zeros(1)
    with pytest.raises(StoreError, match=r"^run r1's checkpoint in p is damaged \(it does not fit the run's model: "
                                         r"Missing key\(s\) in state_dict: "), fitting("p", "r1"):
        model.load_state_dict(state)
