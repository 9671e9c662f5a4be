"""A run's checkpoint: what a resume needs, its bytes, and the model a finished run holds.

The checkpoint is (model, optimiser, step, the recorder's previous gradients, the
intervention's state), copied on the training thread and pickled on the writer thread
(``train``), which adds the run's steps_trained and wall_time as of it. Loaded on the CPU,
whatever device wrote it.
"""

from __future__ import annotations

import contextlib
import io
import zipfile
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from dynamics import store
from dynamics.config import ConfigError, RunConfig, recorded_config
from dynamics.model import Transformer, require_float32
from dynamics.tasks import make_batch


def copy_tensors(obj):
    """``obj`` with every tensor replaced by a detached clone on the same device (and every
    array by a copy): whatever the next step updates in place must not reach the checkpoint."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, dict):
        return {k: copy_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(copy_tensors(v) for v in obj)
    return obj


def checkpoint_state(model, optimizer, step: int, prev_grads, intervention) -> dict:
    """A copy of everything a resume needs, taken on the training thread.

    Only the copy is paid there: the next optimiser step updates the live tensors in place, so
    they must be cloned now, but pickling them (and, on a GPU, the device-to-host transfers,
    one synchronising copy per tensor) waits for the writer thread. On a GPU the clones are
    asynchronous device copies, so a launch-bound training loop is not held up.
    """
    return copy_tensors({
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "prev_grads": prev_grads,
        "intervention": intervention.state_dict() if intervention is not None else None,
        # Unused (no run draws from torch's global generator), but older versions' resumes restore
        # it. A fixed state, not the process's: torch seeds that at random per process, so the
        # checkpoint of the same run differed from one process to the next.
        "torch_rng": torch.Generator().get_state(),
    })


def checkpoint_bytes(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def load_checkpoint(path: str, run_id: str) -> dict | None:
    """The run's checkpoint dict (the inverse of :func:`checkpoint_bytes`), or None if it has none.

    Raises StoreError naming the run when the file is there but torch cannot read it: it is
    written atomically, so only damage from outside (a truncated copy, a disk error) does that,
    and a traceback from deep in torch's unpickler named neither the run nor the file.
    """
    blob = store.read_checkpoint(path, run_id)
    if blob is None:
        return None
    # torch.load checks no CRC: a byte flipped in a weight (a disk error, a bad copy) loaded
    # without a word, and a resume trained on from weights no step of the run had
    if (member := _crc_mismatch(blob)) is not None:
        raise store.StoreError(f"run {run_id}'s checkpoint in {path} is damaged ({len(blob):,} bytes whose member "
                               f"{member} fails its CRC check); its recorded arrays are untouched")
    try:
        # Loaded on the CPU: load_state_dict copies into tensors already on the device, and the
        # RNG state must stay a CPU ByteTensor for torch.set_rng_state. weights_only: tensors,
        # numbers, strings and containers, all a checkpoint holds; a full unpickle ran whatever
        # code a store from elsewhere put in its checkpoint (gates, a resume, a distill teacher).
        ckpt = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - zip, pickle and EOF errors alike: the bytes are not a checkpoint
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise store.StoreError(f"run {run_id}'s checkpoint in {path} is damaged ({len(blob):,} bytes that torch "
                               f"cannot load: {reason}); its recorded arrays are untouched") from e
    if not isinstance(ckpt, dict) or "step" not in ckpt:
        raise store.StoreError(f"run {run_id}'s checkpoint in {path} is damaged (it loads, but holds no training "
                               f"state); its recorded arrays are untouched")
    return ckpt


@contextlib.contextmanager
def fitting(path: str, run_id: str) -> Iterator[None]:
    """Around loading a checkpoint's states into the run's model (optimiser, intervention): one
    that does not fit them is refused as damage, a StoreError naming the run.

    Only a checkpoint file put there from outside does that (one copied in from another run, whose
    shapes or keys differ): ``dynamics gates`` printed a traceback from deep in torch naming
    neither, and a resume recorded the run as failed, its status rewritten.
    """
    try:
        yield
    except (torch.OutOfMemoryError, ConfigError, store.StoreError):
        # the device's, not the checkpoint's; and refusals already worded (a resume naming another
        # teacher than its checkpoint's), though OutOfMemoryError and ConfigError are RuntimeError and ValueError
        raise
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
        if isinstance(e, KeyError):
            reason = f"it holds no {e.args[0]!r}" if e.args else "a key is missing"
        else:  # load_state_dict's first line is "Error(s) in loading state_dict for X:", the cause below it
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("Error(s) in loading")]
            reason = lines[0] if lines else type(e).__name__
        raise store.StoreError(f"run {run_id}'s checkpoint in {path} is damaged (it does not fit the run's model: "
                               f"{reason}); its recorded arrays are untouched") from e


def check_fits(ckpt: dict, cfg: RunConfig, path: str, run_id: str) -> None:
    """Refuse, as :func:`fitting` does, a checkpoint whose model state does not fit the run's model.

    A resume calls this before it takes the run's lock, as it makes its other refusals: taking
    the lock rewrites the lock file's holder, and a refused command leaves the store as it was.
    """
    model = Transformer(cfg.model, generator=torch.Generator())  # its own generator: see load_run_model
    with fitting(path, run_id):
        model.load_state_dict(ckpt["model"])


def _crc_mismatch(blob: bytes) -> str | None:
    """The first member of a checkpoint's zip whose bytes do not match their stored CRC-32, or None.

    None too where no CRC can be checked, leaving torch.load to name the damage (or load it):
    bytes that are no zip, a directory too damaged to read (a flipped flag bit makes zipfile say
    "encrypted", a flipped method "compressed": RuntimeError, zlib.error, NotImplementedError),
    and members stored with CRC 0, which is what torch writes for every member when its
    (thread-local) ``serialization.config.save.compute_crc32`` is off.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            for info in z.infolist():
                if info.CRC == 0 and info.file_size:
                    continue
                try:
                    with z.open(info) as f:
                        while f.read(1 << 20):
                            pass
                except zipfile.BadZipFile:
                    return info.filename
    except Exception:  # noqa: BLE001 - any other failure to read the zip: torch.load's to report
        return None
    return None


