"""The curve of `dynamics.predict.curve` on the planted runs of tests/test_predict.py: its printed
table, its attributes, and the null check on permuted final roles."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import xarray as xr

from dynamics import predict
from dynamics.predict import MODELS, PredictOptions, Run
from tests.test_predict import FAST, H, L, make_run, make_runs

# ----------------------------------------------------------------------------- the table and its attributes


def test_the_table_says_which_step_each_horizon_saw_and_marks_the_ceiling(planted):
    # A horizon is an upper bound: the features see the last snapshot at or before it (h=0.05 of
    # the demo's 500 steps saw step 16), and a horizon at the final snapshot sees the target.
    _, _, curve = planted
    text = predict.format_curve(curve)
    assert "features saw snapshots up to step h=0: 0, h=0.1: 10 (final step 100)" in text
    assert "ceiling" not in text
    seen = curve.horizon_step.values.copy()
    seen[1, 0] = 100.0  # one run seen to its end at h=0.1
    text = predict.format_curve(curve.assign(horizon_step=(curve.horizon_step.dims, seen)))
    assert "h=0.1: 10-100 (final step 100)" in text
    assert "h=0.1: features see a run's final snapshot, which defines the target: a ceiling" in text


def test_the_step_line_reads_once_with_step_horizons(planted):
    # With --unit step the horizon labels are "step 10" themselves: the line read "up to step step 10: 10".
    _, _, curve = planted
    stepped = curve.assign_coords(horizon=[0.0, 10.0]).assign_attrs(horizon_unit="step")
    text = predict.format_curve(stepped)
    assert "step step" not in text
    assert "features saw snapshots up to step, by horizon: step 0: 0, step 10: 10 (final step 100)" in text


# ----------------------------------------------------------------------------- the null check


def test_the_null_check_permutes_whole_runs_between_runs_with_the_same_heads(planted, tables):
    runs, _, _ = planted
    rows = tables[0]
    [block] = predict.same_head_blocks(rows)  # every planted run labels all L x H heads
    assert block.shape == (len(runs), L * H)
    for r, idx in enumerate(block):
        assert set(rows.row_run.values[idx]) == {runs[r].run_id}
        assert list(zip(rows.row_layer.values[idx], rows.row_head.values[idx], strict=True)) == [
            (layer, head) for layer in range(L) for head in range(H)]
    # a run that labels other heads has no peer: it is left as it is
    fewer = rows.isel(head_row=np.flatnonzero(~((rows.row_run.values == runs[0].run_id) & (rows.row_head.values == 0))))
    [block] = predict.same_head_blocks(fewer)
    assert block.shape == (len(runs) - 1, L * H)


def test_the_null_checks_permutations_do_not_depend_on_the_order_the_runs_come_in(planted, tables, monkeypatch):
    # The draws went to the blocks, and to the runs in each, in the rows' order: the same runs
    # listed in another order (a store's sweep index, then its groups) were given other roles,
    # and an audit's six runs counted 0 of 20 one way and 2 of 20 the other.
    from dynamics.predict import curve as cv

    runs, opt, _ = planted
    rows = tables[0]
    shuffled = rows.isel(head_row=np.random.default_rng(5).permutation(rows.sizes["head_row"]))
    names = [[rows.row_run.values[b[r, 0]] for r in range(len(b))] for b in predict.same_head_blocks(rows)]
    assert names == [[shuffled.row_run.values[b[r, 0]] for r in range(len(b))]
                     for b in predict.same_head_blocks(shuffled)]
    assert names == [sorted(r.run_id for r in runs)]

    def given(order):  # each permutation's targets, by (run, layer, head)
        seen, real = [], cv.cross_validate
        monkeypatch.setattr(cv, "cross_validate", lambda *a, **k: (seen.append(a[2].copy()), real(*a, **k))[1])
        listed = [runs[i] for i in order]
        curve = predict.predict_runs(listed, dataclasses.replace(opt, null=3, horizons=(0.1,)))
        keys = predict.target_table(listed, opt)
        keys = list(zip(keys.row_run.values, keys.row_layer.values, keys.row_head.values, strict=True))
        return [dict(zip(keys, y.tolist(), strict=True)) for y in seen[1:]], curve.attrs["null_readable"]

    forward = given(range(len(runs)))
    assert forward == given(range(len(runs) - 1, -1, -1)) == given([3, 0, 6, 1, 7, 2, 5, 4])
    assert len(forward[0]) == 3 and forward[0][0] != forward[0][1]


def test_the_null_check_counts_how_often_the_criterion_fires_on_permuted_targets(planted):
    runs, opt, curve = planted
    said = []
    null = predict.predict_runs(runs, dataclasses.replace(opt, null=4), progress=said.append)
    # each stage said as it starts: with --null N, N more curves ran in silence
    # the first before any run is read: 19 s of silence on 150 runs
    assert said[0] == f"{len(runs)} runs: reading their recordings and final targets"
    assert said[2].startswith("fitting 6 models x") and said[1].startswith(f"{len(runs)} runs, ")
    assert said[3:] == [f"null check {i}/4: the curve on permuted final roles" for i in range(1, 5)]
    # the real curve is untouched by it
    np.testing.assert_array_equal(null.score.values, curve.score.values)
    assert null.attrs["null_permutations"] == 4
    # each run's plant is its own: given another run's fates, nothing early predicts them
    assert null.attrs["null_readable"] == 0
    assert predict.format_curve(null).splitlines()[-1] == (
        "null check: with each run's final roles given whole to another run with the same heads and another seed, "
        "the criterion named a readable horizon in 0 of 4 permutations (0%): how often it reads one on these runs "
        "where there is nothing to read; and said \"legible at initialisation\" in 0 of 4 (0%), which a legible line "
        "on these runs is to be read against")
    assert null.attrs["null_legible"] == 0
    # of the importance target it permutes ranks, not roles (the line said "final roles" of it too)
    ranks = null.copy()
    ranks.attrs["target"] = "importance"
    assert predict.format_curve(ranks).splitlines()[-1].startswith(
        "null check: with each run's final importance ranks given whole to another run with the same heads")
    old = null.copy()
    del old.attrs["null_same_seed_runs"]  # saved before seeds were kept apart: not said to have been
    assert predict.format_curve(old).splitlines()[-1].startswith(
        "null check: with each run's final roles given whole to another run with the same heads, the criterion")
    # every run with the same fates: a permutation changes no target, so each null curve is the real
    # one, readable at h=0.1 as it is
    same = [Run(r.run_id, make_run(i, np.eye(L, H, dtype=bool)), seed=r.seed, config=r.config)
            for i, r in enumerate(runs)]
    alike = predict.predict_runs(same, dataclasses.replace(opt, null=3))
    assert alike.attrs["readable_horizon"] == 0.1 and alike.attrs["null_readable"] == 3
    old = null.copy()
    del old.attrs["null_legible"]  # saved before the legible clause was counted: nothing said of it
    assert predict.format_curve(old).splitlines()[-1].endswith("where there is nothing to read")
    with pytest.raises(predict.PredictError, match="null: permutations must be in"):
        dataclasses.replace(opt, null=-1)


def test_the_null_never_gives_a_run_the_roles_of_a_run_of_its_own_seed(monkeypatch):
    # Runs of one seed share initial weights and data order, so their heads' fates agree: a twin's
    # roles kept the run's own signal, and the null fired 8 times in 40 where it fired 0 without.
    from dynamics.predict import curve as cv

    runs = make_runs(3, configs=("a", "b", "c", "d"), fate_by_seed=True)
    seen, real = [], cv.cross_validate
    monkeypatch.setattr(cv, "cross_validate", lambda *a, **k: (seen.append(a[2].copy()), real(*a, **k))[1])
    curve = predict.predict_runs(runs, PredictOptions(target="slash", horizons=(0.1,), null=4, n_splits=3, **FAST))
    row_run = curve.row_run.values
    seed = {r.run_id: r.seed for r in runs}
    y = seen[0]
    block = {r: y[row_run == r] for r in seed}
    assert len({tuple(b) for b in block.values()}) == 3  # one target set per seed: a twin's is recognisable
    for permuted in seen[1:]:
        for r in seed:
            given = [o for o in seed if np.array_equal(block[o], permuted[row_run == r])]
            assert given and all(seed[o] != seed[r] for o in given), (r, given)
    assert curve.attrs["null_same_seed_runs"] == 0
    assert "another seed" in predict.format_curve(curve).splitlines()[-1]


def test_the_null_says_when_one_seed_holds_most_runs():
    runs = make_runs(1, configs=("a", "b", "c")) + make_runs(1, configs=("d",), coin=5)
    runs = [Run(r.run_id, r.data, seed=0 if i < 3 else 1, config=r.config) for i, r in enumerate(runs)]
    curve = predict.predict_runs(runs, PredictOptions(target="slash", horizons=(0.1,), null=1, group_by="run",
                                                      n_splits=2, **FAST))
    assert curve.attrs["null_same_seed_runs"] == 4
    lines = predict.format_curve(curve).splitlines()
    assert lines[-1].startswith("caution: 4 of these runs are in sets where one seed holds more than half the runs")
    # not said to have gone to another seed, where they could not
    assert lines[-2].startswith("null check: with each run's final roles given whole to another run with the same "
                                "heads and, where its set allows, another seed, the criterion")


def test_the_null_fits_on_the_real_folds(monkeypatch):
    from dynamics.predict import curve as cv

    runs = make_runs(n_seeds=4, configs=("a", "b"))
    seen, real = [], cv.cross_validate
    monkeypatch.setattr(cv, "cross_validate", lambda *a, **k: (seen.append(a[4]), real(*a, **k))[1])
    curve = predict.predict_runs(runs, PredictOptions(target="slash", horizons=(0.1,), null=2, **FAST))
    groups = curve.row_group.values
    assert len(seen) == 3
    for splits in seen[1:]:
        assert [sorted(t) for _, t in splits] == [sorted(t) for _, t in seen[0]]
        for train, test in splits:
            assert not set(groups[train]) & set(groups[test])


def test_the_null_check_in_blocks_of_two_runs_gives_no_run_its_own_targets():
    # 8 runs, each pair missing another head at the end, so 4 blocks of 2 runs. A plain shuffle
    # left one run of a block its own fates in half the permutations, and with them its plant:
    # the criterion fired on 4 of 6 "null" curves.
    runs = []
    rng = np.random.default_rng(0)
    for seed in range(8):
        ds = make_run(seed, rng.random((L, H)) < 0.5)
        a = ds["attention"].values.astype(np.float32)
        a[-1, 1, seed // 2] = np.nan
        runs.append(Run(f"r{seed}", ds.assign(attention=(ds["attention"].dims, a)), seed=seed, config="base"))
    opt = PredictOptions(target="slash", horizons=(0.0, 0.1), null=6, **FAST)
    assert [b.shape for b in predict.same_head_blocks(predict.target_table(runs, opt))] == [(2, L * H - 1)] * 4
    curve = predict.predict_runs(runs, opt)
    assert curve.attrs["readable_horizon"] == 0.1
    assert curve.attrs["null_readable"] == 0 and curve.attrs["null_left_out_runs"] == 0


def test_permutations_that_cannot_be_judged_are_not_counted_as_silent_ones():
    # Two runs with slash heads (seeds 0 and 1) and two with none (both seed 2): every permutation
    # must give the two slash runs' fates to the seed-2 runs, leaving the seed-0 and seed-1 folds
    # one class each, so no band and no horizon could ever be named. They were counted as curves
    # where the criterion kept quiet: "0 of 6 permutations (0%)".
    fates = [np.eye(L, H, dtype=bool), np.eye(L, H, k=2, dtype=bool), np.zeros((L, H), bool), np.zeros((L, H), bool)]
    runs = [Run(f"r{i}", make_run(i, fate), seed=min(i, 2), config="base") for i, fate in enumerate(fates)]
    opt = PredictOptions(target="slash", horizons=(0.0, 0.1), null=6, group_by="seed", **FAST)
    curve = predict.predict_runs(runs, opt)
    assert curve.attrs["null_permutations"] == 6 and curve.attrs["null_judged"] == 0
    assert curve.attrs["null_readable"] == 0
    assert predict.format_curve(curve).splitlines()[-1] == (
        "null check: none of the 6 permutations could be judged (their folds left fewer than 2 scored for every model, e.g. "
        "one class, so they could name no horizon): it says nothing on how often the criterion reads a horizon on "
        "these runs")
    # some judged: the rate is over those, and the rest are named
    some = curve.assign_attrs(null_judged=4, null_readable=1)
    assert "the criterion named a readable horizon in 1 of the 4 permutations it could judge (25%; 2 of 6 could not " \
           "be: their folds left fewer than 2 scored for every model, e.g. one class, so they could name no horizon): how " \
           "often" in predict.format_curve(some)
    old = curve.copy()
    del old.attrs["null_judged"]  # saved before: every permutation taken as judged, as it was
    assert "in 0 of 6 permutations (0%)" in predict.format_curve(old)


def test_a_run_with_no_peer_is_left_out_of_the_null_check(planted):
    from dynamics.predict.null import null_folds

    runs, opt, _ = planted
    lone = runs[0].data.copy()
    a = lone["attention"].values.astype(np.float32)
    a[-1, 0, 0] = np.nan  # its head (0, 0) unlabelled: no other run labels the same heads
    runs = [Run(runs[0].run_id, lone.assign(attention=(lone["attention"].dims, a)), seed=runs[0].seed,
                config=runs[0].config)] + runs[1:]
    rows = predict.target_table(runs, opt)
    blocks = predict.same_head_blocks(rows)
    splits = predict.group_splits(rows.row_group.values, opt.n_splits)
    keep, folds = null_folds(blocks, splits, rows.sizes["head_row"])
    assert set(rows.row_run.values[keep]) == {r.run_id for r in runs[1:]}
    assert len(folds) == len(splits)
    # renumbered into the kept rows, each fold holds the kept rows it held before
    for (train, test), (new_train, new_test) in zip(splits, folds, strict=True):
        assert keep[new_test].tolist() == [i for i in test if i in set(keep)]
        assert keep[new_train].tolist() == [i for i in train if i in set(keep)]
    curve = predict.predict_runs(runs, dataclasses.replace(opt, null=2))
    assert curve.attrs["null_left_out_runs"] == 1 and curve.attrs["null_readable"] == 0
    assert predict.format_curve(curve).splitlines()[-1].endswith(
        "(1 run labelling heads no other run labels left out of it)")


def test_a_null_check_whose_runs_fill_one_fold_is_refused_before_any_fit(planted, monkeypatch):
    from dynamics.predict import curve as curve_module

    runs, opt, _ = planted
    rows = predict.target_table(runs, opt)
    _, test = predict.group_splits(rows.row_group.values, opt.n_splits)[0]
    one_fold = [np.stack([np.flatnonzero(rows.row_run.values == r) for r in dict.fromkeys(rows.row_run.values[test])])]
    monkeypatch.setattr(curve_module, "same_head_blocks", lambda rows: one_fold)  # peers all in fold 0: no fold trains on one
    monkeypatch.setattr(curve_module, "cross_validate", lambda *a, **k: pytest.fail("fitted before refusing"))
    with pytest.raises(predict.PredictError, match=(
            "^null check: the runs that share their heads with another run leave 0 of 5 folds with both training "
            "and test runs; it needs 2$")):
        predict.predict_runs(runs, dataclasses.replace(opt, null=2))


def test_a_null_check_with_nothing_to_permute_is_refused_before_any_fit(planted, monkeypatch):
    from dynamics.predict import curve as curve_module

    runs, opt, _ = planted
    monkeypatch.setattr(curve_module, "same_head_blocks", lambda rows: [])  # as when every run labels other heads
    monkeypatch.setattr(curve_module, "cross_validate", lambda *a, **k: pytest.fail("fitted before refusing"))
    with pytest.raises(predict.PredictError, match="^null check: no two runs label the same heads"):
        predict.predict_runs(runs, dataclasses.replace(opt, null=2))


def test_a_null_check_at_ceiling_horizons_only_is_refused_before_any_fit(planted, monkeypatch):
    # judge never names a ceiling horizon: "named a readable horizon in 0 of 2 permutations (0%)"
    # was certain before the 17 s of fits that printed it
    from dynamics.predict import curve as curve_module

    runs, opt, _ = planted
    monkeypatch.setattr(curve_module, "cross_validate", lambda *a, **k: pytest.fail("fitted before refusing"))
    with pytest.raises(predict.PredictError, match=(
            r"^null check: every horizon given is a ceiling \(its features see a run's final snapshot, which defines "
            r"the target\) or sees the initialisation alone \(the early-training models are then the init "
            r"baselines\), and none is ever named readable, so 0 of N would say nothing; give a horizon between the "
            r"runs' first snapshot after step 0 and their ends$")):
        predict.predict_runs(runs, dataclasses.replace(opt, horizons=(1.0,), null=2))
    # the initialisation alone, or it and the end: "0 of 2 permutations" was as certain there
    first = min(float(np.sort(r.data["step"].values)[1]) for r in runs) / max(float(r.data["step"].max()) for r in runs)
    for horizons in ((0.0,), (0.0, 1.0), (first / 2, 1.0)):
        with pytest.raises(predict.PredictError, match="or sees the initialisation alone"):
            predict.predict_runs(runs, dataclasses.replace(opt, horizons=horizons, null=2))
    with pytest.raises(pytest.fail.Exception, match="fitted before refusing"):  # one horizon before the end: fitted
        predict.predict_runs(runs, dataclasses.replace(opt, horizons=(0.5, 1.0), null=2))


def test_folds_that_each_test_one_class_are_refused_before_any_fit(monkeypatch):
    # Seed 0's heads all turn slash, seeds 1 and 2 grow none: the store holds both classes, but
    # every fold holding out a whole seed tests one, and the table came out all n/a, exit 0.
    from dynamics.predict import curve as curve_module

    fates = [np.ones((L, H), bool), np.zeros((L, H), bool), np.zeros((L, H), bool)]
    runs = [Run(f"r{s}", make_run(s, fate), seed=s) for s, fate in enumerate(fates)]
    opt = PredictOptions(horizons=(0.1,), n_splits=3, boosting_iter=10)
    fit = curve_module.cross_validate
    monkeypatch.setattr(curve_module, "cross_validate", lambda *a, **k: pytest.fail("fitted before refusing"))
    with pytest.raises(predict.PredictError, match=(
            r"^target 'slash': AUROC is undefined on every one of the 3 test folds holding out whole seeds, each of "
            r"one class \(seed=\d; seed=\d; seed=\d\), so no model can be scored; fewer --folds put more groups in a "
            r"test fold$")):
        predict.predict_runs(runs, opt)
    # Two folds put two seeds in one test fold, which then holds both classes: scored, not refused.
    monkeypatch.setattr(curve_module, "cross_validate", fit)
    curve = predict.predict_runs(runs, dataclasses.replace(opt, n_splits=2))
    assert np.isfinite(curve.score.values).any(axis=-1).all()


def test_the_features_attr_lists_only_features_with_a_value(planted, tables):
    # attrs["features"] listed every column of the first horizon's table, values or not: at h=0
    # gradient agreement (NaN at the first snapshot) and, here, the sink and token scores (the
    # probe never holds the token) are NaN for every head, and no model can use them.
    runs, opt, curve = planted
    rows, _, init, _ = tables
    def with_values(t):
        return {f for f, ok in zip(t.feature.values, np.isfinite(t.values).any(0), strict=True) if ok}

    valued = set().union(*(with_values(predict.feature_table(runs, rows, h, opt)) for h in opt.horizons))
    assert set(curve.attrs["features"]) == valued
    assert set(curve.attrs["init_features"]) == with_values(init)
    assert set(curve.attrs["features_empty"]) == set(init.feature.values) - valued
    # known by construction: gradient agreement has no value at init (h=0), one for every head at h=0.1
    assert "grad_cosine_q_h" in curve.attrs["features"] and "grad_cosine_q_h" not in curve.attrs["init_features"]
    n = curve.n_feature_values.sel(feature="grad_cosine_q_h")
    assert n.values.tolist() == [0, curve.sizes["head_row"]]
    # a recording with no value at all (gradient agreement NaN in every run) is named empty, not a feature
    blank = [Run(r.run_id, r.data.assign(grad_cosine=r.data.grad_cosine * np.nan), r.seed, r.config) for r in runs[:3]]
    empty = predict.predict_runs(blank, PredictOptions(horizons=(0.1,), n_splits=3, boosting_iter=5))
    cosines = {f"grad_cosine_{w}_{s}" for w in "qkvo" for s in ("mean", "h")}
    assert cosines <= set(empty.attrs["features_empty"])
    assert not cosines & set(empty.attrs["features"])
    assert (empty.n_feature_values.sel(feature=sorted(cosines)) == 0).all()


def test_folds_whose_test_runs_have_a_seed_twin_in_training_are_flagged(planted):
    # Runs of one seed share init and data order: with twins (same seed, same fate, no early
    # signal) in 2 configs, --group config let init_boosting reach AUROC 0.998 by matching
    # twins, under a header that only said "holding out whole configs"; --group seed is at 0.46.
    fates = [np.random.default_rng(0).random((L, H)) < 0.5 for _ in range(2)]
    runs = [Run(f"r{s}-{c}", make_run(s, fates[s], signal=0.0), seed=s, config=c) for c in ("a", "b") for s in range(2)]
    curve = predict.predict_runs(runs, PredictOptions(horizons=(0.0,), group_by="config", boosting_iter=5))
    assert curve.attrs["folds_sharing_seeds"] == 2
    assert "caution: in 2 of 2 folds a test run shares its seed" in predict.format_curve(curve)
    _, _, by_seed = planted
    assert by_seed.attrs["folds_sharing_seeds"] == 0
    assert "caution" not in predict.format_curve(by_seed)


def _padded(ds, extra: int = 2):
    """``ds`` as ``open_sweep(...).sel(run=...)`` gives it when another run of the sweep is longer:
    ``extra`` snapshots past its end, every value and the step NaN."""
    import xarray as xr

    tail = ds.isel(snapshot=[-1] * extra).copy(deep=True)
    for name, v in tail.data_vars.items():
        if "snapshot" in v.dims:
            tail[name] = v.astype(np.float64) * np.nan
    tail = tail.assign_coords(step=("snapshot", [np.nan] * extra))
    return xr.concat([ds.assign_coords(step=ds.step.astype(np.float64)), tail], dim="snapshot",
                     data_vars="minimal", coords="minimal")


def test_runs_picked_from_a_padded_sweep_give_their_own_curve():
    # The padding's NaN steps made the first step NaN ("no snapshot at or before step nan") and
    # would have made the final step NaN: h=1 not flagged a ceiling, a step past the end not refused.
    runs = make_runs(6)
    padded = [dataclasses.replace(r, data=_padded(r.data)) for r in runs]
    opt = PredictOptions(target="slash", horizons=(0.1, 1.0), **FAST)
    plain, cut = predict.predict_runs(runs, opt), predict.predict_runs(padded, opt)
    np.testing.assert_array_equal(cut["score"].values, plain["score"].values)
    np.testing.assert_array_equal(cut["final_step"].values, plain["final_step"].values)
    assert predict.readable.ceiling_horizons(cut) == [False, True]
    past = dataclasses.replace(opt, unit="step", horizons=(float(plain["final_step"].max()) + 1,))
    with pytest.raises(predict.PredictError, match="out of range"):
        predict.predict_runs(padded, past)


def test_runs_picked_from_a_sweep_of_more_heads_and_wider_weights_give_their_own_curve():
    # open_sweep pads a smaller model's heads (head_mask False) and its weights' d_head with NaN:
    # every layer mean and norm over a run's heads read NaN (the *_rel_* features, importance
    # share, weight norms), imputed with medians: scores up to 0.27 apart from the runs alone
    runs = []
    for r in make_runs(6):
        S, L, H = (r.data.sizes[d] for d in ("snapshot", "layer", "head"))
        w = np.random.default_rng(len(runs)).normal(size=(S, L, H, 4, 6, 4)).astype(np.float32)
        runs.append(dataclasses.replace(r, data=r.data.assign(
            head_weights=(("snapshot", "layer", "head", "weight", "d_model", "d_head"), w))))
    padded = []
    for r in runs:
        wide = r.data.pad(head=(0, 1), d_head=(0, 2)).assign_coords(head=np.arange(r.data.sizes["head"] + 1))
        mask = np.arange(wide.sizes["head"]) < r.data.sizes["head"]
        padded.append(dataclasses.replace(r, data=wide.assign_coords(
            head_mask=(("layer", "head"), np.broadcast_to(mask, (wide.sizes["layer"], mask.size))))))
    assert "weight_norm_q_init" in predict.head_features(runs[0].data).feature.values
    opt = PredictOptions(target="importance", horizons=(0.1, 0.5), **FAST)
    plain, cut = predict.predict_runs(runs, opt), predict.predict_runs(padded, opt)
    np.testing.assert_array_equal(cut["score"].values, plain["score"].values)
    np.testing.assert_array_equal(cut["prediction"].values, plain["prediction"].values)


def test_the_folds_refused_as_one_class_are_named_by_seed_value(monkeypatch):
    # seed=10 came before seed=2 and seed=9 in text order
    from dynamics.predict import curve as curve_module

    fates = {2: np.ones((L, H), bool), 9: np.zeros((L, H), bool), 10: np.zeros((L, H), bool)}
    runs = [Run(f"r{s}", make_run(s, fate), seed=s) for s, fate in fates.items()]
    monkeypatch.setattr(curve_module, "cross_validate", lambda *a, **k: pytest.fail("fitted before refusing"))
    with pytest.raises(predict.PredictError, match=r"one class \(seed=2; seed=9; seed=10\), so no model"):
        predict.predict_runs(runs, PredictOptions(horizons=(0.1,), n_splits=3, boosting_iter=10))


# Known answers that mutants of this module passed (a mutation audit's): each pins a behaviour
# a mutant changed without any other test noticing.


@pytest.fixture(scope="module")
def seedless():
    """Three planted runs that record no seed, grouped by run: one fold per run."""

    runs = [Run(r.run_id, r.data, seed=None, config=r.config) for r in make_runs(n_seeds=3)]
    opt = PredictOptions(horizons=(0.1,), group_by="run", n_splits=3, boosting_iter=5)
    return predict.predict_runs(runs, opt)


def test_runs_without_a_seed_are_not_counted_as_sharing_one(seedless):
    # Mutant dropping `- {None}` from the seed-twin count: runs that record no seed all "shared"
    # the seed None, and every fold was flagged with the seed-twin caution.
    assert seedless.attrs["folds_sharing_seeds"] == 0
    assert "caution: in" not in predict.format_curve(seedless)


def _with_table(curve: xr.Dataset, mean: float, sd: float) -> xr.Dataset:
    out = curve.copy()
    out["score_mean"] = xr.full_like(curve["score_mean"], mean)
    out["score_std"] = xr.full_like(curve["score_std"], sd)
    return out


def test_three_folds_are_said_to_give_a_rough_sd(seedless):
    # Mutant `defined <= 3` -> `< 3`: with 3 scored folds the criterion line dropped "the sd
    # itself is rough", the case README's 3-fold curves are in.
    assert int(np.isfinite(seedless["score"].values).any(axis=(0, 1)).sum()) == 3
    text = predict.format_curve(_with_table(seedless, 0.6, 0.05))
    assert "where every model is scored (3 here)" in text and text.endswith("; with so few folds, the sd itself is rough")


def test_the_left_out_line_names_five_runs_and_counts_the_rest(seedless):
    # Mutant `ids[:5]` -> `ids[:4]`: four runs named "and 2 more" of seven hid one run entirely.
    curve = seedless.copy()
    curve.attrs = {**seedless.attrs, "runs_left_out": [f"x{i}" for i in range(7)]}
    assert "left out: 7 run(s) not completed, so without a final role: x0, x1, x2, x3, x4 and 2 more" in \
        predict.format_curve(curve)


def _chg_runs(codes_by_run: list[np.ndarray]) -> list[Run]:
    """Planted runs carrying a causal-head-gating class per head (2 x 8 heads) at every snapshot."""

    runs = []
    for r, codes in zip(make_runs(n_seeds=len(codes_by_run)), codes_by_run, strict=True):
        S = r.data.sizes["snapshot"]
        chg = np.broadcast_to(np.asarray(codes, dtype=np.int64), (S, *np.shape(codes)))
        runs.append(Run(r.run_id, r.data.assign(chg_role=(("snapshot", "layer", "head"), chg.copy())), seed=r.seed,
                        config=r.config))
    return runs


@pytest.fixture(scope="module")
def chg_curve():
    """Run r0 alone holds class 2, in one head; r1 and r2 hold classes 0 and 1 only (-1: not fitted)."""
    base = np.tile([0, 1], (2, 4))
    r0 = base.copy()
    r0[1, 7] = 2
    r1 = base.copy()
    r1[0, 0] = -1
    runs = _chg_runs([r0, base, r1])
    opt = PredictOptions(target="chg", horizons=(0.1,), group_by="run", n_splits=3, boosting_iter=5)
    return predict.predict_runs(runs, opt)


def test_one_unseen_head_is_one_head(chg_curve):
    # Mutant `> 1` -> `>= 1` in the plural: "2 (1 heads)".
    k = [str(g) for g in chg_curve["test_groups"].values].index("r0-base")
    from dynamics.predict.options import CHG_CLASSES

    assert str(chg_curve["unseen_classes"].values[k]) == f"{CHG_CLASSES[2]} (1 head)"
    assert [str(u) for j, u in enumerate(chg_curve["unseen_classes"].values) if j != k] == ["", ""]


def test_chg_classes_counts_and_chance_by_hand(chg_curve):
    # 3 runs x 16 heads, one head not fitted (-1): 47 labelled, class 0 ("facilitating" code 0
    # included, not taken for "not fitted") in 23, class 1 in 23, class 2 in 1. Chance is a constant
    # guess of a class each test fold holds: (1/2 + 1/3 + 1/2) / 3.
    assert chg_curve.sizes["head_row"] == 47
    assert chg_curve.attrs["classes"] == [0, 1, 2] and chg_curve.attrs["class_counts"] == [23, 23, 1]
    assert chg_curve.attrs["chance"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 2) / 3)


def test_pooled_score_is_the_metric_over_all_out_of_fold_predictions(seedless):
    # Mutant storing the fold mean as score_pooled: the documented "metric over all out-of-fold
    # predictions" (where a per-fold constant is no constant) was silently the mean again.
    from sklearn.metrics import roc_auc_score

    y = seedless["target"].values
    for m in MODELS:
        pred = seedless["prediction"].sel(horizon=0.1, model=m).values
        assert float(seedless["score_pooled"].sel(horizon=0.1, model=m)) == pytest.approx(roc_auc_score(y, pred))
    # the constant-per-fold chance row: pooled differs from its per-fold 0.5
    assert float(seedless["score_mean"].sel(horizon=0.1, model="chance")) == 0.5
    assert float(seedless["score_pooled"].sel(horizon=0.1, model="chance")) != pytest.approx(0.5)


def test_row_fold_is_the_fold_that_tests_the_row(seedless):
    # Mutant renumbering row_fold: a head's fold must be the one whose test_groups hold its run.
    for k, groups in enumerate(seedless["test_groups"].values):
        runs = sorted(set(seedless["row_run"].values[seedless["row_fold"].values == k]))
        assert ", ".join(runs) == str(groups)
    assert seedless["n_test"].values.tolist() == [int((seedless["row_fold"].values == k).sum()) for k in range(3)]


def test_the_null_check_counts_the_curves_that_say_legible_at_initialisation(planted):
    # Every run with the same fates, planted in its gradients from initialisation on: each null
    # curve is the real one, which the init-only models read as well as any, so every one says
    # "legible at initialisation" (a count stuck at 0 passed every test before this one).
    runs, opt, _ = planted
    fate = np.eye(L, H, dtype=bool)
    same = []
    for i, r in enumerate(runs):
        ds = make_run(i, fate)
        ds["grad_norm"].values[0, :, :, 0] *= np.exp(2.0 * fate)  # the fate readable at step 0 too
        same.append(Run(r.run_id, ds, seed=r.seed, config=r.config))
    curve = predict.predict_runs(same, dataclasses.replace(opt, null=3))
    assert "it is legible at initialisation" in curve.attrs["readable_summary"]
    assert curve.attrs["null_legible"] == 3 and curve.attrs["null_readable"] == 0
    assert 'and said "legible at initialisation" in 3 of 3 (100%)' in predict.format_curve(curve)


def test_the_null_check_judges_with_its_own_folds_holdout_shares(monkeypatch):
    # Each fold's n_test / n_train over the rows the null keeps (a run whose heads no other run
    # has is left out of it): the test's correction for shared training rows (a reviewer found
    # that dropping it, or counting every row, passed every test).
    from dynamics.predict import curve as cv
    from dynamics.predict.readable import holdout_ratios

    runs = make_runs(n_seeds=8)
    odd = runs[0].data.isel(head=slice(0, H - 1))
    runs.append(Run("odd", odd, seed=99, config="base"))
    got, real_judge, real_folds = [], cv.judge, cv.null_folds
    folds = []
    monkeypatch.setattr(cv, "null_folds", lambda *a: (folds.append(real_folds(*a)), folds[-1])[1])
    monkeypatch.setattr(cv, "judge", lambda *a, **k: (got.append(k["holdout"]), real_judge(*a, **k))[1])
    curve = predict.predict_runs(runs, PredictOptions(target="slash", horizons=(0.1,), null=2, **FAST))
    assert curve.attrs["null_left_out_runs"] == 1 and len(got) == 2
    keep, splits = folds[0]
    assert keep.size == curve.sizes["head_row"] - L * (H - 1)
    want = holdout_ratios([len(t) for _, t in splits], keep.size)
    assert len({round(float(r), 6) for r in want}) > 1  # folds of other sizes: a default 1/(K - 1) would differ
    for holdout in got:
        np.testing.assert_allclose(holdout, want)


def test_the_table_counts_each_test_folds_classes(chg_curve):
    # Known answer by construction: r0 holds 8 of class 0, 7 of class 1 and the one head of class
    # 2; r1 8 and 8; r2 7 (its head 0 unfitted) and 8. One head decides a fold's balanced accuracy.
    lines = predict.format_curve(chg_curve).splitlines()
    k = lines.index("classes: facilitating=23, irrelevant=23, interfering=1")
    assert lines[k + 1] == ("by test fold: r0-base: facilitating=8, irrelevant=7, interfering=1; r1-base: facilitating=8, "
                            "irrelevant=8; r2-base: facilitating=7, irrelevant=8")


def test_a_refusal_names_the_runs_left_out_as_damaged(monkeypatch):
    # Runs of one seed are refused (no second group to hold out); a damaged run the store also
    # held went unnamed there, where a curve's table names it (a README walk-through's)
    from dynamics.predict import curve as cv

    runs = make_runs(n_seeds=1, configs=("a", "b"))
    monkeypatch.setattr(cv, "load_store", lambda path, opt: (runs, ["r9-a (damaged)", "r8-a (stopped)"]))
    with pytest.raises(predict.PredictError, match=r"^grouping by seed: all 2 runs fall in one group .*; try --group run \(besides, left out as "
                                                r"damaged: r9-a\)$"):
        predict.predict_store("unused.zarr", PredictOptions(target="slash", horizons=(0.1,), **FAST))
    monkeypatch.setattr(cv, "load_store", lambda path, opt: (runs, ["r8-a (stopped)"]))
    with pytest.raises(predict.PredictError, match=r"try --group run$"):  # nothing damaged: as it was
        predict.predict_store("unused.zarr", PredictOptions(target="slash", horizons=(0.1,), **FAST))
