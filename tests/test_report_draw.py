"""The drawing helpers the figures share: runs grouped into colours, line styles and markers,
legends, and the step axis."""

from __future__ import annotations

import json

import numpy as np

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


def test_step_axis_is_symlog_for_a_geometric_schedule_only_however_many_runs():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dynamics.report.draw import _step_axis

    linear, geometric = np.arange(0, 1001, 100.0), np.array([0, 1, 2, 4, 8, 16, 32, 100, 500, 1000.0])
    for steps, scale in ((linear, "linear"), (np.r_[linear, linear], "linear"),  # two runs' steps at once
                         (geometric, "symlog"), (np.r_[geometric, geometric, np.nan], "symlog")):
        fig, ax = plt.subplots()
        _step_axis(ax, steps)
        assert ax.get_xscale() == scale, (steps, scale)
        plt.close(fig)


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
            continue
        assert ax.get_legend() is None and len(fig.legends) == 1
        ncol = -(-n // 18)  # 18 a column
        assert fig.legends[0]._ncols == ncol
        assert fig.get_size_inches()[0] == 6.5 + 1.9 * ncol
        fig.canvas.draw()  # the panel keeps most of its width beside the legend
        assert ax.get_position().width * fig.get_size_inches()[0] > 4.0