@torch.no_grad()
def batch_loss(model: Transformer, cfg: RunConfig, batch_size: int = 8) -> float:
    """Mean next-token loss of `model` on the first training batch: finite for a usable model."""
    tokens = torch.from_numpy(make_batch(cfg, "train", 0, batch_size).tokens).to(next(model.parameters()).device)
    logits = model(tokens[:, :-1])  # (B, T, V)
    return float(F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()))


def load_run_model(
    path: str, run_id: str | None = None, device: str = "cpu", *, bare: bool = False
) -> tuple[Transformer, RunConfig, int]:
    """The model of a recorded run at its latest checkpoint, with its config and step.

    For a run that has not completed (still training, stopped, interrupted, diverged, failed) that
    is a model part-way through training, loaded without a word: compare the step returned with
    ``cfg.train.steps``, or read ``dynamics.open_run(path, run_id).attrs["status"]`` (``dynamics
    gates`` prints a note on such a run).

    ``run_id`` defaults to the only run of the store. Raises StoreError when the store holds no
    such run (naming the runs it holds) or the run has no checkpoint (nothing to load).

    A run trained with hard templates or conditioned gates (``[intervene]``) computed its forward
    pass through hooks its checkpoint does not hold: the weights alone are another network, and
    every loss, ablation or gate measured on them would be read as the trained model's. Such a
    run raises ConfigError, unless ``bare=True`` asks for its weights alone, knowingly.
    """
    require_float32()  # built under a float64 default, the model came back float64, not the run's float32
    ids = store.list_runs(path, damaged="include")  # a damaged run of them: run_attrs below names it if chosen
    # as open_run says it: "choose one with --run ()" named a command-line flag, and no run, to a caller
    if not ids:
        raise store.StoreError(f"no runs in {path}")
    if run_id is None:
        if len(ids) != 1:
            raise store.StoreError(f"{path} holds {len(ids)} runs; pass run_id, one of: {', '.join(ids)}")
        run_id = ids[0]
    if run_id not in ids:
        raise store.StoreError(f"no run {run_id!r} in {path}; runs: {', '.join(ids)}")
    attrs = store.run_attrs(path, run_id)
    cfg = recorded_config(attrs.get("config"), f"run {run_id} in {path}")
    from dynamics.interventions.common import forward_changes  # here: interventions.distill imports this module

    if (changed := forward_changes(cfg.intervene)) and not bare:
        raise ConfigError(f"run {run_id} in {path} was trained with {' and '.join(changed)} (intervene), which "
                          "act through hooks its checkpoint does not hold; its weights alone are another network "
                          "(pass bare=True to load them anyway)")
    ckpt = load_checkpoint(path, run_id)
    if ckpt is None:
        raise store.StoreError(f"run {run_id} in {path} has no checkpoint to load the model from")
    # A generator of its own: the weights are overwritten, and drawing them from torch's global one
    # moved the caller's random stream
    model = Transformer(cfg.model, generator=torch.Generator()).to(device)
    with fitting(path, run_id):
        model.load_state_dict(ckpt["model"])
    model.eval()
    return model, cfg, int(ckpt["step"])
