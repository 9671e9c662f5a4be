"""The causal head gating figure: CHG labels, gates recorded during training or fitted by
`dynamics gates`, and the colours and label shares it draws."""

from __future__ import annotations

import html
import json

import numpy as np
import xarray as xr

from dynamics import store
from dynamics.report import CHG_LABELS, _Run, chg_label, write_report
from tests._report_store import TINY, _capture_figures, _flip, _gates_dataset, _synthetic_store, _written_run


def test_chg_label_follows_the_paper_taxonomy():
    plus = np.array([0.9, 0.9, 0.1, 0.1, np.nan, 0.5])
    minus = np.array([0.9, 0.1, 0.1, 0.9, 0.5, 0.5])
    assert chg_label(plus, minus).tolist() == [*CHG_LABELS, "facilitating"]  # threshold counts as high


def test_a_swept_value_keeps_its_colour_in_every_figure(tmp_path, monkeypatch):
    from matplotlib import colormaps
    from matplotlib.colors import to_rgba

    from dynamics.config import from_dict
    from dynamics.report import chg

    points = {f"r{i}": {"model.init_scale": scale, "train.seed": 0} for i, scale in enumerate((0.5, 1.0, 2.0))}
    path = tmp_path / "s.zarr"
    _synthetic_store(path, points)
    cfg = from_dict(TINY)
    for rid in ("r1", "r2"):  # gates for the two larger scales only
        store.write_derived(path, f"gates.{rid}", _gates_dataset(cfg, seed=int(rid[1])))
    figs = _capture_figures(monkeypatch, chg)
    write_report(path, tmp_path / "out", run_id="r1", compute_missing=False)  # the CHG figure needs no analysis
    ax1 = figs["chg.png"].axes[0]
    dots = [c for c in ax1.collections if len(c.get_offsets()) == 4 and c.get_facecolors().shape[0]
            and c.get_facecolors()[0, 3] > 0]  # the runs' dots: 4 heads each (rings are hollow)
    viridis = colormaps["viridis"]
    # Ranked among all three runs of the sweep (the middle of viridis's 0..VIRIDIS_TOP), not among
    # the two that have gates, where init_scale 1.0 would take the colour of 0.5 in the curves.
    from dynamics.report.draw import VIRIDIS_TOP

    assert [tuple(np.round(c.get_facecolors()[0, :3], 4)) for c in dots] == [
        tuple(np.round(to_rgba(viridis(x))[:3], 4)) for x in (VIRIDIS_TOP / 2, VIRIDIS_TOP)]


def test_the_legend_of_runs_goes_below_the_panels_and_keeps_them_their_height(tmp_path, monkeypatch):
    # Anchored below the left panel, the legend was laid out inside that panel's space: runs that
    # differ in many settings (entries wrapped over several lines) squeezed it, and with it the row.
    from dynamics.config import from_dict
    from dynamics.report import chg

    settings = {f"model.setting_{c}": j for j, c in enumerate("abcdefghijkl")}
    points = {f"r{i}": {"model.init_scale": scale, "train.seed": 0, **{k: v + 100 * i for k, v in settings.items()}}
              for i, scale in enumerate((0.5, 1.0))}
    path = tmp_path / "s.zarr"
    _synthetic_store(path, points)
    cfg = from_dict(TINY)
    for i, rid in enumerate(points):
        store.write_derived(path, f"gates.{rid}", _gates_dataset(cfg, seed=i))
    figs = _capture_figures(monkeypatch, chg)
    write_report(path, tmp_path / "out", run_id="r1", compute_missing=False)
    fig = figs["chg.png"]
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1
    assert [t.get_text().replace(",\n", ", ") for t in fig.legends[0].get_texts()] == [
        "init_scale=" + ", ".join(f"{v:g}" if k == "model.init_scale" else f"{k.split('.')[1]}={v}"
                                  for k, v in p.items() if k != "train.seed") for p in points.values()]
    fig.canvas.draw()
    squares = [ax.get_position().height * fig.get_size_inches()[1] for ax in fig.axes[:2]]  # G+ against G-, 1:1
    assert min(squares) > 2.5, squares  # 2.86 inches without a legend; 1.87 with it anchored below the left one


