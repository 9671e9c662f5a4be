"""The early-gradient predictor end to end, and `dynamics predict` on a store, on constructed
sweeps whose answer is planted (no training).

Each constructed run has 2 layers x 8 heads. A head's "fate" is a coin flip; fated heads
get a large q gradient norm from step 5 on (not at initialisation) and a slash pattern at
offset 3 in the final snapshot only. Everything else is noise, and the attention up to the
last snapshot is near-uniform, so only the early gradients carry the fate.

The helpers here build those runs (and stores of them) for tests/test_predict_*.py, which check
one module of dynamics.predict each; the session fixtures `planted` and `tables` are in
tests/conftest.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr

from dynamics import cli, predict, store
from dynamics.predict import MODELS, Run

STEPS = np.array([0, 5, 10, 20, 40, 70, 100])
L, H, P, T = 2, 8, 2, 8
OFFSET = 3
H_STEP = 10  # the horizon of the leak tests: h = 0.1 of a 100-step run


def uniform_rows(rng, noise: float = 0.05) -> np.ndarray:
    """(L, H, P, T, T) causal rows, near-uniform with a little noise."""
    a = np.tril(np.ones((T, T))) * (1.0 + noise * rng.random((L, H, P, T, T)))
    a *= np.tril(np.ones((T, T)))
    return a / a.sum(-1, keepdims=True)


def slash_rows(rng, fate: np.ndarray) -> np.ndarray:
    """Final attention: fated heads put 0.9 on key i - OFFSET (queries that can see it)."""
    a = uniform_rows(rng)
    for layer, head in zip(*np.nonzero(fate), strict=True):
        for i in range(OFFSET, T):
            row = np.zeros(T)
            row[: i + 1] = 0.1 / i
            row[i - OFFSET] = 0.9
            a[layer, head, :, i] = row
    return a


def make_run(seed: int, fate: np.ndarray, *, config: str = "base", signal: float = 2.0) -> xr.Dataset:
    """One run's recordings as an in-memory dataset with the store's dims and coords."""
    rng = np.random.default_rng(1000 + seed)
    S = STEPS.size
    grad_norm = rng.lognormal(0.0, 0.3, (S, L, H, 4))
    grad_norm[1:, :, :, 0] *= np.exp(signal * fate)  # planted: q gradients of fated heads, after init
    grad_cosine = rng.uniform(-1, 1, (S, L, H, 4))
    grad_cosine[0] = np.nan  # no earlier gradient at the first snapshot
    attention = np.stack([uniform_rows(rng) for _ in range(S - 1)] + [slash_rows(rng, fate)])
    ds = xr.Dataset(
        {
            "attention": (("snapshot", "layer", "head", "probe", "query", "key"), attention.astype(np.float16)),
            "probe_tokens": (("probe", "position"), rng.integers(0, 40, (P, T))),
            "grad_norm": (("snapshot", "layer", "head", "weight"), grad_norm.astype(np.float32)),
            "grad_cosine": (("snapshot", "layer", "head", "weight"), grad_cosine.astype(np.float32)),
            "importance": (("snapshot", "layer", "head"), rng.lognormal(0, 0.5, (S, L, H)).astype(np.float32)),
            "gate": (("snapshot", "layer", "head"), np.ones((S, L, H), np.float32)),
            "loss": (("train_step",), rng.random(int(STEPS[-1])).astype(np.float32)),
        },
        coords={
            "step": ("snapshot", STEPS),
            "layer": np.arange(L),
            "head": np.arange(H),
            "weight": ["q", "k", "v", "o"],
            "train_step": np.arange(int(STEPS[-1])),
        },
        attrs={"run_id": f"r{seed}-{config}", "status": "completed"},
    )
    return ds


def make_runs(n_seeds: int = 8, configs=("base",), coin: int = 0, fate_by_seed: bool = False, **kw) -> list[Run]:
    """Runs of each config x seed; ``fate_by_seed``: a seed's heads have one fate in every config,
    as runs sharing initial weights and data order tend to."""
    rng = np.random.default_rng(coin)
    runs, fates = [], {}
    for config in configs:
        for seed in range(n_seeds):
            fate = rng.random((L, H)) < 0.5
            fate = fates.setdefault(seed, fate) if fate_by_seed else fate
            ds = make_run(seed + 100 * len(runs), fate, config=config, **kw)
            runs.append(Run(f"r{seed}-{config}", ds, seed=seed, config=config))
    return runs


def scramble_after(ds: xr.Dataset, step: float, rng, *, keep_final: bool) -> xr.Dataset:
    """Every array along snapshot/train_step past `step` replaced by a permutation of itself plus noise."""
    ds = ds.copy(deep=True)
    snap = np.flatnonzero(ds["step"].values > step)
    if keep_final:
        snap = snap[:-1]
    for name, var in ds.data_vars.items():
        values = var.values
        if "snapshot" in var.dims and snap.size:
            axis = var.dims.index("snapshot")
            block = np.take(values, snap, axis=axis)
            block = rng.permutation(block.ravel()).reshape(block.shape)
            if name != "attention":
                block = block * rng.lognormal(0, 1, block.shape)
            idx = [slice(None)] * values.ndim
            idx[axis] = snap
            values[tuple(idx)] = block
        if "train_step" in var.dims:
            late = ds["train_step"].values > step
            values[late] = rng.random(late.sum())
        ds[name] = (var.dims, values)
    return ds


def null_band(target: np.ndarray, z: float = 4.0) -> float:
    """Half-width of a z-sigma band around 0.5 for the AUROC of scores independent of the labels.

    Under the null, AUROC = U / (n1 n0) with the Mann-Whitney U, whose variance without ties
    is n1 n0 (n1 + n0 + 1) / 12 (Mann & Whitney 1947). z = 4 fails a correct predictor with
    probability ~6e-5.
    """
    n1 = int(np.sum(target == 1))
    n0 = target.size - n1
    return z * math.sqrt((n1 + n0 + 1) / (12.0 * n1 * n0))


FAST = {"boosting_iter": 20}


def write_store(path, runs: list[Run], *, statuses=None) -> None:
    statuses = statuses or {}
    for r in runs:
        ds = r.data
        variables = {name: (var.dims, var.shape, str(var.dtype)) for name, var in ds.data_vars.items()}
        coords = {name: (ds[name].dims[0], ds[name].values) for name in ("step", "layer", "head", "weight", "train_step")}
        w = store.RunWriter(path, r.run_id, variables=variables, coords=coords,
                            attrs={"status": statuses.get(r.run_id, "completed"), "seed": r.seed})
        for i in range(ds.sizes["snapshot"]):
            w.write_snapshot(i, {n: v.isel(snapshot=i).values for n, v in ds.data_vars.items() if "snapshot" in v.dims})
        w.write_region("probe_tokens", 0, ds.probe_tokens.values)
        w.write_region("loss", 0, ds.loss.values)
        w.finalize()
    store.write_sweep_index(path, {"axes": ["train.seed"],
                                   "runs": {r.run_id: {"train.seed": r.seed} for r in runs}})


def flip_a_bit(array_dir) -> None:
    """Flip one bit in the middle of the first chunk file of a stored array."""
    chunk = next(p for p in sorted((array_dir / "c").rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x04
    chunk.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- the curve end to end


def test_planted_signal_is_found(planted):
    _, _, curve = planted
    at = curve.score_mean.sel(horizon=0.1)
    assert float(at.sel(model="linear")) > 0.95
    assert float(at.sel(model="boosting")) > 0.95
    assert float(curve.score_pooled.sel(horizon=0.1, model="linear")) > 0.95
    # init carries no plant: its baselines are at chance within the null band
    band = null_band(curve.target.values)
    for model in ("init_linear", "init_boosting", "layer"):
        assert abs(float(curve.score_pooled.sel(horizon=0.1, model=model)) - 0.5) < band


def test_baselines_in_the_table(planted):
    _, _, curve = planted
    assert list(curve.model.values) == list(MODELS)
    assert {"chance", "layer", "init_linear", "init_boosting"} <= set(curve.model.values)
    assert np.isfinite(curve.score_mean.values).all()
    np.testing.assert_allclose(curve.score.sel(model="chance").values, 0.5)  # a constant ranks nothing
    # the init baselines do not depend on the horizon
    for model in ("chance", "layer", "init_linear", "init_boosting"):
        np.testing.assert_array_equal(curve.prediction.sel(model=model, horizon=0.0),
                                      curve.prediction.sel(model=model, horizon=0.1))
    # at h = 0 the features are the init features: the models coincide with their init baselines
    for kind in ("linear", "boosting"):
        np.testing.assert_allclose(curve.prediction.sel(model=kind, horizon=0.0),
                                   curve.prediction.sel(model=f"init_{kind}", horizon=0.0))
    text = predict.format_curve(curve)
    for model in MODELS:
        assert model in text
    assert "AUROC" in text and "h=0.1" in text


# ----------------------------------------------------------------------------- store and CLI


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("predict") / "sweep.zarr"
    write_store(path, make_runs(n_seeds=3))
    return str(path)


def test_cli_prints_the_curve_and_saves_it(small_store, capsys):
    rc = cli.main(["predict", small_store, "--target", "slash", "--horizons", "0,0.1", "--folds", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "AUROC" in out and "init_boosting" in out and "derived/predict.slash" in out
    curve = store.open_derived(small_store, predict.derived_name("slash"))
    assert dict(curve.score.sizes) == {"horizon": 2, "model": len(MODELS), "fold": 2}
    assert curve.horizon.values.tolist() == [0.0, 0.1]
    assert curve.attrs["target_sources"] == {"computed from the final snapshot": 3}
    assert curve.horizon_step.sel(horizon=0.1).values.tolist() == [10.0] * 3
    assert curve.attrs["readable_summary"] in out.splitlines()
    assert curve.readable.values.tolist() == [False, curve.attrs["readable_horizon"] == 0.1]
    assert curve.attrs["readable_alpha"] == 0.05  # the report's caption quotes the level from here


@pytest.mark.parametrize("streams", ["stdout", "both"])
def test_cli_saves_the_curve_when_its_reader_has_gone(small_store, tmp_path, streams):
    # `dynamics predict S | head -3`: the curve is printed before it is saved, and the closed
    # pipe ended the command there, with a BrokenPipeError traceback and nothing saved; with
    # `2>&1 | head` the progress lines on stderr did so first.
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "copy.zarr"
    shutil.copytree(small_store, path)
    proc = subprocess.Popen([sys.executable, "-m", "dynamics", "predict", str(path), "--target", "slash",
                             "--horizons", "0,0.1", "--folds", "2"],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if streams == "both" else subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    proc.stdout.close()  # long before the first line: the imports alone take a second
    err = "" if streams == "both" else proc.stderr.read()
    if proc.stderr is not None:
        proc.stderr.close()  # left to the collector, it warned in whichever test ran then
    assert proc.wait(timeout=120) == 0, err  # exit 1 with a traceback, unread, where it broke
    assert "Traceback" not in err
    assert store.open_derived(str(path), predict.derived_name("slash")).horizon.values.tolist() == [0.0, 0.1]


def test_cli_says_when_nothing_is_readable_and_stores_none(small_store, capsys):
    # at h=0 the early models see initialisation only: they are the init baselines, never above them
    assert cli.main(["predict", small_store, "--horizons", "0", "--folds", "3"]) == 0
    out = capsys.readouterr().out
    assert "how early: not readable at any horizon measured (h=0 (step 0)): " in out
    assert "passes a one-sided paired t-test at 0.05 over the J folds where every model is scored (3 here)" in out
    curve = store.open_derived(small_store, predict.derived_name("slash"))
    assert curve.attrs["readable_horizon"] is None and curve.attrs["readable_model"] is None
    assert curve.readable.values.tolist() == [False]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--target", "nope"], "unknown target"),
        (["--horizon", "1.5"], "out of range"),
        (["--horizons", "0,abc"], "--horizons"),
        # a value starting with "-" that is no plain negative number: "expected one argument"
        (["--horizons", "-0.1,0.2"], "error: horizon -0.1 out of range: a fraction of the run must lie in [0, 1]"),
        (["--horizon", "0.1,0.2"], "--horizon: expected one number, got '0.1,0.2'"),
        (["--horizon", "1e400"], "horizon inf is not a finite number"),
        (["--null", "-1"], "error: --null: permutations must be in [0, 1000]; got -1"),  # the flag, not the field
        (["--null", "1001"], "error: --null: permutations must be in [0, 1000]; got 1001"),
        (["--horizon", "0.1", "--horizons", "0.2"], "not both"),
        (["--group", "config"], "one group"),
        # "causal head gating was never fitted" of a store `dynamics gates` may have fitted afterwards
        (["--target", "chg"], "error: target 'chg': no run records chg_role (causal head gating fitted during training, "
                              "record.chg_every > 0; fits by `dynamics gates` afterwards are not read)"),
        (["--unit", "step", "--horizon", "1000"], "ends at step"),
        # the default horizon is a fraction: "horizon step 0.1 is not a whole step" named one nobody gave
        (["--unit", "step"], "error: --unit step needs --horizon or --horizons in steps (the default horizon, 0.1, "
                             "is a fraction of the run)"),
        (["--folds", "1"], "--folds: must be >= 2, got 1"),
    ],
)
def test_cli_bad_input_exits_2(small_store, capsys, argv, message):
    rc = cli.main(["predict", small_store, *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_cli_store_problems_exit_2(tmp_path, capsys):
    assert cli.main(["predict", str(tmp_path / "missing.zarr")]) == 2
    assert "missing.zarr: the path does not exist" in capsys.readouterr().err
    runs = make_runs(n_seeds=2)
    path = tmp_path / "few.zarr"
    write_store(path, runs, statuses={runs[0].run_id: "diverged"})
    assert cli.main(["predict", str(path)]) == 2
    err = capsys.readouterr().err
    assert "1 completed run" in err and len(err.strip().splitlines()) == 1
