"""`dynamics.predict.options`: bad options refused by PredictOptions, and runs predict_runs cannot fit."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dynamics import predict
from dynamics.predict import PredictError, PredictOptions, Run
from tests.test_predict import make_runs


def test_horizons_are_kept_in_increasing_order():
    # The curve's x axis: the report draws its lines through the horizons in stored order, so
    # "--horizons 0.5,0,0.1" drew a zigzag (0.5 -> 0 -> 0.1) and the table's columns were out of order.
    # (predict_runs builds every axis, table and stored option from these.)
    assert PredictOptions(horizons=(0.5, 0, 0.1)).horizons == (0, 0.1, 0.5)
    assert PredictOptions(horizons=(200, 20), unit="step").horizons == (20, 200)


def test_bad_options_and_runs():
    with pytest.raises(PredictError, match="unknown target"):
        PredictOptions(target="nope")
    # a bare 0.1 raised "'float' object is not iterable", "0.1" named horizon '0', True became h = 1
    for bad in (0.1, "0.1"):
        with pytest.raises(PredictError, match="horizons must be a sequence of numbers"):
            PredictOptions(horizons=bad)
    with pytest.raises(PredictError, match="horizon True is not a number"):
        PredictOptions(horizons=(True,))
    with pytest.raises(PredictError, match="n_splits must be an integer; got 2.5"):  # failed inside sklearn
        PredictOptions(n_splits=2.5)
    # these failed inside sklearn too, after every run's features were built
    for name, bad in (("logistic_c", 0), ("logistic_c", -1.0), ("logistic_c", float("nan")), ("logistic_c", True),
                      ("ridge_alpha", -1.0), ("ridge_alpha", float("inf")), ("ridge_alpha", "1")):
        with pytest.raises(PredictError, match=f"^{name} must be a finite number"):
            PredictOptions(**{name: bad})
    for bad in (2.5, True):
        with pytest.raises(PredictError, match="^boosting_min_leaf must be an integer or None"):
            PredictOptions(boosting_min_leaf=bad)
    assert PredictOptions(ridge_alpha=0, logistic_c=1e-3, boosting_min_leaf=np.int64(3)).ridge_alpha == 0
    assert PredictOptions(horizons=np.array([0.2, 0.1])).horizons == (0.1, 0.2)
    # two columns both headed h=0.1, and a column h=-0
    for twins in ((0.1, 0.1), (0.1, 0.1000000001), (0.0, -0.0)):
        with pytest.raises(PredictError, match="horizons repeat, as printed to 6 significant digits"):
            PredictOptions(horizons=twins)
    assert str(PredictOptions(horizons=(-0.0, 0.1)).horizons[0]) == "0.0"
    assert PredictOptions(horizons=(1234567, 1234568), unit="step").horizons == (1234567, 1234568)  # whole steps
    with pytest.raises(PredictError, match="out of range"):
        PredictOptions(horizons=(1.5,))
    with pytest.raises(PredictError, match="out of range"):
        PredictOptions(horizons=(-3.0,), unit="step")
    with pytest.raises(PredictError, match="horizon step 0.5 is not a whole step"):
        PredictOptions(horizons=(0.5,), unit="step")
    with pytest.raises(PredictError, match=r"^analysis must be an AnalysisOptions, got None$"):
        PredictOptions(analysis=None)  # accepted, then a TypeError from asdict once targets were read
    with pytest.raises(PredictError, match=r"unit 'step' needs its horizons given in steps \(the default, 0.1, is a "):
        PredictOptions(unit="step")
    runs = make_runs(n_seeds=3)
    one_seed = [Run(r.run_id, r.data, 0, r.config) for r in runs]
    with pytest.raises(PredictError, match="one group"):
        predict.predict_runs(one_seed, PredictOptions())
    with pytest.raises(PredictError, match="config"):
        predict.predict_runs(runs, PredictOptions(group_by="config"))
    with pytest.raises(PredictError, match="chg_role"):
        predict.predict_runs(runs, PredictOptions(target="chg"))
    with pytest.raises(PredictError, match="ends at step"):
        predict.predict_runs(runs, PredictOptions(horizons=(500,), unit="step"))
    never = [Run(r.run_id, r.data.isel(snapshot=slice(0, -1)), r.seed, r.config) for r in runs]  # no slash yet
    # (chg not offered: these runs fitted no CHG gates, and --target chg is refused above)
    with pytest.raises(PredictError, match=r"constant: .*; --target importance varies here$"):
        predict.predict_runs(never, PredictOptions())


def test_the_python_entry_points_name_an_argument_of_the_wrong_kind(tmp_path):
    # a dict for the options, a DataArray or a path for a run's Dataset, Datasets for Runs: each
    # failed deep inside ("'dict' object has no attribute 'use_stored_analysis'", "The truth
    # value of an Array is ambiguous", an IndexError for no runs)
    from dynamics.analysis import AnalysisOptions

    run = make_runs(n_seeds=2)[0]
    cases = [
        (lambda: predict.predict_store(str(tmp_path), {"target": "role"}),
         "load_store: options must be a PredictOptions; got dict"),
        (lambda: predict.predict_runs([], PredictOptions()),
         "predict_runs: runs must be Run(run_id, data, seed, config)s, as load_runs gives them; got none"),
        (lambda: predict.predict_runs([run.data, run.data]),
         "predict_runs: runs must be Run(run_id, data, seed, config)s, as load_runs gives them; got Dataset"),
        (lambda: predict.predict_runs([run], {"target": "role"}), "predict_runs: options must be a PredictOptions; got dict"),
        (lambda: predict.final_targets(run.data["importance"], "importance"),
         "final_targets: expected a run's Dataset (open_run(STORE, RUN_ID), or a sweep's .sel(run=...)); got DataArray"),
        (lambda: predict.final_targets("runs.zarr", "role"),
         "final_targets: expected a run's Dataset (open_run(STORE, RUN_ID), or a sweep's .sel(run=...)); got str"),
        (lambda: predict.head_features(run.data, PredictOptions()),
         "head_features: options must be an AnalysisOptions; got PredictOptions"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            call()
    assert predict.head_features(run.data, AnalysisOptions()).sizes["feature"] > 0
