"""The drawing helpers the figures share: runs grouped into colours, line styles and markers,
legends, and the step axis."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from dynamics.report import _Run


def test_groups_differing_only_in_the_second_axis_look_different():
    from matplotlib.figure import Figure

    from dynamics.report.draw import _curves, _groups, _legend

    axes = ["model.init_scale", "train.lr", "train.seed"]
    runs = [_Run(f"r{i}{j}{s}", "completed", {"model.init_scale": scale, "train.lr": lr, "train.seed": s},
                 1.0, 3, np.ones(3, bool), np.arange(3))
            for i, scale in enumerate((0.5, 2.0)) for j, lr in enumerate((1e-3, 1e-2)) for s in (0, 1)]
    groups = _groups(runs, axes)
    assert len(groups.keys) == 4 and all(len(m) == 2 for m in groups.members.values())  # seeds pooled
    looks = {k: (groups.colours[k], str(groups.styles[k])) for k in groups.keys}
    marks = {k: (groups.colours[k], groups.markers[k]) for k in groups.keys}
    assert len(set(looks.values())) == 4 and len(set(marks.values())) == 4  # every group its own look
    same_scale = [k for k in groups.keys if json.loads(k[0]) == 0.5]
    assert groups.colours[same_scale[0]] == groups.colours[same_scale[1]]  # colour: init_scale, ranked
    assert groups.styles[same_scale[0]] != groups.styles[same_scale[1]]  # line style: lr
    assert {groups.labels[k] for k in same_scale} == {"init_scale=0.5, lr=0.001", "init_scale=0.5, lr=0.01"}
    assert "init_scale" in groups.title and "lr" in groups.title

    ax = Figure().subplots()
    _curves(ax, groups, {r.run_id: (np.arange(3), np.arange(3.0) + i) for i, r in enumerate(runs)})
    _legend(ax, groups)
    assert "lr" in ax.get_legend().get_title().get_text()
    means = {line.get_label(): line.get_linestyle() for line in ax.get_lines() if "mean of 2" in line.get_label()}
    assert means["init_scale=0.5, lr=0.001 (mean of 2)"] != means["init_scale=0.5, lr=0.01 (mean of 2)"]


def _scheduled_run(rid: str, steps: int, dense_until: int, every: int, scored: bool = True) -> _Run:
    import xarray as xr

    from dynamics.budget import snapshot_steps

    at = snapshot_steps(steps, dense_until, every)
    S = at.size
    analysis = xr.Dataset({"best_slash": (("snapshot", "layer", "head"), np.full((S, 1, 2), 0.3 if scored else np.nan)),
                           "slash_dominant": (("snapshot", "layer", "head"), np.zeros((S, 1, 2), bool)),
                           "role": (("snapshot", "layer", "head"), np.zeros((S, 1, 2), np.int8)),
                           "mean_divergence": (("snapshot",), np.full(S, 0.1))},
                          coords={"step": ("snapshot", at)}, attrs={"kappa": 0.5, "slash_offsets": [1, 8]})
    return _Run(rid, "completed", {"model.init_scale": 1.0, "train.seed": int(rid[-1])}, 1.0, S, np.ones(S, bool), at,
                analysis=analysis, analysis_source="stored")


def test_step_axes_follow_one_rule_in_every_store_and_figure(tmp_path, monkeypatch):
    # The axis followed the drawn steps' spread (last > 20 x the first after 0): quickstart's sweep
    # at 300 steps got a symmetric-log axis and at 16 a linear one, a schedule of every 10 steps
    # without a dense phase a symmetric-log one at 1000 steps; now a snapshot at step 1 (the
    # recorder's dense phase, record.dense_until >= 1) decides, for every figure of the report
    from dynamics.report import emergence
    from dynamics.report.data import _Ctx
    from tests._report_store import _capture_figures

    def drawn(name, runs):
        out = tmp_path / name
        out.mkdir()
        figs = _capture_figures(monkeypatch, emergence)
        sec = emergence._emergence_section(_Ctx(out / "x", runs, None, ["model.init_scale", "train.seed"], out, True))
        scales = {(rel, ax.get_xscale(), ax.get_xlabel()) for rel, fig in figs.items() for ax in fig.axes
                  if ax.get_visible()}
        return {(s, label) for _, s, label in scales}, [caption for _, caption in sec.figures]

    symlog = {("symlog", "training step (steps, symmetric-log axis)")}
    linear = {("linear", "training step (steps, linear axis)")}
    rule = ("every report draws it symmetric-log where a run recorded step 1 (record.dense_until >= 1, the default), "
            "linear where none did")
    for name, runs, want in (
            ("long", [_scheduled_run("a0", 300, 32, 50), _scheduled_run("a1", 300, 32, 50)], symlog),
            ("short", [_scheduled_run("b0", 16, 32, 50), _scheduled_run("b1", 16, 32, 50)], symlog),  # was linear
            ("sparse", [_scheduled_run("c0", 1000, 0, 10), _scheduled_run("c1", 1000, 0, 10)], linear),  # was symlog
            # the scored run is sparse; the unscored one (left out of the slash figure) recorded step 1
            ("mixed", [_scheduled_run("d0", 1000, 0, 10), _scheduled_run("d1", 16, 8, 4, scored=False)], symlog)):
        scales, captions = drawn(name, runs)
        assert scales == want, name
        assert len(captions) == 3 and all(rule in c for c in captions), name
        said = "Step axis symmetric-log" if want == symlog else "Step axis linear: no run recorded step 1"
        assert all(said in c for c in captions), name


def test_swept_values_with_dollar_signs_are_drawn_as_written():
    # A pair of `$` in a legend label is mathtext to matplotlib: a swept teacher store path
    # "runs/$a_$.zarr" raised ValueError at savefig, and the report lost the whole section.
    import io

    from dynamics.report.draw import _curves, _figure, _groups, _legend

    axes = ["intervene.distill.teacher", "train.seed"]
    paths = ["runs/$a_$.zarr", "runs/$b$.zarr"]
    runs = [_Run(f"r{i}", "completed", {"intervene.distill.teacher": p, "train.seed": 0}, 1.0, 3, np.ones(3, bool),
                 np.arange(3)) for i, p in enumerate(paths)]
    groups = _groups(runs, axes)
    fig = _figure(4, 3)
    ax = fig.subplots()
    _curves(ax, groups, {r.run_id: (np.arange(3), np.arange(3.0)) for r in runs})
    _legend(ax, groups)
    fig.savefig(io.BytesIO(), format="png")
    shown = [t._preprocess_math(t.get_text()) for t in ax.get_legend().get_texts()]  # (text drawn, as mathtext?)
    assert shown == [(f"teacher={p}", False) for p in paths]
    assert sorted(groups.labels.values()) == [f"teacher={p}" for p in paths]  # captions (HTML) keep the value as is


def test_save_writes_the_pixels_savefig_writes(tmp_path):
    # _save draws once where savefig drew twice (its layout run a second time): the same PNG
    # pixels are the claim, on a constrained figure of curves, an image, a colour bar and titles.
    from PIL import Image

    from dynamics.report.draw import _figure, _save

    def drawn():
        rng = np.random.default_rng(0)
        fig = _figure(9, 3)
        left, right = fig.subplots(1, 2)
        for k in range(4):
            left.plot(np.arange(30), rng.random(30), label=f"seed {k}")
        left.set_ylabel("a long label on the y axis (fraction)")
        left.legend(fontsize=7)
        fig.colorbar(right.imshow(rng.random((8, 8))), ax=right, label="weight")
        fig.suptitle("run r0 · step 10")
        return fig

    assert _save(drawn(), tmp_path, "ours.png") == "ours.png"
    drawn().savefig(tmp_path / "savefig.png", dpi=drawn().dpi)
    ours, theirs = (np.asarray(Image.open(tmp_path / f)) for f in ("ours.png", "savefig.png"))
    assert ours.shape == theirs.shape == (270, 810, 4)
    assert (ours == theirs).all()


def test_prose_sets_quoted_commands_as_code_after_escaping():
    from dynamics.report.draw import _plain, _prose

    assert _prose("run `dynamics analyse` on <a & b>") == "run <code>dynamics analyse</code> on &lt;a &amp; b&gt;"
    # markup inside the quotes is escaped too, and a lone backtick is left as written
    assert _prose("`<b>` and ` alone") == "<code>&lt;b&gt;</code> and ` alone"
    assert _plain("run `dynamics gates` here") == "run dynamics gates here"


def test_a_legend_of_many_groups_goes_outside_the_axes_and_the_figure_widens_for_it():
    # A 5 x 4 sweep's 20 groups: the legend inside the axes covered the curves and ran off the
    # figure. Eight or fewer stay inside, at matplotlib's best place.
    from types import SimpleNamespace

    from dynamics.report.draw import _figure, _legend

    for n, inside in ((8, True), (20, False), (42, False)):
        fig = _figure(6.5, 3.8)
        ax = fig.subplots()
        for i in range(n):
            ax.plot([0, 1], [i, i], label=f"group {i}")
        _legend(ax, SimpleNamespace(title="init_scale x lr"))
        if inside:
            assert ax.get_legend() is not None and not fig.legends
            assert tuple(fig.get_size_inches()) == (6.5, 3.8)
            # framed and mostly opaque: frameless, curves that "best" could not avoid ran through the text
            assert ax.get_legend().get_frame_on() and ax.get_legend().get_frame().get_alpha() == 0.8
            continue
        assert ax.get_legend() is None and len(fig.legends) == 1
        ncol = -(-n // 18)  # 18 a column
        assert fig.legends[0]._ncols == ncol
        assert fig.get_size_inches()[0] == 6.5 + 1.9 * ncol
        fig.canvas.draw()  # the panel keeps most of its width beside the legend
        assert ax.get_position().width * fig.get_size_inches()[0] > 4.0


def test_a_legend_outside_heightens_the_figure_by_its_own_lines_not_a_full_columns():
    # Sized for 18 rows whatever it held, a 9-entry legend made the roles figure (2.9 inches)
    # 3.75 inches tall; 9 lines and its title fit in 2.4. So did one entry of two lines (every
    # entry counted as tall as the tallest), and 19 entries in two columns (counted as 18 in one).
    from types import SimpleNamespace

    from dynamics.report.draw import _figure, _legend

    def drawn(labels, width=10.0):
        fig = _figure(width, 2.9)
        ax = fig.subplots()
        for i, label in enumerate(labels):
            ax.plot([0, 1], [i, i], label=label)
        _legend(ax, SimpleNamespace(title="init_scale x lr"))
        return fig

    # 9 entries, or 8 and one of two lines; 19 in two columns of 10 and 9, as matplotlib deals them
    for labels in ([f"group {i}" for i in range(9)], [*(f"g{i}" for i in range(8)), "two,\nlines"],
                   [f"group {i}" for i in range(19)]):
        fig = drawn(labels, 3.5)
        assert len(fig.legends) == 1 and fig.get_size_inches()[1] == 2.9, (len(labels), fig.get_size_inches())
    # 19 entries on a panel 2 inches high, the first of two lines: columns of 7, 6 and 6 entries,
    # the first (dealt the extra entry) holding 8 lines, and the title a ninth
    fig = _figure(3, 2)
    ax = fig.subplots()
    for i in range(19):
        ax.plot([0, 1], [i, i], label="a,\nb" if i == 0 else f"g{i}")
    _legend(ax, SimpleNamespace(title="t"))
    assert fig.legends[0]._ncols == 3 and fig.get_size_inches()[1] == pytest.approx(0.15 * 9 + 0.9)
    fig = drawn([f"entry {i}, two,\nlines" for i in range(18)], 3.5)  # 36 lines in two columns: taller
    assert fig.get_size_inches()[1] == pytest.approx(0.15 * (18 + 1) + 0.9)
    # four entries, but each wider than its panel: outside, not over the curves and the next panel
    wide = drawn([f"init_scale={s}, context=32, d_model=64, n_heads=4 (mean of 2)" for s in range(4)], 3.1)
    assert len(wide.legends) == 1 and wide.axes[0].get_legend() is None
    narrow = drawn([f"init_scale={s}" for s in range(4)], 3.1)
    assert not narrow.legends and narrow.axes[0].get_legend() is not None


def test_groups_that_differ_in_many_settings_get_wrapped_entries_and_panels_that_keep_their_size():
    # A store of runs that differ in 13 settings (the demo's beside a smaller model's): each entry
    # was one line of ~300 characters, the panels collapsed ("constrained_layout not applied") and
    # the legend covered them. Entries now break after commas, the legend goes outside, and the
    # figure widens by its longest line.
    import warnings

    from dynamics.report.draw import LABEL_WIDTH, _curves, _figure, _groups, _legend, _wrap

    keys = [f"model.setting_{c}" for c in "abcdefghijklm"]
    runs = [_Run(f"r{i}", "completed", {k: 1000 * (i + 1) + j for j, k in enumerate(keys)}, 1.0, 3,
                 np.ones(3, bool), np.arange(3)) for i in range(3)]
    groups = _groups(runs, keys)
    label = groups.labels[groups.keys[0]]
    assert label.replace(",\n", ", ") == ", ".join(f"setting_{c}={1000 + j}" for j, c in enumerate("abcdefghijklm"))
    assert all(len(line) <= LABEL_WIDTH for text in (label, groups.title) for line in text.split("\n"))
    assert label.count("\n") == 4  # 13 entries of 14-15 characters, three to a line of 48 at most
    assert _wrap("a" * 60 + ", b") == "a" * 60 + ",\nb"  # one part longer than a line keeps its own
    # a list value is one part, never broken at its own commas
    three = ["induction", "markov", "offset_copy"]
    mixture = _groups([_Run("m", "completed", {"task.components": three, "model.init_scale": 1.0},
                            1.0, 3, np.ones(3, bool), np.arange(3))], ["model.init_scale", "task.components"])
    assert mixture.labels[mixture.keys[0]] == "init_scale=1,\ncomponents=['induction', 'markov', 'offset_copy']"
    # a setting a run lacks (an [intervene] section) reads none, as in `dynamics status`, not Python's None
    lacking = _groups([_Run("n", "completed", {"model.init_scale": 1.0, "intervene.distill": None}, 1.0, 3,
                            np.ones(3, bool), np.arange(3))], ["model.init_scale", "intervene.distill"])
    assert lacking.labels[lacking.keys[0]] == "init_scale=1, distill=none"
    fig = _figure(6.5, 3.8)
    ax = fig.subplots()
    _curves(ax, groups, {r.run_id: (np.arange(3), np.arange(3.0) + i) for i, r in enumerate(runs)})
    _legend(ax, groups)  # 3 entries, but 15 lines: outside, as a legend of many entries
    assert ax.get_legend() is None and len(fig.legends) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied because axes sizes collapsed to zero"
        fig.canvas.draw()
    # the panel keeps its width (6.1 inches alone; 4.7 when the figure widened by 1.9 inches, as for short entries)
    assert ax.get_position().width * fig.get_size_inches()[0] > 5.5
    legend = fig.legends[0].get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1 and legend.x1 <= fig.bbox.x1 + 1  # beside it, inside the figure


def test_the_voita_sentence_counts_heads_peaking_one_back_that_are_labelled_otherwise():
    # `dynamics analyse` notes them under its table; the report's role captions said nothing, and
    # showed one previous-token head where Voita et al.'s rule gives two (the induction run's L0H2).
    from dynamics.analysis.roles import ROLES
    from dynamics.report.draw import _voita_sentence

    def run(rid, peak, roles):
        analysis = xr.Dataset({"previous_token_peak": (("snapshot", "layer", "head"), np.array([[[0.0] * 3], [peak]])),
                               "role": (("snapshot", "layer", "head"),
                                        np.array([[[8] * 3], [[ROLES.index(r) for r in roles]]], dtype=np.int8))})
        return _Run(rid, "completed", {}, 1.0, 2, np.ones(2, bool), np.arange(2), analysis=analysis)

    a = run("a", [0.99, 0.95, 0.5], ["local", "previous_token", "none"])  # one missed, one labelled, one below 0.9
    b = run("b", [0.9, 0.92, 0.1], ["none", "sink", "diffuse"])  # 0.9 meets the rule: two missed
    c = run("c", [0.2, 0.3, 0.1], ["none", "none", "none"])
    assert _voita_sentence([a], chosen=True).startswith(" 1 head(s) of this run put their largest weight one step back")
    said = _voita_sentence([a, b, c])
    assert said.startswith(" Previous-token heads: 3 head(s) put their largest weight one step back in >= 90% of rows")
    assert said.endswith("the analysis's previous_token_peak names them: a (1), b (2).")
    assert _voita_sentence([c]) == "" and _voita_sentence([_Run("d", "completed", {}, 1.0, 2, np.ones(2, bool),
                                                                  np.arange(2))]) == ""  # no analysis


def test_the_probe_sensitive_sentence_names_heads_whose_label_few_resamples_give():
    # `dynamics analyse` notes them under its table; the report's role captions say it too
    from dynamics.analysis.roles import ROLES
    from dynamics.report.draw import _probe_sensitive_sentence

    def run(rid, final, again):
        code = [ROLES.index(r) for r in final]
        analysis = xr.Dataset({"role": (("snapshot", "layer", "head"), np.array([[[8] * 2], [code]], dtype=np.int8)),
                               "role_resampled": (("resample", "layer", "head"),
                                                  np.array([[[ROLES.index(r) for r in row]] for row in again], np.int8))})
        return _Run(rid, "completed", {}, 1.0, 2, np.ones(2, bool), np.arange(2), analysis=analysis)

    # head 0 of a: 8 of 10 resamples give self (80%: named), else none twice; head 1: 9 of 10 (not named)
    a = run("a", ["self", "sink"], [["self", "sink"]] * 8 + [["none", "sink"], ["none", "local"]])
    b = run("b", ["local", "local"], [["none", "none"]] * 10)
    c = run("c", ["sink", "sink"], [["sink", "sink"]] * 10)
    assert _probe_sensitive_sentence([a], chosen=True) == (
        " Probe-sensitive roles: 1 head(s) of this run get their final label on fewer than 90% of 200 bootstrap "
        "resamples of their run's probe sequences, so other probes like these may label them otherwise "
        "(role_resampled): L0H0 self 80.0% (else none).")
    said = _probe_sensitive_sentence([a, b, c])
    assert said.startswith(" Probe-sensitive roles: 3 head(s) get their final label on fewer than 90%")
    assert said.endswith("(role_resampled): a (1), b (2).")
    many = [run(f"r{i}", ["self", "sink"], [["self", "sink"]] * 8 + [["none", "sink"]] * 2) for i in range(10)]
    assert _probe_sensitive_sentence(many).endswith(": r0 (1), r1 (1), r2 (1), r3 (1), r4 (1), r5 (1), r6 (1), r7 (1), "
                                                    "and 2 more run(s).")
    assert _probe_sensitive_sentence([c]) == "" and _probe_sensitive_sentence([_Run(
        "d", "completed", {}, 1.0, 2, np.ones(2, bool), np.arange(2))]) == ""  # no analysis


def test_a_legend_below_has_as_many_columns_as_its_longest_entry_leaves_room_for():
    # from a mutation audit: columns of 2.7 inches whatever the entries, four of 60 characters
    # (3.9 inches each) in a 10.8-inch figure overlapped in 4 columns
    from matplotlib.lines import Line2D

    from dynamics.report.draw import _figure, _legend_below, _wrap

    fig = _figure(10.8, 3)
    fig.subplots()
    _legend_below(fig, [Line2D([], [], label=f"{i}" + "x" * 59) for i in range(4)], "t")
    assert fig.legends[0]._ncols == 2
    assert _wrap("aaaa, bbbb", 10) == "aaaa, bbbb"  # a line of exactly the width stays one line


def test_a_swept_value_is_shown_compact_where_that_is_exact_and_whole_where_not():
    # "g" alone kept 6 significant digits: two learning rates shared one label in every legend and table
    from dynamics.report.draw import _fmt

    assert [_fmt(v) for v in (0.001, 1.0, 2.5e-5, 1e-12)] == ["0.001", "1", "2.5e-05", "1e-12"]
    assert _fmt(1.0000001e-3) == "0.0010000001" and _fmt(0.1234567) == "0.1234567"
    assert [_fmt(v) for v in (None, 3, "markov", float("nan"))] == ["none", "3", "markov", "nan"]


def test_runs_outside_a_sweep_differ_by_line_style_not_by_colour_alone():
    # tab10's green and red (runs 3 and 4) are one olive to a deuteranope, and both were solid:
    # the style changed only every 10 runs
    from dynamics.report.draw import _groups

    runs = [_Run(f"r{i:02d}", "completed", {}, 1.0, 3, np.ones(3, bool), np.arange(3)) for i in range(40)]
    groups = _groups(runs, [])
    looks = [(groups.colours[k], str(groups.styles[k])) for k in groups.keys]
    assert len(set(looks)) == 40  # every run its own colour and style together
    styles = [str(groups.styles[k]) for k in groups.keys]
    assert all(a != b for a, b in zip(styles, styles[1:], strict=False))  # neighbours in the legend too


def test_a_sweeps_colours_stay_visible_on_white():
    # viridis up to 0.9 gave the largest swept value a yellow-green of 1.5:1 against white
    from dynamics.report.draw import _groups

    runs = [_Run(f"r{i}", "completed", {"model.init_scale": 2.0 ** i, "train.seed": 0}, 1.0, 3, np.ones(3, bool),
                 np.arange(3)) for i in range(6)]
    groups = _groups(runs, ["model.init_scale", "train.seed"])

    def luminance(c):
        c = np.asarray(c[:3], dtype=float)
        c = np.where(c <= 0.03928, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
        return float(c @ [0.2126, 0.7152, 0.0722])

    assert min(1.05 / (luminance(groups.colours[k]) + 0.05) for k in groups.keys) >= 3.0  # WCAG's for graphics