def test_chg_labels_are_the_stored_majority_roles_not_the_mean_gates(tmp_path, monkeypatch):
    from dynamics.config import from_dict
    from dynamics.report import chg

    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0}})
    gates = _gates_dataset(from_dict(TINY))
    store.write_derived(path, "gates.r0", gates)
    mean = gates["chg"].mean("restart")
    assert chg_label(mean.sel(fit="plus"), mean.sel(fit="minus"))[0, 0] == "irrelevant"  # what averaging first says
    assert CHG_LABELS[int(gates["role"][0, 0])] == "facilitating"  # what `dynamics gates` says

    figs = _capture_figures(monkeypatch, chg)
    page = write_report(path, tmp_path / "out", compute_missing=False)  # the CHG figure needs no analysis
    bars = figs["chg.png"].axes[2]  # one fit: a bar per label
    share = {t.get_text(): [p.get_height()] for t, p in zip(bars.get_xticklabels(), bars.patches, strict=True)}
    expected = (gates["role"].values.ravel()[None, :] == np.arange(4)[:, None]).mean(1)
    assert [share[name][0] for name in CHG_LABELS[:3]] == expected[:3].tolist()
    assert share["facilitating"][0] >= 0.25  # head L0H0 counted as facilitating
    text = html.unescape(page.read_text())
    by_mean = chg_label(mean.sel(fit="plus"), mean.sel(fit="minus")).ravel()
    off = int((by_mean != np.asarray(CHG_LABELS)[gates["role"].values.ravel()]).sum())
    assert off >= 1  # head L0H0 at least: ringed, and counted in the caption
    assert "majority vote over restarts" in text and f"left: {off} of 4 heads" in text

    run = _Run("r0", "completed", {}, None, 9, np.zeros(9, bool), np.arange(9))
    pair, role, _ = chg._chg_of_run(path, run, ["gates.r0"])
    labels, stored = chg._chg_classes(pair, role)
    assert stored and labels.shape == (1, 4)
    assert labels[0].tolist() == [CHG_LABELS[c] for c in gates["role"].values.ravel()]
    # Without `role`, the majority of the per-restart codes: the same answer.
    codes = chg._role_codes(gates.drop_vars("role"), ("snapshot", "layer", "head"))
    assert codes.values.tolist() == gates["role"].values.tolist()


def test_derived_gates_sit_at_the_checkpoint_step_they_were_fitted_at(tmp_path):
    # `dynamics gates` on an interrupted run fits its checkpoint; the run may be resumed and
    # finished later, so its last recorded snapshot is not where those gates belong.
    from dynamics.config import from_dict
    from dynamics.report import chg

    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0}})
    run = _Run("r0", "completed", {}, None, 9, np.ones(9, bool), np.arange(9) * 10)
    gates = _gates_dataset(from_dict(TINY))
    store.write_derived(path, "gates.r0", gates)
    assert chg._chg_of_run(path, run, ["gates.r0"])[0]["step"].values.tolist() == [80]  # no step recorded
    store.write_derived(path, "gates.r0", gates.assign_attrs(step=30))
    assert chg._chg_of_run(path, run, ["gates.r0"])[0]["step"].values.tolist() == [30]


def test_a_damaged_gates_dataset_is_named_not_sent_to_the_runs_table(tmp_path):
    # "could not be read (see Runs)" for a run whose row said nothing: the damage was in
    # derived/gates.<run_id>, which the runs table does not read.
    from dynamics.config import from_dict

    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0},
                            "r1": {"model.init_scale": 2.0, "train.seed": 0}})
    store.write_derived(path, "gates.r0", _gates_dataset(from_dict(TINY)))
    store.write_derived(path, "gates.r1", _gates_dataset(from_dict(TINY)))
    _flip(path / "derived" / "gates.r0" / "chg" / "c")
    (path / "derived" / "gates.r1" / "chg" / "c" / "0" / "0" / "0" / "0").unlink()
    damaged: list[str] = []
    text = html.unescape(write_report(path, tmp_path / "out", on_damaged_data=damaged.append).read_text())
    assert len(damaged) == 2  # for the command's exit code 1
    assert damaged[0] == "run r0: its CHG gates could not be read (a chunk of derived/gates.r0 failed its checksum)"
    assert damaged[1].startswith(f"run r1: its CHG gates could not be read ({path}: derived/gates.r1: array chg has 1 of "
                                 "its 1 chunk(s) missing")
    assert "see Runs" not in text and "<td>damaged</td>" not in text
    assert ("Not available: CHG gates for 2 run(s) because they could not be read: r0 (a chunk of derived/gates.r0 "
            f"failed its checksum); r1 ({path}: derived/gates.r1: array chg has 1 of its 1 chunk(s) missing") in text
    assert f"the store has no readable derived gates.<run_id> dataset (<code>dynamics gates {path} --run ID</code> fits" in text
    assert "recorded no fitted chg" not in text  # each run named once, with its reason


