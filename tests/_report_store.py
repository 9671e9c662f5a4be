"""The store the report tests share, trained for real, and helpers to write smaller ones.

One session-scoped store holds three tiny runs of an init_scale x seed sweep:

- A: completed, analysed by ``dynamics analyse``, with CHG gates in its ``chg`` variable;
- B: completed, never analysed (the report analyses it in memory), with a derived
  ``gates.<run_id>`` dataset in the schema of ``dynamics.gates.fit_chg`` (3 restarts whose
  majority role differs from the region of their mean gates for head L0H0);
- C: stopped after step 20 and marked ``running`` with nobody holding its training lock, as
  a killed sweep leaves it (6 of 9 snapshots recorded, no analysis);
- P: in the sweep index only (init_scale 4.0): pending, never started;

plus a derived ``predict.slash`` curve in the schema of ``dynamics.predict.predict_runs``.
`build_report` writes it and its report; the session-scoped ``built`` fixture of tests/conftest.py
calls it once per session (per xdist worker) for tests/test_report*.py and
tests/integration/test_report_browser.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from dynamics import cli, store
from dynamics.analysis.pipeline import ANALYSIS_VERSION
from dynamics.report import CHG_LABELS, chg_label, write_report

TINY = {
    "model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16},
    "task": {"name": "induction", "min_period": 2, "max_period": 6},
    "train": {"steps": 40, "batch_size": 8, "warmup_steps": 4, "lr": 1e-2, "eval_batches": 1},
    "record": {"dense_until": 8, "every": 8, "n_probe": 2, "eval_batch_size": 4},
}


STOP_AT = 20  # run C stops here: snapshots 0, 1, 2, 4, 8, 16 of 0..40 are recorded


class _Stop(Exception):
    """Raised from the progress callback to stop a run part-way, as a kill would."""


def _stop_at(step: int, total: int, loss: float) -> None:
    if step >= STOP_AT:
        raise _Stop


def _fill_chg(path: Path, run_id: str, cfg) -> None:
    """Give run A fitted gates at every 4th snapshot, unless training already fitted them.

    The recorder creates ``chg`` when record.chg_every > 0; until gates are fitted during
    training it stays NaN, so the test writes values through the store's run writer.
    """
    from dynamics.record import coords, snapshot_steps, variables

    ds = store.open_run(path, run_id)
    if bool(ds["chg"].notnull().any()):
        return
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    writer = store.RunWriter(path, run_id, variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                             attrs={}, resume=True)
    rng = np.random.default_rng(0)
    L, H = cfg.model.n_layers, cfg.model.n_heads
    for i in range(0, len(steps_at), 4):
        frac = i / (len(steps_at) - 1)  # gates drift apart as training goes on
        chg = np.clip(0.5 + (rng.random((L, H, 2)) - 0.5) * (0.2 + 0.8 * frac), 0, 1).astype(np.float32)
        role = np.array([CHG_LABELS.index(x) for x in chg_label(chg[..., 0], chg[..., 1]).ravel()], np.int8)
        writer.write_snapshot(i, {"chg": chg, "chg_role": role.reshape(L, H)})
    writer.finalize()


def _predict_curve() -> xr.Dataset:
    """A curve in the schema of dynamics.predict.predict_runs (horizon, model, fold)."""
    models = ["chance", "layer", "init_linear", "init_boosting", "linear", "boosting"]
    horizons = np.array([0.0, 0.1, 0.25, 0.5, 1.0])
    rng = np.random.default_rng(1)
    base = 0.5 + 0.4 * horizons[:, None, None] * (np.arange(len(models)) >= 4)[None, :, None]
    score = np.clip(base + rng.normal(0, 0.05, (len(horizons), len(models), 3)), 0, 1)
    return xr.Dataset(
        {"score": (("horizon", "model", "fold"), score),
         "score_mean": (("horizon", "model"), score.mean(-1)),
         "score_std": (("horizon", "model"), score.std(-1))},
        coords={"horizon": horizons, "model": models, "fold": np.arange(3)},
        attrs={"target": "slash", "description": "slash-dominant at the final snapshot", "metric": "auroc",
               "chance": 0.5, "horizon_unit": "fraction", "group_by": "seed", "analysis_version": ANALYSIS_VERSION},
    )


# Three restarts of head L0H0: facilitating, facilitating, interfering. Their mean gates
# (0.6, 0.4) fall in the irrelevant region, while the majority role is facilitating.
SPLIT_HEAD = np.array([[0.9, 0.6], [0.9, 0.6], [0.0, 0.0]], np.float32)


def _gates_dataset(cfg, seed: int = 2) -> xr.Dataset:
    """A CHG fit in the schema of dynamics.gates.fit_chg: chg (restart, layer, head, fit), per-restart
    codes chg_role and their majority role, as `dynamics gates` stores them."""
    L, H = cfg.model.n_layers, cfg.model.n_heads
    g = np.random.default_rng(seed).random((3, L, H, 2)).astype(np.float32)
    g[:, 0, 0] = SPLIT_HEAD
    codes = np.array([CHG_LABELS.index(x) for x in chg_label(g[..., 0], g[..., 1]).ravel()], np.int8).reshape(3, L, H)
    counts = np.stack([(codes == c).sum(0) for c in range(4)])
    return xr.Dataset({"chg": (("restart", "layer", "head", "fit"), g), "chg_role": (("restart", "layer", "head"), codes),
                       "role": (("layer", "head"), counts.argmax(0).astype(np.int8))},
                      coords={"restart": np.arange(3), "layer": np.arange(L), "head": np.arange(H),
                              "fit": ["plus", "minus"]})


def build_report(root: Path) -> tuple[Path, Path, dict]:
    """Train the store described in the module docstring and write its report (once per root).

    Returns (store path, index.html, {"A": run id, "B": ..., "C": ..., "P": ...}).
    """
    from dynamics.config import from_dict, with_values
    from dynamics.train import set_threads, train_run

    path, out, ids_file = root / "store.zarr", root / "report", root / "ids.json"
    if ids_file.exists():  # built earlier in this session
        return path, out / "index.html", json.loads(ids_file.read_text())
    set_threads(1)
    raw = json.loads(json.dumps(TINY))
    points = {"A": (0.5, 0), "B": (2.0, 0), "C": (2.0, 1)}
    ids, index = {}, {"axes": ["model.init_scale", "train.seed"], "runs": {}}
    for name, (scale, seed) in points.items():
        cfg = with_values(from_dict(raw | {"record": raw["record"] | ({"chg_every": 4, "chg_steps": 5} if name == "A" else {})}),
                          {"model.init_scale": scale, "train.seed": seed})
        rid = ids[name] = cfg.run_id()
        index["runs"][rid] = {"model.init_scale": scale, "train.seed": seed}
        if name == "C":
            with pytest.raises(_Stop):
                train_run(cfg, str(path), rid, progress=_stop_at)
            store.update_run_attrs(path, rid, status="running")  # what a live (or killed) sweep shows
        else:
            assert train_run(cfg, str(path), rid).status == "completed"
        if name == "A":
            _fill_chg(path, rid, cfg)
        if name == "B":
            store.write_derived(path, f"gates.{rid}", _gates_dataset(cfg))
    ids["P"] = "rpending000"  # in the sweep index, never started
    index["runs"][ids["P"]] = {"model.init_scale": 4.0, "train.seed": 0}
    store.write_sweep_index(path, index)
    cli.analyse_store(str(path), [ids["A"]])
    store.write_derived(path, "predict.slash", _predict_curve())
    page = write_report(path, out)
    ids_file.write_text(json.dumps(ids))
    return path, page, ids


def _frames(text: str) -> list[dict]:
    m = re.search(r'<script type="application/json" id="frames-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1).replace("<\\/", "</")) if m else []


def _unwritten_run(path, status: str) -> None:
    """A store at `path` holding run r0 of the TINY config, its arrays made but no snapshot written."""
    from dynamics.config import from_dict
    from dynamics.record import coords, snapshot_steps, variables

    cfg = from_dict(TINY)
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    store.RunWriter(path, "r0", variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                    attrs={"status": status, "config": cfg.to_dict()}).finalize()


def _written_run(path: Path, run_id: str, cfg, status: str, config: dict | None = None) -> None:
    """Run `run_id` of `cfg`, no training: a finished one with every chunk written (ones), as a
    finished run has them; an unfinished one with none recorded yet."""
    from dynamics.record import coords, snapshot_steps, variables

    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    recorded = variables(cfg, len(steps_at))
    writer = store.RunWriter(path, run_id, variables=recorded, coords=coords(cfg, steps_at),
                             attrs={"status": status, "config": config or cfg.to_dict()})
    if status in ("completed", "diverged"):  # a finished run's chunks are all there (store.check_recorded)
        for name, (_, shape, dtype, *_) in recorded.items():
            writer.write_region(name, 0, np.ones(shape, dtype))
    writer.finalize()


def _synthetic_store(path: Path, points: dict[str, dict], status: str = "completed") -> None:
    """Runs with constant arrays (cheap: no training), each at its swept point, and the sweep index."""
    from dynamics.config import from_dict

    cfg = from_dict(TINY)
    for rid in points:
        _written_run(path, rid, cfg, status)
    store.write_sweep_index(path, {"axes": sorted({a for p in points.values() for a in p}), "runs": points})


def _capture_figures(monkeypatch, module) -> dict:
    """Keep every Figure `module` saves, by its relative path, to read what it drew."""
    from dynamics.report import draw

    figs = {}

    def keep(fig, out, rel):
        figs[rel] = fig
        return draw._save(fig, out, rel)

    monkeypatch.setattr(module, "_save", keep)
    return figs


def _flip(folder: Path) -> Path:
    """Flip one bit in the middle of the first chunk file under `folder`; returns the chunk."""
    chunk = next(p for p in sorted(folder.rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x20
    chunk.write_bytes(bytes(data))
    return chunk
