"""The emergence curves and the bifurcation figure: unfinished and single-head runs, the kappa and
offset window the captions name, and means over fewer seeds."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
import xarray as xr

from dynamics.report import _Run
from tests._report_store import _capture_figures


def _analysed_run(rid: str, status: str, scale: float, bifurcation: float, slash: float) -> _Run:
    steps = np.array([0, 10, 20, 40])
    analysis = xr.Dataset({"bifurcation_step": ((), bifurcation),
                           "slash_emergence_step": (("layer", "head"), np.full((1, 2), slash))},
                          coords={"step": ("snapshot", steps)}, attrs={"slash_offsets": [1, 5]})
    return _Run(rid, status, {"model.init_scale": scale, "train.seed": 0}, 1.0, 4, np.ones(4, bool), steps,
                analysis=analysis, analysis_source="stored")


def test_bifurcation_marks_unfinished_runs_and_says_what_the_mean_is(tmp_path, monkeypatch):
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    runs = [_analysed_run("done10", "completed", 1.0, 10.0, 20.0),
            _analysed_run("done30", "completed", 1.0, 30.0, np.nan),
            _analysed_run("never", "diverged", 2.0, np.nan, np.nan),
            _analysed_run("live", "running", 1.0, 4.0, np.nan),
            _analysed_run("stopped", "stopped", 2.0, np.nan, 20.0)]
    (tmp_path / "figures").mkdir()
    figs = _capture_figures(monkeypatch, emergence)
    sec = emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, ["model.init_scale", "train.seed"],
                                              tmp_path, True))
    ax = figs["bifurcation.png"].axes[0]  # bifurcation step against init_scale
    ticks = dict(zip([t.get_text() for t in ax.get_yticklabels()], ax.get_yticks(), strict=True))
    marks = []
    for c in ax.collections:
        face = c.get_facecolors()
        hollow = face.shape[0] == 0 or face[0, 3] == 0
        marks.extend((tuple(xy), hollow) for xy in c.get_offsets().tolist())
    assert ((1.0, 10.0), False) in marks and ((1.0, 30.0), False) in marks  # finished: filled
    assert ((1.0, 4.0), True) in marks  # unfinished, with a step so far: hollow
    assert ((2.0, ticks["never"]), False) in marks  # finished without the event: "never"
    assert ticks["40"] == 40 and ticks["never"] == 46  # the last step's tick kept below "never"
    assert ((2.0, ticks["not yet"]), True) in marks  # unfinished without it: "not yet", not "never"
    (mean_line,) = ax.get_lines()
    assert mean_line.get_xydata().tolist() == [[1.0, 20.0]]  # finished runs where it happened only
    assert mean_line.get_marker() not in (None, "None", "", " ")  # one point: a bare line drew nothing
    caption = sec.figures[0][1]
    assert "live (running)" in caption and "stopped (stopped)" in caption and "not yet" in caption
    assert "bifurcation: 1 of 3 finished run(s) never reached it, 1 of 2 unfinished run(s) not yet" in caption
    assert "mean over the finished runs where the event happened" in caption


def test_bifurcation_is_drawn_against_a_categorical_axis_when_no_numeric_one_is_swept(tmp_path, monkeypatch):
    # positional.toml sweeps model.pos alone: "Not available ... against init_scale, lr or n_heads",
    # though its question is when heads split under each scheme (and a numeric axis was drawn)
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    runs = []
    for i, (pos, step) in enumerate([("rope", 10.0), ("learned", 30.0), ("rope", 20.0), ("alibi", np.nan)]):
        run = _analysed_run(f"r{i}", "completed", 1.0, step, np.nan)
        run.params = {"model.pos": pos, "train.seed": i}
        runs.append(run)
    (tmp_path / "figures").mkdir()
    figs = _capture_figures(monkeypatch, emergence)
    sec = emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, ["model.pos", "train.seed"], tmp_path, True))
    assert not sec.missing or "Not available: bifurcation" not in " ".join(sec.missing)
    ax = figs["bifurcation.png"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rope", "learned", "alibi"]  # as they first appear
    marks = sorted(tuple(xy) for c in ax.collections for xy in c.get_offsets().tolist())
    never = dict(zip([t.get_text() for t in ax.get_yticklabels()], ax.get_yticks(), strict=True))["never"]
    assert marks == [(0.0, 10.0), (0.0, 20.0), (1.0, 30.0), (2.0, never)]
    (means,) = ax.get_lines()
    assert means.get_xydata().tolist() == [[0.0, 15.0], [1.0, 30.0]] and means.get_linestyle() == "None"


@pytest.mark.parametrize("axis, values, ticks", [
    ("model.n_heads", [1, 2, 4], ["1", "2", "4"]),  # matplotlib's own: 1.5 and 3.5 "heads per layer"
    ("model.init_scale", [0.5, 1.0, 2.0, 4.0], ["0.5", "1", "2", "4"]),  # not 2^-1 ... 2^2
    ("train.lr", [1e-3, 3e-3, 1e-2], ["0.001", "0.003", "0.01"]),  # 3e-3 was left unlabelled
])
def test_a_numeric_swept_axis_is_ticked_at_the_values_swept(tmp_path, monkeypatch, axis, values, ticks):
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    runs = []
    for i, v in enumerate(values):
        run = _analysed_run(f"r{i}", "completed", 1.0, 10.0 * (i + 1), np.nan)
        run.params = {axis: v, "train.seed": 0}
        runs.append(run)
    (tmp_path / "figures").mkdir()
    figs = _capture_figures(monkeypatch, emergence)
    emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, [axis, "train.seed"], tmp_path, True))
    ax = figs["bifurcation.png"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ticks
    assert list(ax.get_xticks()) == [float(v) for v in values] and not ax.xaxis.get_minorticklocs().size


def test_swept_values_too_close_to_label_side_by_side_keep_matplotlibs_ticks(tmp_path, monkeypatch):
    # lr 1e-4, 2e-4, 5e-4, ... at the values themselves read "0.00050.001" on the axis
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    values = [1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2]
    runs = []
    for i, v in enumerate(values):
        run = _analysed_run(f"r{i}", "completed", 1.0, 10.0 * (i + 1), np.nan)
        run.params = {"train.lr": v, "train.seed": 0}
        runs.append(run)
    (tmp_path / "figures").mkdir()
    figs = _capture_figures(monkeypatch, emergence)
    emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, ["train.lr", "train.seed"], tmp_path, True))
    fig = figs["bifurcation.png"]
    ax = fig.axes[0]
    fig.canvas.draw()
    assert list(ax.get_xticks()) != values
    boxes = sorted((t.get_window_extent() for t in ax.get_xticklabels() if t.get_text() and t.get_visible()),
                   key=lambda b: b.x0)
    shown = [b for b in boxes if ax.get_window_extent().x0 - 1 <= b.x0 and b.x1 <= ax.get_window_extent().x1 + 30]
    assert len(shown) >= 2 and all(a.x1 <= b.x0 for a, b in zip(shown, shown[1:], strict=False))


def test_captions_name_the_slash_window_and_the_unfinished_run(built):
    _, page, ids = built
    text = html.unescape(page.read_text())
    assert "best offset in 1..8" in text  # analyse_run's window: offsets 1..T // 2, T = 16
    assert "best offset >= 1" not in text
    assert f"Hollow marks: unfinished runs ({ids['C']} (stopped))" in text


def test_single_head_runs_are_not_drawn_as_never_bifurcating(tmp_path, monkeypatch):
    # One head per layer: no head pair, so mean_divergence is NaN throughout and bifurcation_step
    # is undefined; the figure must not put such a run on the "never" row as a finished run
    # that never bifurcated, nor give it a legend entry in the divergence curves.
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    steps = np.array([0, 10, 20, 40])

    def run(rid, heads, divergence, bifurcation):
        analysis = xr.Dataset({"bifurcation_step": ((), bifurcation),
                               "mean_divergence": (("snapshot",), np.asarray(divergence, float)),
                               "best_slash": (("snapshot", "layer", "head"), np.full((4, 1, heads), 0.2)),
                               "slash_dominant": (("snapshot", "layer", "head"), np.zeros((4, 1, heads), bool)),
                               "slash_emergence_step": (("layer", "head"), np.full((1, heads), np.nan))},
                              coords={"step": ("snapshot", steps)})
        return _Run(rid, "completed", {"model.n_heads": heads, "train.seed": 0}, 1.0, 4, np.ones(4, bool), steps,
                    analysis=analysis, analysis_source="stored")

    runs = [run("one", 1, [np.nan] * 4, np.nan), run("two", 2, [0.1, 0.1, 0.3, 0.4], 20.0)]
    (tmp_path / "figures").mkdir()
    figs = _capture_figures(monkeypatch, emergence)
    ctx = _Ctx(tmp_path / "x", runs, None, ["model.n_heads"], tmp_path, True)
    sec = emergence._bifurcation_section(ctx)
    top = figs["bifurcation.png"].axes[0]
    assert "never" not in [t.get_text() for t in top.get_yticklabels()]
    xs = [xy[0] for c in top.collections for xy in c.get_offsets().tolist()]
    assert xs == [2.0]  # the two-head run only
    caption = sec.figures[0][1]
    assert "bifurcation: 0 of 1 finished run(s) never reached it" in caption
    assert "one head per layer" in caption and "one" in caption.split("not 'never': ")[-1]

    sec = emergence._emergence_section(ctx)
    div = figs["emergence_divergence.png"].axes[0]
    assert [t.get_text() for t in div.get_legend().get_texts()] == ["n_heads=2"]
    assert "one head per layer" in sec.figures[-1][1]


def test_slash_caption_and_line_name_each_kappa_the_runs_were_analysed_with(tmp_path, monkeypatch):
    # Runs analysed with kappa 0.3 and 0.7: the caption and the dotted lines must show those,
    # not the default 0.5 that neither run used.
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    steps = np.array([0, 10, 20, 40])

    def run(rid, kappa):
        analysis = xr.Dataset({"best_slash": (("snapshot", "layer", "head"), np.full((4, 1, 2), 0.2)),
                               "slash_dominant": (("snapshot", "layer", "head"), np.zeros((4, 1, 2), bool)),
                               "mean_divergence": (("snapshot",), np.array([0.1, 0.1, 0.2, 0.3]))},
                              coords={"step": ("snapshot", steps)}, attrs={"kappa": kappa})
        return _Run(rid, "completed", {"model.init_scale": kappa, "train.seed": 0}, 1.0, 4, np.ones(4, bool), steps,
                    analysis=analysis, analysis_source="stored")

    (tmp_path / "figures").mkdir()
    figs = _capture_figures(monkeypatch, emergence)
    ctx = _Ctx(tmp_path / "x", [run("a", 0.3), run("b", 0.7)], None, ["model.init_scale"], tmp_path, True)
    caption = emergence._emergence_section(ctx).figures[0][1]
    assert "kappa = 0.3 or 0.7" in caption and "kappa = 0.5" not in caption
    ax = figs["emergence_slash.png"].axes[0]
    dotted = sorted(line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == ":")
    assert dotted == [0.3, 0.7]


def test_runs_with_no_slash_offset_to_score_are_left_out_of_the_slash_figure_and_named(tmp_path, monkeypatch):
    # Context 3: every offset of the window is one uniform attention passes, so best_slash is NaN
    # throughout. The run had a legend entry and no line, and the caption no word on why.
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    steps = np.array([0, 10, 20, 40])

    def run(rid, context, slash):
        analysis = xr.Dataset({"best_slash": (("snapshot", "layer", "head"), np.full((4, 1, 2), slash)),
                               "slash_dominant": (("snapshot", "layer", "head"), np.full((4, 1, 2), slash * 0)),
                               "mean_divergence": (("snapshot",), np.array([0.1, 0.1, 0.2, 0.3]))},
                              coords={"step": ("snapshot", steps)}, attrs={"slash_offsets": [1, context // 2]})
        return _Run(rid, "completed", {"model.context": context, "train.seed": 0}, 1.0, 4, np.ones(4, bool), steps,
                    analysis=analysis, analysis_source="stored")

    (tmp_path / "figures").mkdir()
    figs = _capture_figures(monkeypatch, emergence)
    ctx = _Ctx(tmp_path / "x", [run("short", 3, np.nan), run("long", 16, 0.2)], None, ["model.context"], tmp_path, True)
    sec = emergence._emergence_section(ctx)
    name, caption = sec.figures[0]
    assert name.endswith("emergence_slash.png")
    ax = figs["emergence_slash.png"].axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["context=16"]
    assert "offset in 1..8," in caption  # the window of the runs drawn, not 1..1 too
    assert caption.endswith("Left out of this figure: 1 run(s) whose probes are too short to score any slash offset "
                            "(no offset that uniform attention or a first-token sink does not already reach), so "
                            "their slash scores are undefined, not 0: short.")
    # nor drawn as "never" reaching slash-dominance in the bifurcation figure's bottom row
    runs = [run("short", 3, np.nan), run("long", 16, 0.2)]
    for r in runs:
        r.analysis = r.analysis.assign(bifurcation_step=((), 10.0), slash_emergence_step=(
            ("layer", "head"), np.full((1, 2), np.nan)))
    sec = emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, ["model.context"], tmp_path, True))
    bottom = figs["bifurcation.png"].axes[1]
    assert [tuple(xy)[0] for c in bottom.collections for xy in c.get_offsets().tolist()] == [16.0]
    assert "slash emergence: 1 of 1 finished run(s) never reached it" in sec.figures[0][1]
    assert sec.figures[0][1].endswith("Left out of the bottom row: 1 run(s) whose probes are too short to score any "
                                      "slash offset (no offset that uniform attention or a first-token sink does not "
                                      "already reach), so their slash scores are undefined, not 0: short.")
    figs.clear()
    sec = emergence._emergence_section(_Ctx(tmp_path / "x", [run("short", 3, np.nan)], None, ["model.context"],
                                            tmp_path, True))
    assert "emergence_slash.png" not in figs and not any(n.endswith("emergence_slash.png") for n, _ in sec.figures)
    assert ("Not available: slash curves because the probes of every analysed run are too short to score any slash "
            "offset (no offset that uniform attention or a first-token sink does not already reach), so their slash "
            "scores are undefined, not 0: short.") in sec.missing


def test_emergence_captions_say_where_the_mean_covers_fewer_seeds(built):
    # Runs B and C share init_scale 2, but C stopped after 6 of 9 snapshots: past them the
    # "mean of 2" line is B alone, and the caption must say so.
    _, page, _ = built
    captions = [c for c in re.findall(r"<figcaption>(.*?)</figcaption>", html.unescape(page.read_text()), re.S)
                if "against training step" in c]
    assert len(captions) == 3
    for caption in captions:
        assert ("(in init_scale=2, not every seed has a value at every step, e.g. a run still going, stopped or "
                "diverged: there the mean and band are over the seeds that have one)") in caption


def test_the_report_draws_a_categorical_axis_in_the_sweeps_order_not_by_run_id(tmp_path, tiny_config, monkeypatch):
    # positional.toml's question, when heads split under each scheme, was drawn with its schemes
    # in the store's order (run ids: hashes), so the x axis read in no order the config gave.
    from dynamics import store
    from dynamics.config import load_config
    from dynamics.report import emergence, write_report
    from dynamics.train import train_run
    from tests._report_store import _capture_figures

    out, path = tmp_path / "s.zarr", tiny_config(steps=20, every=5)
    ids = {}
    for pos in ("rope", "learned", "none"):
        cfg = load_config(path, [f"model.pos={pos}"])
        ids[pos] = cfg.run_id()
        train_run(cfg, str(out))
    order = sorted(ids, key=ids.get)  # by run id, the order the store lists them
    swept = order[::-1] if order != ["rope", "learned", "none"] else ["none", "rope", "learned"]
    assert swept != order
    store.write_sweep_index(str(out), {"axes": ["model.pos"], "runs": {ids[p]: {"model.pos": p} for p in swept}})
    figs = _capture_figures(monkeypatch, emergence)
    write_report(str(out), tmp_path / "r", on_note=lambda note: None)
    ax = figs[next(k for k in figs if k.endswith("bifurcation.png"))].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == swept


def test_bifurcation_count_labels_of_crowded_marks_do_not_overlap(tmp_path, monkeypatch):
    # 12 seeds of one init_scale reaching the event in pairs at steps 4..16 of a 300-step run: their
    # marks lie a few points apart, and "x2" set above each overlapped the next into a smear
    from matplotlib.text import Text

    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    steps = np.array([*range(33), *range(50, 301, 50)])

    def run(rid, scale, seed, bif):
        analysis = xr.Dataset({"bifurcation_step": ((), float(bif)),
                               "slash_emergence_step": (("layer", "head"), np.full((1, 2), 250.0 + 50 * (seed % 2)))},
                              coords={"step": ("snapshot", steps)}, attrs={"slash_offsets": [1, 5]})
        return _Run(rid, "completed", {"model.init_scale": scale, "train.seed": seed}, 1.0, steps.size,
                    np.ones(steps.size, bool), steps, analysis=analysis, analysis_source="stored")

    bifs = {1.0: [4, 4, 5, 5, 6, 6, 8, 8, 10, 10, 16, 16], 2.0: [20, 20, 22, 22, 24, 24, 150, 150, 200, 200, 200, 300],
            4.0: [np.nan] * 12}
    runs = [run(f"r{s}_{i}", s, i, b) for s, bs in bifs.items() for i, b in enumerate(bs)]
    figs = _capture_figures(monkeypatch, emergence)
    emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, ["model.init_scale", "train.seed"], tmp_path, True))
    fig = figs["bifurcation.png"]
    renderer = fig.canvas.get_renderer()
    top, bottom = fig.axes[:2]
    never = dict(zip([t.get_text() for t in top.get_yticklabels()], top.get_yticks(), strict=True))["never"]
    # every shared mark counted once, at its mark (the label's anchor)
    assert sorted((t.xy, t.get_text()) for t in top.texts) == sorted(
        [((1.0, float(b)), "\u00d72") for b in (4, 5, 6, 8, 10, 16)]
        + [((2.0, float(b)), "\u00d72") for b in (20, 22, 24, 150)] + [((2.0, 200.0), "\u00d73"), ((4.0, never), "\u00d712")])
    assert len(bottom.texts) == 6  # x6 at 250 and at 300 for each init_scale
    for ax in (top, bottom):
        inside = ax.get_window_extent(renderer)
        boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the text's, less its leader line
        for i, a in enumerate(boxes):
            assert inside.x0 <= a.x0 and a.x1 <= inside.x1 and inside.y0 <= a.y0 and a.y1 <= inside.y1
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (a, b)


def test_the_roles_caption_names_the_runs_whose_probes_lack_the_token(tmp_path, monkeypatch):
    # token_share is NaN at every head and snapshot where no probe holds the token (summary_row's
    # token_unseen): its runs can have no token head, which the role panels alone do not say
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    steps = np.array([0, 10, 20])

    def run(rid, seed, share, token_id=None):
        analysis = xr.Dataset({"role": (("snapshot", "layer", "head"), np.full((3, 1, 2), 8, np.int8)),
                               "mean_divergence": (("snapshot",), np.full(3, 0.1)),
                               "token_share": (("snapshot", "layer", "head"), np.full((3, 1, 2), share))},
                              coords={"step": ("snapshot", steps)},
                              attrs={} if token_id is None else {"token_id": token_id})
        return _Run(rid, "completed", {"model.init_scale": 1.0, "train.seed": seed}, 1.0, 3, np.ones(3, bool), steps,
                    analysis=analysis, analysis_source="stored")

    def roles_caption(runs):
        out = tmp_path / runs[0].run_id
        out.mkdir()
        sec = emergence._emergence_section(_Ctx(out / "x", runs, None, ["model.init_scale", "train.seed"], out, True))
        return next(c for rel, c in sec.figures if rel.endswith("emergence_roles.png"))

    why = "so none of their heads can be measured as a token head (a vocabulary without it, or too few probes"
    assert (f"Token roles: token 47 is in no probe sequence of 1 of these 3 runs (lack), {why}"
            in roles_caption([run("lack", 0, np.nan), run("hold", 1, 0.2), run("zero", 2, 0.0)]))
    assert (f"Token roles: token 5 is in no probe sequence of any of these 2 runs, {why}"
            in roles_caption([run("five", 0, np.nan, 5), run("five2", 1, np.nan, 5)]))
    assert "Token roles" not in roles_caption([run("seen", 0, 0.0), run("seen2", 1, 0.7)])  # 0 is a measured share
    # one run: "of any of these 1 runs ... none of their heads"
    assert ("Token roles: token 47 is in no probe sequence of this run, so none of its heads can be measured as a "
            "token head" in roles_caption([run("alone", 0, np.nan)]))


def test_count_labels_are_spread_within_the_axes_wherever_they_fit():
    # Crowds at both ends: shifting the whole column left the top label at 99.3 of 95.5
    from dynamics.report.emergence import _spread

    assert _spread([3.30, 18.39, 26.01, 82.15, 98.13], 9, 4.5, 95.5) == pytest.approx([4.5, 17.7, 26.7, 82.15, 95.5])
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n, height, low = int(rng.integers(1, 9)), float(rng.uniform(1, 15)), float(rng.uniform(0, 10))
        high = low + float(rng.uniform(0, 120))
        wanted = sorted(rng.uniform(low - 10, high + 10, n).tolist())
        out = _spread(wanted, height, low, high)
        assert all(b - a >= height - 1e-9 for a, b in zip(out, out[1:], strict=False))  # no two overlap
        if high - low >= (n - 1) * height:  # they fit: all within the bounds
            assert low - 1e-9 <= out[0] and out[-1] <= high + 1e-9, (wanted, height, low, high, out)
        room = all(b - a >= height for a, b in zip(wanted, wanted[1:], strict=False))
        if room and low <= wanted[0] and wanted[-1] <= high:
            assert out == pytest.approx(wanted)  # labels with room stay where they are wanted


def _layered(rid: str, status: str, mean: float, layers: list[float], slash: float = np.nan) -> _Run:
    run = _analysed_run(rid, status, 1.0, mean, slash)
    run.analysis = run.analysis.drop_vars("slash_emergence_step").assign(
        slash_emergence_step=(("layer", "head"), np.full((len(layers), 2), slash)),
        layer_bifurcation_step=("layer", np.asarray(layers, dtype=float)))
    return run


def test_the_bifurcation_caption_names_never_runs_whose_layers_left_their_bands(tmp_path, monkeypatch):
    # r04fe602335 of the demo (4 induction heads): `dynamics analyse` said "never (by layer: 32,
    # 100)", its layers' divergence moving apart and together at once; the report drew a "never"
    # cross and explained it by a large init_scale, at init_scale 1. A bifurcation can be a collapse too.
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    runs = [_layered("split", "completed", np.nan, [32.0, 100.0]), _layered("flat", "completed", np.nan, [np.nan, np.nan]),
            _layered("same", "completed", 20.0, [20.0, 20.0]), _layered("live", "running", np.nan, [10.0, np.nan])]
    (tmp_path / "figures").mkdir()
    _capture_figures(monkeypatch, emergence)
    sec = emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, ["model.init_scale", "train.seed"], tmp_path, True))
    caption = sec.figures[0][1]
    assert ("Runs on the 'never' row with a layer that left its own band while the mean over layers stayed in its "
            "own (a layer can, its change diluted by the others' or offset by them; `dynamics analyse` gives each "
            "layer's step): split (by layer: 32, 100). ") in caption  # not flat (no layer left), same (not never), live (unfinished)
    assert "rising (heads split) or falling (heads collapse together)" in caption


def test_a_store_without_a_swept_axis_lists_each_runs_steps(tmp_path):
    # A store of `dynamics run`s: the page said only "Not available ... no sweep index", while
    # `dynamics analyse` printed bifurcation 600 (by layer: never, 500) and slash emergence 700.
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    lone = _layered("lone", "completed", np.nan, [np.nan], slash=np.nan)  # one head per layer: no pair to compare
    lone.analysis = lone.analysis.isel(head=[0]).assign(mean_divergence=("snapshot", np.full(4, np.nan)),
                                                         best_slash=("snapshot", np.full(4, 0.1)))
    runs = [_layered("ind", "completed", 600.0, [np.nan, 500.0], slash=700.0),
            _layered("cut", "stopped", np.nan, [np.nan, np.nan], slash=np.nan), lone]
    for r in runs:
        r.params = {}
    # its range over resampled probes, as analyse prints it: "600 (probes: 500-never; by layer: never, 500)"
    runs[0].analysis["bifurcation_resampled"] = ("resample", np.array([500.0] * 20 + [600.0] * 160 + [np.nan] * 20))
    runs[1].analysis["bifurcation_resampled"] = ("resample", np.array([10.0] * 100 + [np.nan] * 100))  # unfinished: none
    sec = emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, [], tmp_path, True))
    (line,) = sec.missing
    assert line.startswith("Not available: bifurcation and emergence steps against a swept parameter because the "
                           "store has no sweep index. The steps, per run (bifurcation: ")
    # as the figure says them: a stopped run's "not yet", provisional; "undefined" with no pair of heads
    assert line.endswith(": ind: bifurcation 600 (probes: 500-never; by layer: never, 500), first slash-dominant head "
                         "700; cut (stopped: "
                         "provisional): bifurcation not yet, first slash-dominant head not yet; lone: bifurcation "
                         "undefined, first slash-dominant head never.")


def test_the_bifurcation_figure_grows_by_its_legends_lines_when_entries_wrap(tmp_path, monkeypatch):
    # Runs that differ in 13 settings: each legend entry wraps over 5 lines, and the figure grew by
    # one row of text per entry, so the legend crushed the panels above it.
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    extra = {f"model.setting_{c}": j for j, c in enumerate("abcdefghijkl")}
    runs = []
    for i, scale in enumerate((0.5, 1.0, 2.0, 4.0)):
        run = _analysed_run(f"r{i}", "completed", scale, 10.0 * (i + 1), np.nan)
        run.params.update({k: v + 100 * i for k, v in extra.items()})
        runs.append(run)
    (tmp_path / "figures").mkdir()
    figs = _capture_figures(monkeypatch, emergence)
    emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, ["model.init_scale", *extra], tmp_path, True))
    fig = figs["bifurcation.png"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert max(label.count("\n") for label in labels) == 4  # the runs' entries, 5 lines each
    fig.canvas.draw()
    panels = [ax.get_position().height * fig.get_size_inches()[1] for ax in fig.axes]
    assert min(panels) > 2.0, panels  # each panel about as tall as with a short legend (1.2 inches before)


def test_the_bifurcation_caption_says_where_a_mean_line_pools_runs_of_other_settings(tmp_path, monkeypatch):
    # A store of several base configs: the line at n_heads=4 averaged 1- and 2-layer induction,
    # offset_copy and a diverged run, and the caption read as a mean within one config.
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    (tmp_path / "figures").mkdir()
    _capture_figures(monkeypatch, emergence)
    one = [_analysed_run(f"r{i}", "completed", scale, 10.0 * (i + 1), np.nan) for i, scale in enumerate((1.0, 2.0))]
    sec = emergence._bifurcation_section(_Ctx(tmp_path / "x", one, None, ["model.init_scale"], tmp_path, True))
    assert "pools" not in sec.figures[0][1]  # one parameter: each line's points are one group each
    grid = []
    for i, (scale, lr) in enumerate((s, lr) for s in (1.0, 2.0) for lr in (1e-3, 1e-2)):
        run = _analysed_run(f"g{i}", "completed", scale, 10.0 * (i + 1), np.nan)
        run.params["train.lr"] = lr
        grid.append(run)
    sec = emergence._bifurcation_section(_Ctx(tmp_path / "x", grid, None, ["model.init_scale", "train.lr"],
                                              tmp_path, True))
    assert sec.figures[0][1].endswith(
        " Each line pools, at a value of its panel's parameter, runs that differ in init_scale, lr: a mean over "
        "those groups, not within one (the marks tell the groups apart).")


def test_emergence_captions_say_which_lines_end_at_a_divergence(tmp_path, monkeypatch):
    # The lines of an lr sweep's diverged runs stopped at their last finite snapshot, short of the
    # others', with no mark and no word (only the runs table said they diverged).
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    def run(rid, status, n, lr):
        steps = np.array([0, 10, 20, 40, 80])[:n]
        analysis = xr.Dataset({"best_slash": (("snapshot", "layer", "head"), np.full((n, 1, 2), 0.2)),
                               "slash_dominant": (("snapshot", "layer", "head"), np.zeros((n, 1, 2))),
                               "mean_divergence": (("snapshot",), np.linspace(0.1, 0.3, n))},
                              coords={"step": ("snapshot", steps)}, attrs={"slash_offsets": [1, 8]})
        return _Run(rid, status, {"train.lr": lr, "train.seed": 0}, 1.0, n, np.ones(n, bool), steps,
                    analysis=analysis, analysis_source="stored")

    (tmp_path / "figures").mkdir()
    _capture_figures(monkeypatch, emergence)
    fine = [run("ok", "completed", 5, 0.003)]
    diverged = [run(f"d{i}", "diverged", 4, 300.0) for i in range(5)]
    sec = emergence._emergence_section(_Ctx(tmp_path / "x", fine + diverged, None, ["train.lr"], tmp_path, True))
    assert len(sec.figures) == 2  # slash and divergence (no roles analysed)
    for _, caption in sec.figures:
        assert ("; the lines of 5 diverged run(s) end at their last snapshot before the divergence: d0, d1, d2, d3, "
                "and 1 more.") in caption
    sec = emergence._emergence_section(_Ctx(tmp_path / "x", fine, None, ["train.lr"], tmp_path, True))
    assert not any("diverged" in caption for _, caption in sec.figures)


def test_a_stopped_run_is_not_called_diverged_in_the_emergence_captions(tmp_path, monkeypatch):
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    def run(rid, status, n):
        steps = np.array([0, 10, 20, 40, 80])[:n]
        analysis = xr.Dataset({"best_slash": (("snapshot", "layer", "head"), np.full((n, 1, 2), 0.2)),
                               "slash_dominant": (("snapshot", "layer", "head"), np.zeros((n, 1, 2))),
                               "mean_divergence": (("snapshot",), np.linspace(0.1, 0.3, n))},
                              coords={"step": ("snapshot", steps)}, attrs={"slash_offsets": [1, 8]})
        return _Run(rid, status, {"train.lr": 0.003, "train.seed": 0}, 1.0, n, np.ones(n, bool), steps,
                    analysis=analysis, analysis_source="computed")

    (tmp_path / "figures").mkdir()
    _capture_figures(monkeypatch, emergence)
    sec = emergence._emergence_section(_Ctx(tmp_path / "x", [run("ok", "completed", 5), run("st", "stopped", 4)],
                                            None, ["train.lr"], tmp_path, True))
    assert sec.figures and not any("diverged run(s)" in caption for _, caption in sec.figures)


def test_a_finished_runs_bifurcation_carries_a_bar_of_its_range_over_resampled_probes(tmp_path, monkeypatch):
    # steps 10 (the 10th of the 200) .. 30 (past the 190th), and one whose top 5% never left the band: a bar to the
    # "never" row; a run whose resamples all agree, and an unfinished one, get none
    from matplotlib.collections import LineCollection

    from dynamics.report import emergence
    from dynamics.report.data import _Ctx

    def with_resamples(run, values):
        run.analysis["bifurcation_resampled"] = ("resample", np.asarray(values, dtype=float))
        return run

    runs = [with_resamples(_analysed_run("spread", "completed", 1.0, 20.0, np.nan), [10.0] * 10 + [20.0] * 170 + [30.0] * 20),
            with_resamples(_analysed_run("open", "completed", 2.0, 20.0, np.nan), [20.0] * 180 + [np.nan] * 20),
            with_resamples(_analysed_run("beside", "completed", 1.0, 30.0, np.nan), [20.0] * 10 + [40.0] * 190),
            with_resamples(_analysed_run("agree", "completed", 4.0, 20.0, np.nan), [20.0] * 200),
            # every resample at 20 where the step is 40 (>= 181 of 200 on one other step): said, as analyse says it
            with_resamples(_analysed_run("elsewhere", "completed", 8.0, 40.0, np.nan), [20.0] * 200),
            with_resamples(_analysed_run("live", "running", 4.0, 10.0, np.nan), [10.0] * 100 + [40.0] * 100),
            _analysed_run("older", "completed", 4.0, 40.0, np.nan)]  # analysed before the resamples
    (tmp_path / "figures").mkdir()
    figs = _capture_figures(monkeypatch, emergence)
    sec = emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, ["model.init_scale", "train.seed"],
                                              tmp_path, True))
    ax = figs["bifurcation.png"].axes[0]
    never = dict(zip([t.get_text() for t in ax.get_yticklabels()], ax.get_yticks(), strict=True))["never"]
    lines = [c for c in ax.collections if isinstance(c, LineCollection)]
    bars = sorted(tuple(map(tuple, seg)) for c in lines for seg in c.get_segments())
    assert bars == [((1.0, 10.0), (1.0, 30.0)), ((1.0, 20.0), (1.0, 40.0)), ((2.0, 20.0), (2.0, never)),
                    ((8.0, 20.0), (8.0, 20.0))]
    # the two at init_scale 1 side by side, 3 points apart, not one bar of their union
    at_1 = sorted(c.get_transform().transform((1.0, 20.0))[0] for c in lines if c.get_segments()[0][0][0] == 1.0)
    assert at_1[1] - at_1[0] == pytest.approx(3.0 * figs["bifurcation.png"].dpi / 72)
    assert "vertical bars: the 5% to 95% range of a finished run's bifurcation step over 200 bootstrap" in sec.figures[0][1]
    assert not figs["bifurcation.png"].axes[1].collections or not any(
        isinstance(c, LineCollection) for c in figs["bifurcation.png"].axes[1].collections)  # slash emergence: none