def test_sections_with_nothing_derived_yet_name_the_command_that_writes_it(tmp_path):
    # "run the predictor on the finished sweep first" named no command; the CHG line named none.
    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0},
                            "r1": {"model.init_scale": 1.0, "train.seed": 1}})
    text = html.unescape(write_report(path, tmp_path / "out").read_text())
    assert ("Not available: the CHG scatter because no run recorded fitted <code>chg</code> gates (record.chg_every = "
            "0, or no fit reached yet) and the store has no derived gates.<run_id> dataset (<code>dynamics gates "
            f"{path} --run ID</code> fits and saves one for a run).") in text
    assert ("Not available: the predictor curves because the store has no derived predict.<target> dataset "
            f"(<code>dynamics predict {path}</code> writes one, from the finished sweep's runs).") in text
    # two completed runs of one seed: predict's grouping by seed has one group (exit 2): --group run
    for rid in ("r0", "r1"):
        store.update_run_attrs(path, rid, seed=0)
    text = html.unescape(write_report(path, tmp_path / "out2").read_text())
    assert (f"(<code>dynamics predict {path} --group run</code> writes one, from the finished sweep's runs; its "
            "completed runs share one seed (0), so they are grouped by run, where the default grouping by seed would "
            "have one group).") in text
    # one completed run: `dynamics predict` refuses the store (exit 2), so the page names no command
    one = tmp_path / "one.zarr"
    _synthetic_store(one, {"r0": {"model.init_scale": 1.0, "train.seed": 0}})
    text = html.unescape(write_report(one, tmp_path / "out1").read_text())
    assert ("Not available: the predictor curves because the store has 1 completed run(s), and <code>dynamics "
            "predict</code> needs at least 2 (the runs of a sweep: <code>dynamics sweep</code>).") in text


def test_a_gates_refit_saved_while_the_report_reads_the_last_one_is_read_as_one_version(tmp_path, monkeypatch):
    # The fit's step (an attribute) was read as the group opened and its gates after: a
    # `dynamics gates` saving a re-fit in between placed the re-fit's gates at the old fit's step.
    from dynamics.config import from_dict
    from dynamics.record import coords, snapshot_steps, variables
    from dynamics.report import chg
    from tests.test_store_races import exchange_at_first_read

    cfg = from_dict(TINY)
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    path, other = tmp_path / "s.zarr", tmp_path / "new.zarr"
    old, new = _gates_dataset(cfg, seed=2).assign_attrs(step=8), _gates_dataset(cfg, seed=3).assign_attrs(step=16)
    for p, gates in ((path, old), (other, new)):
        store.RunWriter(p, "r0", variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                        attrs={"status": "completed", "config": cfg.to_dict()}).finalize()
        store.write_derived(p, "gates.r0", gates)
    swapped = exchange_at_first_read(tmp_path, monkeypatch, "derived/gates.r0/chg/c", path / "derived" / "gates.r0",
                                     other / "derived" / "gates.r0")
    run = _Run("r0", "completed", {}, None, len(steps_at), np.ones(len(steps_at), bool), np.asarray(steps_at))
    pair, _, _ = chg._chg_of_run(path, run, ["gates.r0"])
    assert swapped
    assert pair["step"].values.tolist() == [16]
    np.testing.assert_allclose(pair.isel(snapshot=0).values, new["chg"].mean("restart").values, rtol=1e-6)
    # only what the panel reads is read: a bad chunk in another array of the fit (gates.fit_chg
    # writes nll, settle, agreement) hid the fit and made the report exit 1 (a review helper)
    monkeypatch.undo()
    store.write_derived(path, "gates.r0", new.assign(nll=("restart", np.arange(3.0))))
    _flip(path / "derived" / "gates.r0" / "nll" / "c")
    pair, _, source = chg._chg_of_run(path, run, ["gates.r0"])
    assert source.startswith("derived/gates.r0") and pair["step"].values.tolist() == [16]


