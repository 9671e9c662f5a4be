"""Known answers for numbers the report draws and says, across its figure modules (draw, redundancy,
predictor, attention, data, emergence): each pins a rule a mutant of it broke while every other
report test passed (seeds aligned on their own steps, numeric ranks, the heads a matrix shows, the
sample sd, distillation stages, the default run, the colour axis, the assumed kappa)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from dynamics.report import _Run

AXES = ["model.init_scale", "train.seed"]


def _mean_lines(ax) -> dict:
    return {line.get_label(): line.get_xydata() for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_curves_align_seeds_on_their_own_steps_when_one_lacks_a_middle_step():
    """_curves aligns runs "on the union of their steps": a seed analysed at 0 and 20 only
    (not a prefix of the other's 0, 10, 20) contributes its 20-value at step 20, not at 10."""
    from dynamics.report.draw import _curves, _groups

    def run(rid, seed, steps):
        return _Run(rid, "completed", {"model.init_scale": 1.0, "train.seed": seed}, 1.0, len(steps),
                    np.ones(len(steps), bool), np.asarray(steps))

    runs = [run("a", 0, [0, 10, 20]), run("b", 1, [0, 20])]
    series = {"a": (np.array([0, 10, 20]), np.array([0.0, 1.0, 2.0])),
              "b": (np.array([0, 20]), np.array([4.0, 6.0]))}
    ax = Figure().subplots()
    _curves(ax, _groups(runs, AXES), series)
    # mean at 0: (0 + 4) / 2 = 2; at 10: a only, 1; at 20: (2 + 6) / 2 = 4
    assert _mean_lines(ax)["init_scale=1 (mean of 2)"].tolist() == [[0, 2.0], [10, 1.0], [20, 4.0]]


def test_groups_rank_numeric_swept_values_by_value_not_by_text():
    """Colour by rank of the first swept axis (viridis): 2 < 10 < 16 numerically, though "10" < "2" as text."""
    from matplotlib import colormaps

    from dynamics.report.draw import VIRIDIS_TOP, _groups

    runs = [_Run(f"r{v}", "completed", {"model.init_scale": v, "train.seed": 0}, 1.0, 3, np.ones(3, bool), np.arange(3))
            for v in (10.0, 2.0, 16.0)]
    groups = _groups(runs, AXES)
    assert [groups.labels[k] for k in groups.keys] == ["init_scale=2", "init_scale=10", "init_scale=16"]
    cmap = colormaps["viridis"]
    assert [groups.colours[k] for k in groups.keys] == [cmap(0.0), cmap(VIRIDIS_TOP / 2), cmap(VIRIDIS_TOP)]


def test_redundancy_matrix_skips_a_head_with_no_distances(tmp_path, monkeypatch):
    """A head whose JS distances are NaN (its diagonal missing) is left out of the dendrogram
    (linkage_matrix: leaf i is the i-th non-missing head); the matrix must show the same heads
    in the same order as the dendrogram's leaves, not rows of the full matrix by leaf number."""
    import xarray as xr

    from dynamics.report import redundancy
    from dynamics.report.data import _Ctx

    nan, far, near = np.nan, 0.6, 0.05
    last = np.array([[0, nan, near, far], [nan, nan, nan, nan], [near, nan, 0, far], [far, nan, far, 0]])
    js = xr.DataArray(last.reshape(1, 4, 1, 4), dims=("layer", "head", "layer_b", "head_b"),
                      coords={"layer": [0], "head": np.arange(4), "layer_b": [0], "head_b": np.arange(4)})
    analysis = xr.Dataset({"js_last": js}, attrs={"js_step": 30, "cluster_threshold": 0.2})
    run = _Run("rx", "completed", {}, 1.0, 2, np.ones(2, bool), np.array([0, 30]))
    ctx = _Ctx(tmp_path / "x", [run], "rx", [], tmp_path, True)
    ctx._chosen = (analysis, "stored")
    figs = {}
    monkeypatch.setattr(redundancy, "_save", lambda fig, out, rel: figs.setdefault(rel, fig) and rel)
    redundancy._redundancy_section(ctx)
    dendro, matrix = figs["redundancy.png"].axes[:2]
    leaves = [t.get_text() for t in dendro.get_xticklabels()]
    assert sorted(leaves) == ["L0H0", "L0H2", "L0H3"]
    order = [int(t[3:]) for t in leaves]
    shown = np.asarray(matrix.images[0].get_array())
    assert np.isfinite(shown).all()
    assert np.allclose(shown, last[np.ix_(order, order)])


def test_predictor_band_without_saved_edges_is_the_sample_sd_over_folds():
    """A curve saved without score_low/score_high: band mean -+ s.d. over the folds, the sample
    s.d. (ddof 1) that `dynamics predict` uses (predict/readable.py, predict/models.py)."""
    import xarray as xr

    from dynamics.report.predictor import _predict_lines

    score = np.array([[[0.5, 0.7, 0.9]], [[0.6, 0.6, 0.9]]])  # (horizon 2, model 1, fold 3)
    ds = xr.Dataset({"score": (("horizon", "model", "fold"), score)},
                    coords={"horizon": [0.5, 1.0], "model": ["linear"], "fold": np.arange(3)},
                    attrs={"metric": "auroc"})
    (line,), fold = _predict_lines(ds)
    name, x, mean, band, baseline = line
    assert fold == "fold" and name == "linear" and not baseline
    assert np.allclose(mean, [0.7, 0.7])
    # h 0.5: deviations -0.2, 0, 0.2 -> sd sqrt(0.08 / 2) = 0.2; h 1: -0.1, -0.1, 0.2 -> sqrt(0.06 / 2)
    sd = np.array([0.2, np.sqrt(0.03)])
    assert np.allclose(band[0], mean - sd) and np.allclose(band[1], mean + sd)


_DISTILL = {"distill": {"pairs": [[0, 0, 0, 0], [1, 0, 1, 0]], "order": "deep_first", "stage_steps": 10,
                        "attention_weight": 1.0, "logits_weight": 0.0, "teacher_run": "t1"}}


def test_deep_first_distillation_switches_the_deepest_layer_on_first():
    """deep_first: the deepest student layer at step 0, the next at stage_steps (distill.py); a
    run of 10 steps distilled layer 1 only, and the caption must say layer 0's stage never came."""
    from dynamics.report.attention import _distill_starts, _intervention_note

    assert _distill_starts(_DISTILL["distill"]) == {1: 0, 0: 10}
    note = _intervention_note(_DISTILL, steps=10)
    assert "attention of L1H0 distilled from run t1 (L0H0 (from step 10) never" in note


def test_a_distilled_head_whose_weight_ended_before_the_last_snapshot_is_named_as_distilled():
    """`weights` (snapshot, layer, head): a head distilled at some recorded snapshot was acted on,
    even when its schedule had ended (weight 0) by the last one."""
    from dynamics.report.attention import _intervention_note

    w = np.zeros((3, 2, 1))
    w[0, 1, 0] = 1.0  # layer 1: distilled early, schedule over by snapshot 2
    w[1:, 0, 0] = 0.5  # layer 0: on from snapshot 1 to the end
    note = _intervention_note(_DISTILL, steps=40, weights=w)
    assert "attention of L0H0, L1H0 distilled from run t1." in note and "never" not in note


def test_without_completed_runs_the_default_run_is_not_a_damaged_one():
    """_choose_run: without completed runs, the run with the most recorded snapshots, a damaged one last."""
    from dynamics.report import _choose_run

    def run(rid, status, n):
        rec = np.zeros(9, bool)
        rec[:n] = True
        return _Run(rid, status, {}, None, 9, rec, np.arange(9))

    assert _choose_run([run("a", "damaged", 9), run("b", "running", 3), run("c", "stopped", 2)]) == "b"


def test_slash_figure_draws_the_assumed_default_kappa_it_names():
    """Runs analysed with kappa 0.7 beside runs whose analysis does not say: the caption names the
    default as assumed for them, so its dotted line is drawn too."""
    import xarray as xr

    from dynamics.analysis.pipeline import AnalysisOptions
    from dynamics.report.emergence import _kappas

    default = AnalysisOptions().kappa
    said = _Run("a", "completed", {}, 1.0, 1, np.ones(1, bool), np.arange(1), analysis=xr.Dataset(attrs={"kappa": 0.7}))
    silent = _Run("b", "completed", {}, 1.0, 1, np.ones(1, bool), np.arange(1), analysis=xr.Dataset())
    kappas, text = _kappas([said, silent])
    assert f"{default:g} assumed" in text
    assert kappas == sorted({0.7, default})


def test_a_swept_axis_with_one_value_among_the_runs_does_not_take_the_colour():
    """_colour_axes: swept axes with more than one value; a constant one must not become the colour axis."""
    from dynamics.report.data import _colour_axes

    runs = [_Run(f"r{s}{i}", "completed", {"train.lr": 0.01, "model.init_scale": s, "train.seed": i}, 1.0, 3,
                 np.ones(3, bool), np.arange(3)) for s in (0.5, 2.0) for i in (0, 1)]
    index = {"axes": ["train.lr", "model.init_scale", "train.seed"]}
    assert _colour_axes(runs, index) == ["model.init_scale", "train.seed"]
