"""The early-role predictor's curves: the chance level, folds where the metric is undefined, the
capped band and its how-early answer, and curves made from other runs."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dynamics import store
from dynamics.analysis.pipeline import ANALYSIS_VERSION
from tests._report_store import _predict_curve


def _role_curve(chance_attr: float) -> xr.Dataset:
    """A role curve in the schema of dynamics.predict.predict_runs: 3 folds of 4 heads holding
    2, 2 and 4 of the 4 classes, so a constant guess of a class a fold holds scores 1/2, 1/2, 1/4."""
    models = ["chance", "layer", "init_linear", "init_boosting", "linear", "boosting"]
    target = np.array([0, 0, 0, 1, 0, 0, 0, 2, 0, 1, 2, 3], float)
    row_fold = np.repeat(np.arange(3), 4)
    score = np.full((2, len(models), 3), 0.4)
    return xr.Dataset(
        {"score": (("horizon", "model", "fold"), score), "target": ("head_row", target),
         "test_groups": ("fold", np.array(["seed=0", "seed=1", "seed=2"]))},
        coords={"horizon": [0.0, 0.5], "model": models, "fold": np.arange(3), "row_fold": ("head_row", row_fold)},
        attrs={"target": "role", "description": "role label at the final snapshot", "metric": "balanced_accuracy",
               "chance": chance_attr, "horizon_unit": "fraction", "group_by": "seed"})


def _drawn(curve: xr.Dataset, tmp_path, monkeypatch):
    """(store path, figures drawn by name, section) of a store holding `curve` as predict.slash."""
    from dynamics.report import predictor
    from dynamics.report.data import _Ctx

    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_derived(path, "predict.slash", curve)
    figs = {}
    monkeypatch.setattr(predictor, "_save", lambda fig, out, rel: figs.setdefault(rel, fig) and rel)
    return path, figs, predictor._predict_section(_Ctx(path, [], None, [], tmp_path, True))


def test_predictor_chance_line_leaves_out_folds_of_one_class(tmp_path, monkeypatch):
    # predict does not score a test fold of one class (a constant guess of it scores 1); the report
    # still counted such a fold at 1/1, and drew chance above every model.
    from dynamics.report import predictor
    from dynamics.report.data import _Ctx

    path = tmp_path / "s.zarr"
    store.init_store(path)
    curve = _role_curve(chance_attr=0.375)
    curve["target"][:4] = 0.0  # fold 0: one class
    curve["score"][:, :, 0] = np.nan
    store.write_derived(path, "predict.role", curve)
    figs = {}
    monkeypatch.setattr(predictor, "_save", lambda fig, out, rel: figs.setdefault(rel, fig) and rel)
    sec = predictor._predict_section(_Ctx(path, [], None, [], tmp_path, True))
    dotted = [ln for ln in figs["predict_role.png"].axes[0].get_lines() if ln.get_label().startswith("chance level")]
    assert len(dotted) == 1 and dotted[0].get_ydata()[0] == pytest.approx((0.5 + 0.25) / 2)
    caption = dict(sec.figures)["predict_role.png"]
    assert "mean over the scored folds" in caption
    assert ("balanced accuracy is undefined on 1 of 3 cross-validation folds holding out whole seeds (seed=0), whose "
            "test targets are one class") in caption


def test_predictor_chance_line_is_what_a_constant_guess_scores_and_undefined_folds_are_named(tmp_path, monkeypatch):
    # A curve stored before predict's chance level counted classes per test fold says 1/4 (the
    # table's classes): the dotted line sat below the chance model's own score, unexplained.
    from dynamics.report import predictor
    from dynamics.report.data import _Ctx

    path = tmp_path / "s.zarr"
    store.init_store(path)  # no runs: the section reads only derived/
    store.write_derived(path, "predict.role", _role_curve(chance_attr=0.25))
    slash = _predict_curve()
    slash["score"][:, :, :2] = np.nan  # two test folds with one class: AUROC undefined there
    slash["test_groups"] = ("fold", np.array(["seed=0", "seed=1", "seed=2"]))
    slash.attrs.update(runs_left_out=["rdiv (diverged)", "rbad (damaged)"], folds_sharing_seeds=1, n_splits=3,
                       runs_unlabelled=["rnochg (no CHG fit recorded: record.chg_every = 0)"])  # as predict tells them
    store.write_derived(path, "predict.slash", slash)
    # Every test fold one class (3 seeds, each all redundant or all not): predict prints n/a
    # throughout; the report said the curve "holds no numeric variable over horizon".
    unscored = _predict_curve().drop_vars(["score_mean", "score_std"])
    unscored["score"][:] = np.nan
    unscored["test_groups"] = ("fold", np.array(["seed=0", "seed=1", "seed=2"]))
    unscored.attrs.update(target="redundant")
    store.write_derived(path, "predict.redundant", unscored)
    figs = {}
    monkeypatch.setattr(predictor, "_save", lambda fig, out, rel: figs.setdefault(rel, fig) and rel)  # read, not drawn
    sec = predictor._predict_section(_Ctx(path, [], None, [], tmp_path, True))
    captions = dict(sec.figures)

    role_ax = figs["predict_role.png"].axes[0]
    dotted = [ln for ln in role_ax.get_lines() if ln.get_label().startswith("chance level")]
    assert len(dotted) == 1 and dotted[0].get_ydata()[0] == pytest.approx((0.5 + 0.5 + 0.25) / 3)
    assert dotted[0].get_label() == "chance level (0.42)"
    assert "chance level 0.42, what a constant guess of a class each test fold holds scores" in captions["predict_role.png"]
    assert "the training folds' majority class" in captions["predict_role.png"]
    # Written before curves were stamped with the analysers' version: its role targets may be old ones.
    assert (f"Stale: this curve was computed with analysers older than version stamping (this page: version "
            f"{ANALYSIS_VERSION})") in captions["predict_role.png"]

    text = captions["predict_slash.png"]
    assert "over 3 cross-validation folds" not in text
    assert "Stale" not in text
    assert ("AUROC is undefined on 2 of 3 cross-validation folds holding out whole seeds (seed=0; seed=1), whose "
            "test targets are one class: points are means over the other 1, no bar from one fold") in text
    # a damaged run was called "not completed", and runs without a label for the target were not named
    assert ("Left out: 1 run(s) not completed, so without a final role (rdiv (diverged)). Left out: 1 run(s) that "
            "could not be read (rbad (damaged)). Left out: 1 run(s) completed with no head labelled for this target "
            "(rnochg (no CHG fit recorded: record.chg_every = 0)).") in text
    assert "Caution: in 1 of 3 folds a test run shares its seed" in text
    assert "Left out" not in captions["predict_role.png"] and "Caution" not in captions["predict_role.png"]
    assert "predict_redundant.png" not in captions
    assert sec.missing == ["Not available: predictor curves for redundant because its AUROC is undefined on every test "
                           "fold of derived/predict.redundant (seed=0; seed=1; seed=2), whose test targets are one class."]


def test_the_predictor_caption_says_when_the_curve_was_made_from_other_runs():
    # A run stopped when `dynamics predict` ran and finished since: the caption said it was "left out,
    # not completed" beside a runs table listing it completed, and a deleted run went unmentioned.
    from types import SimpleNamespace

    from dynamics.report.predictor import _outdated

    curve = _predict_curve().assign_coords(run=["ra", "rb"])
    def ctx(**status):
        return SimpleNamespace(runs=[SimpleNamespace(run_id=r, status=s) for r, s in status.items()])
    assert _outdated(curve, ctx(ra="completed", rb="completed", rp="pending")) == ""
    assert _outdated(curve, ctx(ra="completed", rb="completed", rc="completed")) == (
        " Out of date: this curve was computed from other runs than the store's completed runs now: 1 completed "
        "run(s) it leaves out (rc); rerun `dynamics predict`.")
    assert _outdated(curve, ctx(ra="completed", rb="running")) == (
        " Out of date: this curve was computed from other runs than the store's completed runs now: 1 of its runs "
        "the store no longer holds as completed (rb); rerun `dynamics predict`.")
    # a damaged run (its attrs may still say completed): unreadable, not "no longer completed"
    assert _outdated(curve, ctx(ra="completed", rb="damaged")) == (
        " Out of date: this curve was computed from other runs than the store's completed runs now: 1 of its runs "
        "that can no longer be read (damaged: rb); rerun `dynamics predict`.")
    assert _outdated(_predict_curve(), ctx(rc="completed")) == ""  # a curve without its runs: nothing to compare


def test_predictor_band_is_the_capped_one_predict_saved_and_the_caption_gives_its_answer(tmp_path, monkeypatch):
    # With 2 folds mean + sd passes 1, which no fold can score: the figure filled mean -+ sd past
    # 1, where `dynamics predict` saved the band capped to [0, 1], and the caption did not say what
    # it had answered.
    from dynamics.predict.readable import readable_of
    from dynamics.report import predictor
    from dynamics.report.data import _Ctx

    curve = _predict_curve().isel(fold=[0, 1])
    curve["score"].loc[{"model": "linear"}] = [[0.5, 0.6], [0.55, 0.6], [0.7, 0.8], [0.8, 1.0], [0.9, 1.0]]
    curve["score_mean"] = curve["score"].mean("fold")
    curve["score_std"] = curve["score"].std("fold", ddof=1)
    assert float((curve["score_mean"] + curve["score_std"]).max()) > 1
    answer = readable_of(curve)
    curve["score_low"] = (("horizon", "model"), answer.low)
    curve["score_high"] = (("horizon", "model"), answer.high)
    curve["gain_t"] = (("horizon", "early_model"), answer.gain_t)  # saved by this version: its own answer
    curve.attrs["readable_summary"] = answer.line
    path, figs, sec = _drawn(curve, tmp_path, monkeypatch)
    ax = figs["predict_slash.png"].axes[0]
    tops = [float(p.vertices[:, 1].max()) for c in ax.collections for p in c.get_paths()]
    assert len(ax.collections) == 6 and max(tops) == 1.0  # linear's band reaches 1, capped; none passes it
    caption = dict(sec.figures)["predict_slash.png"]
    assert "bars: +-1 s.d. (capped to the metric's range) over 2 cross-validation folds" in caption
    assert answer.line.startswith("how early: ") and f" How early: {answer.line[len('how early: '):]}." in caption
    assert "Null check" not in caption
    # a curve saved with `dynamics predict --null N` says how often the criterion fired on permuted roles
    curve.attrs.update(null_permutations=40, null_readable=6, null_same_seed_runs=0)
    store.write_derived(path, "predict.slash", curve)
    sec = predictor._predict_section(_Ctx(path, [], None, [], tmp_path, True))
    assert (f" How early: {answer.line[len('how early: '):]}. Null check: on final roles permuted between runs with "
            "the same heads and other seeds, the criterion named a horizon in 6 of 40 permutations (15%).") in dict(
        sec.figures)["predict_slash.png"]
    del curve.attrs["null_same_seed_runs"]  # saved before seeds were kept apart: not said to have been
    store.write_derived(path, "predict.slash", curve)
    sec = predictor._predict_section(_Ctx(path, [], None, [], tmp_path, True))
    assert "permuted between runs with the same heads, the criterion" in dict(sec.figures)["predict_slash.png"]
    curve.attrs["null_same_seed_runs"] = 0
    curve.attrs.update(null_same_seed_runs=4)  # one seed held most runs: twins traded roles
    store.write_derived(path, "predict.slash", curve)
    sec = predictor._predict_section(_Ctx(path, [], None, [], tmp_path, True))
    assert "permuted between runs with the same heads and, where their set allows, other seeds, the criterion" in dict(
        sec.figures)["predict_slash.png"]
    assert ("in 6 of 40 permutations (15%); 4 runs could only trade with runs of their own seed, so it may "
            "overstate.") in dict(sec.figures)["predict_slash.png"]
    # permutations that could not be judged (a fold of one class) are no silent ones: the rate is
    # over the judged, and with none judged there is no rate
    for judged, said in ((30, "named a horizon in 6 of the 30 permutations it could judge (20%; 10 of 40 could not be)"),
                         (0, "Null check: none of the 40 permutations could be judged (their folds left fewer than 2 "
                             "scored for every model), so it says nothing here.")):
        curve.attrs.update(null_same_seed_runs=0, null_judged=judged)
        store.write_derived(path, "predict.slash", curve)
        sec = predictor._predict_section(_Ctx(path, [], None, [], tmp_path, True))
        assert said in dict(sec.figures)["predict_slash.png"]


def test_a_model_scoring_what_an_earlier_one_does_at_every_horizon_says_so_in_the_legend(tmp_path, monkeypatch):
    # The layer prior often scores what the chance model does: its dashed line covered chance's,
    # and the legend named a line nobody could see.
    from dynamics.report import predictor
    from dynamics.report.data import _Ctx

    path = tmp_path / "s.zarr"
    store.init_store(path)
    curve = _role_curve(chance_attr=0.25)
    curve["score"][:] = np.arange(6)[None, :, None] / 10 + np.arange(2)[:, None, None] / 100  # all apart
    curve["score"][:, 1] = curve["score"][:, 0]  # layer = chance, at both horizons
    curve["score"][0, 3] = curve["score"][0, 2]  # init_boosting = init_linear at the first horizon only
    store.write_derived(path, "predict.role", curve)
    figs = {}
    monkeypatch.setattr(predictor, "_save", lambda fig, out, rel: figs.setdefault(rel, fig) and rel)
    predictor._predict_section(_Ctx(path, [], None, [], tmp_path, True))
    lines = {ln.get_label(): ln for ln in figs["predict_role.png"].axes[0].get_lines()}
    assert [label for label in lines if not label.startswith("chance level")] == [
        "chance (baseline)", "layer (baseline; the same scores as chance at every horizon)", "init_linear (baseline)",
        "init_boosting (baseline)", "linear", "boosting"]
    covering = lines["layer (baseline; the same scores as chance at every horizon)"]
    assert (covering.get_marker(), covering.get_markerfacecolor()) == ("s", "none")  # drawn around, not over
    assert lines["linear"].get_marker() == "o"
    # the init-only baselines, green and red, one olive to a deuteranope: told apart by their markers
    assert lines["init_linear (baseline)"].get_marker() != lines["init_boosting (baseline)"].get_marker()


def test_the_caption_marks_every_horizon_that_saw_a_final_snapshot():
    # The caption named a ceiling only at h = 1 of a fraction curve: a --unit step curve whose last
    # horizon is the runs' final step, or h = 0.5 that reached a short run's end, went unmarked,
    # while `dynamics predict` flagged them and its how-early line (in the same caption) said so.
    from dynamics.report.predictor import _ceiling

    curve = _predict_curve().assign_coords(run=["ra", "rb"])  # horizons 0, 0.1, 0.25, 0.5, 1
    assert _ceiling(curve, "fraction") == (" h = 1 sees a run's final snapshot, which defines the target: a ceiling, "
                                           "not a prediction.")  # saved without the steps it saw
    seen = np.array([[0, 0], [10, 10], [20, 25], [50, 40], [100, 40]], float)
    stepped = curve.assign(horizon_step=(("horizon", "run"), seen), final_step=("run", [100.0, 40.0]))
    assert _ceiling(stepped, "fraction").startswith(" h = 0.5, h = 1 see a run's final snapshot")
    stepped = stepped.assign_coords(horizon=[0.0, 10.0, 25.0, 50.0, 100.0])
    assert _ceiling(stepped, "step").startswith(" step 50, step 100 see a run's final snapshot")
    early = stepped.isel(horizon=[0, 1, 2])
    assert _ceiling(early, "step") == ""


def test_a_curve_of_one_horizon_shows_each_models_band_as_an_error_bar(tmp_path, monkeypatch):
    # `dynamics predict` measures one horizon by default: fill_between over one x draws nothing,
    # so the band the caption describes was invisible and the models bare dots.
    from matplotlib.collections import LineCollection

    curve = _predict_curve().isel(horizon=[2])
    low = np.linspace(0.1, 0.6, curve.sizes["model"])[None, :]
    curve["score_low"], curve["score_high"] = (("horizon", "model"), low), (("horizon", "model"), low + 0.2)
    path, figs, sec = _drawn(curve, tmp_path, monkeypatch)
    assert "(one horizon measured: the models side by side)" in dict(sec.figures)["predict_slash.png"]
    ax = figs["predict_slash.png"].axes[0]
    bars = [c for c in ax.collections if isinstance(c, LineCollection)]
    spans = sorted((round(float(s[:, 1].min()), 6), round(float(s[:, 1].max()), 6)) for c in bars for s in c.get_segments())
    assert spans == [(round(a, 6), round(a + 0.2, 6)) for a in low[0]]
    # side by side in the legend's order, at one tick naming the horizon
    assert sorted(float(s[0, 0]) for c in bars for s in c.get_segments()) == list(range(curve.sizes["model"]))
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"{float(curve['horizon'][0]):g}"]
    assert "the one horizon measured" in ax.get_xlabel()


def test_over_several_horizons_each_models_band_is_a_bar_beside_the_others_at_each_horizon(tmp_path, monkeypatch):
    # Six shaded bands at alpha 0.12, one over another, had blurred into one grey, in which no
    # model's spread could be told from another's.
    from matplotlib.collections import LineCollection, PolyCollection

    curve = _predict_curve()
    H, M = curve.sizes["horizon"], curve.sizes["model"]
    low = np.linspace(0.1, 0.6, H * M).reshape(H, M)
    curve["score_low"], curve["score_high"] = (("horizon", "model"), low), (("horizon", "model"), low + 0.2)
    _, figs, sec = _drawn(curve, tmp_path, monkeypatch)
    ax = figs["predict_slash.png"].axes[0]
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]  # no shaded band
    bars = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(bars) == M
    horizons = curve["horizon"].values.astype(float)
    for m, (bar, line) in enumerate(zip(bars, [ln for ln in ax.get_lines() if ln.get_label() != "_nolegend_"],
                                        strict=False)):
        segments = bar.get_segments()
        xs = np.array([s[0, 0] for s in segments])
        # each model's bar spans its saved band, at its own point's x
        np.testing.assert_allclose([s[:, 1].min() for s in segments], low[:, m])
        np.testing.assert_allclose([s[:, 1].max() for s in segments], low[:, m] + 0.2)
        np.testing.assert_allclose(xs, line.get_xdata())
    xs = np.array([[s[0, 0] for s in bar.get_segments()] for bar in bars])  # (model, horizon)
    assert (np.diff(xs, axis=0) > 0).all()  # in the legend's order, left to right, at every horizon
    gap = np.diff(horizons).min()
    assert (np.abs(xs - horizons[None, :]) < gap / 2).all()  # each point nearer its own horizon than the next
    assert [float(t) for t in ax.get_xticks()] == horizons.tolist()  # ticked at the horizons measured
    assert "(at each horizon the models' points a little apart, in the legend's order)" in dict(sec.figures)[
        "predict_slash.png"]


def test_the_missing_curve_names_target_role_where_no_head_ends_slash_dominant(tmp_path):
    # On the quickstart's store `dynamics predict STORE` is refused (slash constant): the note
    # named that command as the one that writes the curve.
    from dynamics.report import _Run, predictor
    from dynamics.report.data import _Ctx

    def run(rid, final):
        dominant = np.zeros((2, 1, 2))
        dominant[-1, 0] = final
        analysis = xr.Dataset({"slash_dominant": (("snapshot", "layer", "head"), dominant)},
                              coords={"step": ("snapshot", [0, 10])})
        return _Run(rid, "completed", {}, 1.0, 2, np.ones(2, bool), np.array([0, 10]), analysis=analysis)

    path = tmp_path / "s.zarr"
    store.init_store(path)
    (missing,) = predictor._predict_section(_Ctx(path, [run("a", [0, 0]), run("b", [0, np.nan])], None, [],
                                                 tmp_path, True)).missing
    assert (f"(`dynamics predict {path} --target role` writes one, from the finished sweep's runs; no completed run "
            "has a slash-dominant head, so the default target, slash, is constant there).") in missing
    (missing,) = predictor._predict_section(_Ctx(path, [run("a", [0, 0]), run("b", [0, 1])], None, [], tmp_path,
                                                 True)).missing
    assert f"(`dynamics predict {path}` writes one, from the finished sweep's runs)." in missing


def test_the_caption_says_which_test_passes_or_fails():
    # "passes the test" named no test on the page, which has no criterion line under it
    from dynamics.report.predictor import _how_early

    curve = _predict_curve()
    curve.attrs["readable_summary"] = "how early: not readable at any horizon measured (h=0 to h=0.5): ..."
    assert "The test:" not in _how_early(curve)  # saved before the test: not this one's answer
    curve["gain_t"] = (("horizon", "early_model"), np.zeros((curve.sizes["horizon"], 2)))
    said = _how_early(curve)
    assert said.startswith(" How early: not readable") and said.endswith(
        " The test: a one-sided paired t-test at 0.05 on each fold's gain over the best baseline there, with Nadeau "
        "and Bengio's correction for the training runs the folds share; the bars drawn are each model's own spread, "
        "not what it compares.")
    curve.attrs["readable_alpha"] = 0.01  # the level saved with the curve, not a constant of the report's
    assert " The test: a one-sided paired t-test at 0.01 on each fold's gain" in _how_early(curve)


def test_a_role_curve_says_how_many_of_its_targets_are_probe_sensitive(tmp_path, monkeypatch):
    # as `dynamics predict` prints it under the table: 3 of the 12 targets' labels held on fewer
    # than 90% of the probe resamples, one head was not measured
    curve = _role_curve(chance_attr=0.25)
    curve["target_agreement"] = ("head_row", [1.0] * 8 + [0.5, 0.895, 0.6, np.nan])
    _, _, sec = _drawn(curve, tmp_path, monkeypatch)
    (caption,) = dict(sec.figures).values()
    assert (" Probe-sensitive targets: 3 of the 11 heads measured get their final label on fewer than 90% of 200 "
            "bootstrap resamples of their run's probes") in caption
    assert "(target_agreement)." in caption
    curve["target_agreement"] = ("head_row", [0.9] * 12)
    _, _, sec = _drawn(curve, tmp_path / "again", monkeypatch)
    assert "Probe-sensitive" not in next(iter(dict(sec.figures).values()))


def test_a_curve_saved_while_the_report_reads_it_is_read_as_one_version(tmp_path, monkeypatch):
    # The section checked the group's version as it opened it and loaded the values after: a
    # `predict` saving another curve in between gave the old curve's horizons and attributes
    # with the new one's scores, drawn as the old horizons.
    from dynamics.report import predictor
    from dynamics.report.data import _Ctx
    from tests.test_store_races import exchange_at_first_read

    path, other = tmp_path / "s.zarr", tmp_path / "new.zarr"
    old = _role_curve(0.375).assign_attrs(marker=1)
    new = (old.assign(score=old.score * 0 + 0.8).assign_coords(horizon=[0.2, 0.9]).assign_attrs(marker=2))
    for p, curve in ((path, old), (other, new)):
        store.init_store(p)
        store.write_derived(p, "predict.role", curve)
    seen, lines = [], predictor._predict_lines
    monkeypatch.setattr(predictor, "_predict_lines", lambda ds: seen.append(ds) or lines(ds))
    swapped = exchange_at_first_read(tmp_path, monkeypatch, "derived/predict.role/score/c",  # not the horizon index's
                                     path / "derived" / "predict.role", other / "derived" / "predict.role")
    monkeypatch.setattr(predictor, "_save", lambda fig, out, rel: rel)
    predictor._predict_section(_Ctx(path, [], None, [], tmp_path, True))
    assert swapped and len(seen) == 1
    assert seen[0].attrs["marker"] == 2 and seen[0]["horizon"].values.tolist() == [0.2, 0.9]
    assert (seen[0]["score"].values == 0.8).all()