def test_chg_shows_a_later_gates_refit_and_says_a_running_runs_fits_are_provisional(tmp_path, monkeypatch):
    # A run with gates recorded during training (steps 0 and 8) and a `dynamics gates` re-fit at
    # step 16: the "last fit" panel showed the step-8 fit, with no word of the re-fit, and nothing
    # said the run was still going (fits up to step 16 of 40).
    from dynamics.config import from_dict, with_values
    from dynamics.record import coords, snapshot_steps, variables
    from dynamics.report import chg
    from dynamics.report.data import _Ctx

    cfg = with_values(from_dict(TINY), {"record.chg_every": 4})
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    path = tmp_path / "s.zarr"
    writer = store.RunWriter(path, "r0", variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                             attrs={"status": "running", "config": cfg.to_dict()})
    recorded = np.full((2, 2, 2, 2), 0.8, np.float32)  # (fit snapshot, layer, head, fit): all facilitating
    for n, i in enumerate((0, 4)):  # steps 0 and 8
        writer.write_snapshot(i, {"chg": recorded[n], "chg_role": np.zeros((2, 2), np.int8)})
    writer.finalize()
    gates = _gates_dataset(cfg).assign_attrs(options={"restarts": 3, "steps": 500, "lam": 0.3, "threshold": 0.5})
    run = _Run("r0", "running", {}, None, len(steps_at), np.zeros(len(steps_at), bool), np.asarray(steps_at))

    def left_step(step):
        store.write_derived(path, "gates.r0", gates.assign_attrs(step=step))
        pair, _, source = chg._chg_of_run(path, run, ["gates.r0"])
        return int(pair["step"][-1]), source

    assert left_step(4) == (8, "recorded during training (chg)")  # the re-fit is of an earlier checkpoint
    refit = "derived/gates.r0 (`dynamics gates`, 3 restart(s) x 500 updates, lambda 0.3)"  # how it was fitted
    assert left_step(8) == (8, refit)  # same step: the explicit re-fit
    assert left_step(16) == (16, refit)

    figs = {}
    monkeypatch.setattr(chg, "_save", lambda fig, out, rel: figs.setdefault(rel, fig) and rel)  # read, not drawn
    sec = chg._chg_section(_Ctx(path, [run], "r0", [], tmp_path, False))
    left, middle = figs["chg.png"].axes[:2]
    dots = next(c for c in left.collections if len(c.get_offsets()) == 4)
    np.testing.assert_allclose(dots.get_offsets(), gates["chg"].mean("restart").values.reshape(4, 2), rtol=1e-6)
    path_dots = next(c for c in middle.collections if len(c.get_offsets()) == 8)  # 2 recorded fits x 4 heads
    assert np.allclose(path_dots.get_offsets(), 0.8)
    assert middle.get_title() == "run r0: each head over training so far"
    caption = sec.figures[0][1]
    assert f"Left: {refit} for run(s) r0. Middle and right: recorded during training (chg)." in caption
    assert "Run(s) r0 have fits recorded during training and a `dynamics gates` fit" in caption
    assert "so provisional (a run still training, stopped, or a fit of an earlier checkpoint): r0 (running, step 16 of 40)." in caption


def _completed_run_with_fits(tmp_path, fits):
    """A completed run of TINY whose CHG fits (every 4 snapshots) are `fits`: {snapshot: (gates as
    (L, H, 2) or a scalar, role codes as (L, H) or a scalar)}, negative snapshots from the end; the
    rest unfitted. Returns the store and the steps of its snapshots."""
    from dynamics.config import from_dict
    from dynamics.gates import UNFITTED
    from dynamics.record import coords, snapshot_steps, variables

    raw = json.loads(json.dumps(TINY))
    cfg = from_dict(raw | {"record": raw["record"] | {"chg_every": 4, "chg_steps": 5}})
    path = tmp_path / "s.zarr"
    _written_run(path, "r0", cfg, "completed")
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    S, L, H = len(steps_at), cfg.model.n_layers, cfg.model.n_heads
    assert (L, H) == (2, 2) and S >= 3
    gates = np.full((S, L, H, 2), np.nan, np.float32)
    roles = np.full((S, L, H), UNFITTED, np.int8)
    for i, (g, r) in fits.items():
        gates[i], roles[i] = g, r
    writer = store.RunWriter(path, "r0", variables=variables(cfg, S), coords=coords(cfg, steps_at), attrs={},
                             resume=True)
    writer.write_region("chg", 0, gates)
    writer.write_region("chg_role", 0, roles)
    writer.finalize()
    return path, steps_at


def test_chg_taxonomy_shares_over_training_are_fractions_of_the_heads_at_each_fit(tmp_path, monkeypatch):
    # A share over heads x fits (sum / labels.size) drew the same single-fit figure and halved
    # these two fits' shares: each point is the fraction of the 4 heads holding the label then.
    from dynamics.report import chg

    position = {0: (0.9, 0.9), 1: (0.9, 0.1), 2: (0.1, 0.1)}  # facilitating, irrelevant, interfering
    codes = {0: [0, 0, 0, 0], 2: [0, 1, 2, 2]}  # fitted at snapshots 0 and 2 only
    path, steps_at = _completed_run_with_fits(tmp_path, {
        i: (np.array([position[c] for c in cs]).reshape(2, 2, 2), np.array(cs).reshape(2, 2)) for i, cs in codes.items()})
    figs = _capture_figures(monkeypatch, chg)
    write_report(path, tmp_path / "out", compute_missing=False)
    ax3 = next(ax for ax in figs["chg.png"].axes if ax.get_ylabel() == "heads with this CHG label (fraction)")
    share = {line.get_label(): line.get_xydata().tolist() for line in ax3.get_lines()}
    at = [float(steps_at[0]), float(steps_at[2])]
    assert share["facilitating"] == [[at[0], 1.0], [at[1], 0.25]]
    assert share["irrelevant"] == [[at[0], 0.0], [at[1], 0.25]]
    assert share["interfering"] == [[at[0], 0.0], [at[1], 0.5]]
    # irrelevant and interfering coincide at the first fit: each its own marker, the first drawn
    # larger, so the later does not hide it
    looks = [(line.get_marker(), line.get_markersize()) for line in ax3.get_lines()]
    assert len(set(m for m, _ in looks)) == len(looks) and [s for _, s in looks] == sorted((s for _, s in looks),
                                                                                         reverse=True)


def test_the_left_panel_is_a_completed_runs_latest_fit_and_a_fit_at_its_last_step_is_not_provisional(
        tmp_path, monkeypatch):
    # Fits at the first snapshot (every gate 0.9, facilitating) and at the final step (0.1,
    # interfering): the panel titled "latest fit" must draw the 0.1s, and a completed run's fit
    # at its last step is final.
    from dynamics.report import chg

    path, _ = _completed_run_with_fits(tmp_path, {0: (0.9, 0), -1: (0.1, 2)})
    figs = _capture_figures(monkeypatch, chg)
    page = write_report(path, tmp_path / "out", compute_missing=False).read_text()
    dots = next(c for c in figs["chg.png"].axes[0].collections if len(c.get_offsets()) == 4)
    np.testing.assert_allclose(dots.get_offsets(), 0.1)
    assert "Causal head gating" in page and "provisional" not in page


def test_a_fit_made_at_another_threshold_is_labelled_ringed_and_captioned_at_it(tmp_path, monkeypatch):
    # GateOptions(threshold=0.8) (Python API): its stored labels were drawn against regions at 0.5,
    # ringed as differing from where they sit, and the caption said "threshold 0.5"
    from dynamics.config import from_dict
    from dynamics.report import chg

    cfg = from_dict(TINY)
    L, H = cfg.model.n_layers, cfg.model.n_heads
    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0}})
    g = np.resize(np.array([[0.9, 0.9], [0.7, 0.3], [0.9, 0.6], [0.3, 0.3]], np.float32), (1, L, H, 2))  # one restart
    codes = np.array([CHG_LABELS.index(x) for x in chg_label(g[..., 0], g[..., 1], 0.8).ravel()], np.int8)
    assert (codes != [CHG_LABELS.index(x) for x in chg_label(g[..., 0], g[..., 1]).ravel()]).any()  # 0.5 differs
    gates = xr.Dataset({"chg": (("restart", "layer", "head", "fit"), g),
                        "role": (("layer", "head"), codes.reshape(L, H))},
                       coords={"restart": [0], "layer": np.arange(L), "head": np.arange(H), "fit": ["plus", "minus"]},
                       attrs={"options": {"restarts": 1, "steps": 60, "lam": 0.1, "threshold": 0.8}})
    store.write_derived(path, "gates.r0", gates)
    figs = _capture_figures(monkeypatch, chg)
    text = html.unescape(write_report(path, tmp_path / "out", compute_missing=False).read_text())
    assert "both fractions in [0, 1], threshold 0.8. " in text
    assert "At the last fit no head's label differs from the region it is drawn in." in text
    vline, hline = figs["chg.png"].axes[0].get_lines()  # the regions' edges
    assert (vline.get_xdata()[0], hline.get_ydata()[0]) == (0.8, 0.8)


def test_over_training_is_the_run_fitted_most_often_and_the_caption_says_whose_fits_it_shows(tmp_path, monkeypatch):
    # The chosen run unfitted: the middle and right panels took the first run with any fit, a lone
    # `dynamics gates` fit (one point), while the caption said they showed another run's fits
    # recorded during training (found by an audit helper).
    from dynamics.config import from_dict, with_values
    from dynamics.record import coords, snapshot_steps, variables
    from dynamics.report import chg
    from dynamics.report.data import _Ctx

    cfg = with_values(from_dict(TINY), {"record.chg_every": 4})
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    path = tmp_path / "s.zarr"
    runs = []
    for rid, fitted in (("ra", ()), ("rb", (0, 4))):  # ra: a `dynamics gates` fit only; rb: fits at steps 0 and 8 too
        writer = store.RunWriter(path, rid, variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                                 attrs={"status": "running", "config": cfg.to_dict()})
        for i in fitted:
            writer.write_snapshot(i, {"chg": np.full((2, 2, 2), 0.8, np.float32), "chg_role": np.zeros((2, 2), np.int8)})
        writer.finalize()
        gates = _gates_dataset(cfg).assign_attrs(options={"restarts": 3, "steps": 500, "lam": 0.3, "threshold": 0.5})
        # ra's G- ranks its heads against their ablation cost, as `dynamics gates` warns (rho < 0.3)
        store.write_derived(path, f"gates.{rid}", gates.assign_attrs(step=8, rho={"ra": -0.143, "rb": 0.2}[rid]))
        runs.append(_Run(rid, "running", {}, None, len(steps_at), np.zeros(len(steps_at), bool), np.asarray(steps_at)))
    figs = {}
    monkeypatch.setattr(chg, "_save", lambda fig, out, rel: figs.setdefault(rel, fig) and rel)
    both = "Run(s) rb have fits recorded during training and a `dynamics gates` fit: the left panel shows the one at the later step (the `dynamics gates` one at the same step)"
    sec = chg._chg_section(_Ctx(path, runs, "rx", [], tmp_path, False))  # the chosen run has no fits
    assert figs.pop("chg.png").axes[1].get_title() == "run rb: each head over training so far"
    assert f"{both}, the middle and right panels the fits recorded during training." in sec.figures[0][1]
    # the page drew every head of ra "irrelevant"-or-so without the caution `dynamics gates` printed
    # rb, the middle panel's run, has training fits too: its `dynamics gates` fit, drawn on the left, is
    # named (merged with its training fits, it had been dropped)
    assert (" Caution: in the `dynamics gates` fit of run(s) ra (rho -0.143), rb (rho 0.200), G- ranks the heads "
            "against, or barely by, their single-head ablation cost (Spearman rho below 0.3, as `dynamics gates` "
            "warns)") in sec.figures[0][1]
    # the page says its per-run figures show rx: these panels say they do not
    assert ("middle and right: run rb over training (run rx, which the other per-run figures show, has no gate "
            "fits).") in sec.figures[0][1]
    sec = chg._chg_section(_Ctx(path, runs, "ra", [], tmp_path, False))  # chosen: its one fit over training
    fig = figs.pop("chg.png")
    assert fig.axes[1].get_title() == "run ra: each head at its fit, step 8"  # one fit: no course over training
    assert f"{both}." in sec.figures[0][1] and "which the other per-run figures show" not in sec.figures[0][1]
    # one fit, at step 8: its colour scale names that step alone, not 7.2 to 8.8
    colourbar = fig.axes[-1]
    assert [t.get_text() for t in colourbar.get_yticklabels()] == ["8"]
    # and its shares are a bar per label, not points at one x where equal shares hid one another
    shares = fig.axes[2]
    assert [t.get_text() for t in shares.get_xticklabels()][:3] == list(CHG_LABELS[:3])
    assert shares.get_xlabel() == "CHG label (the one fit, step 8)" and not shares.get_lines()
    assert np.isclose(sum(p.get_height() for p in shares.patches), 1.0)
