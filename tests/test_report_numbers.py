"""Known answers for the numbers the report draws and prints.

Each test builds a tiny input whose answer is worked out by hand (in the comments) and checks
the figure's data (lines, bands, marks, tick labels) or the page's text against it: a mean
over seeds, a min-max band, a share of heads, a first step, a count in a caption, a table cell.
No training and no store: the figures read the runs' analyses from `_Run` objects.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import xarray as xr
from matplotlib.figure import Figure

from dynamics.analysis import ROLES
from dynamics.report import _choose_run, _Run
from dynamics.report.data import _Ctx

AXES = ["model.init_scale", "train.seed"]


def _figures(monkeypatch, *modules) -> dict:
    """Every Figure the `modules` save, by relative path (not written to disk)."""
    figs = {}

    def keep(fig, out, rel):
        figs[rel] = fig
        return rel

    for module in modules:
        monkeypatch.setattr(module, "_save", keep)
    return figs


def _mean_lines(ax) -> dict[str, np.ndarray]:
    """Legend label -> (x, y) of every labelled line."""
    return {line.get_label(): line.get_xydata() for line in ax.get_lines() if not line.get_label().startswith("_")}


def _band(ax, i: int = 0) -> tuple[dict, dict]:
    """(lower, upper) edge of the i-th fill_between band, each {x: y}."""
    v = ax.collections[i].get_paths()[0].vertices
    lo, hi = {}, {}
    for x, y in v:
        lo[x] = min(lo.get(x, np.inf), y)
        hi[x] = max(hi.get(x, -np.inf), y)
    return lo, hi


# --------------------------------------------------------------------------- curves: mean, band, count


def test_curves_draw_the_mean_and_min_max_band_over_the_seeds_that_have_each_step():
    from dynamics.report.draw import _curves, _groups

    def run(rid, scale, seed, steps):
        return _Run(rid, "completed", {"model.init_scale": scale, "train.seed": seed}, 1.0, len(steps),
                    np.ones(len(steps), bool), np.asarray(steps))

    runs = [run("a", 1.0, 0, [0, 10, 20]), run("b", 1.0, 1, [0, 10, 20]), run("c", 1.0, 2, [0, 10]),
            run("d", 2.0, 0, [0, 10, 20]), run("e", 2.0, 1, [0, 10, 20]),
            run("f", 1.0, 3, [0, 10, 20])]  # e, f: no values (e.g. their analysis lacks the variable)
    series = {"a": (np.array([0, 10, 20]), np.array([0.0, 1.0, 2.0])),
              "b": (np.array([0, 10, 20]), np.array([1.0, 5.0, 4.0])),
              "c": (np.array([0, 10]), np.array([5.0, 0.0])),  # a seed that has not reached step 20
              "d": (np.array([0, 10, 20]), np.array([0.3, 0.3, 0.3]))}
    ax = Figure().subplots()
    _curves(ax, _groups(runs, AXES), series)
    lines = _mean_lines(ax)
    # "mean of" the runs drawn (f has no values); a group with one run drawn: its own line, no "mean"
    assert set(lines) == {"init_scale=1 (mean of 3)", "init_scale=2"}
    # mean at 0: (0+1+5)/3 = 2 (median 1); at 10: (1+5+0)/3 = 2; at 20: only a and b, (2+4)/2 = 3
    assert lines["init_scale=1 (mean of 3)"].tolist() == [[0, 2.0], [10, 2.0], [20, 3.0]]
    assert lines["init_scale=2"].tolist() == [[0, 0.3], [10, 0.3], [20, 0.3]]
    assert len(ax.collections) == 1  # a band for the group of three only
    lo, hi = _band(ax)
    assert lo == {0: 0.0, 10: 0.0, 20: 2.0} and hi == {0: 5.0, 10: 5.0, 20: 4.0}


def _analysis(steps, best, dominant, roles, divergence, bifurcation=np.nan, emergence=None) -> xr.Dataset:
    best, roles = np.asarray(best, float), np.asarray(roles, np.int8)
    S, L, H = best.shape
    return xr.Dataset(
        {"best_slash": (("snapshot", "layer", "head"), best),
         "slash_dominant": (("snapshot", "layer", "head"), np.asarray(dominant, bool)),
         "role": (("snapshot", "layer", "head"), roles),
         "mean_divergence": (("snapshot",), np.asarray(divergence, float)),
         "bifurcation_step": ((), float(bifurcation)),
         "slash_emergence_step": (("layer", "head"),
                                  np.full((L, H), np.nan) if emergence is None else np.asarray(emergence, float))},
        coords={"step": ("snapshot", np.asarray(steps))}, attrs={"kappa": 0.5, "slash_offsets": [1, 8]})


def _run(rid, scale, seed, analysis, status="completed") -> _Run:
    steps = analysis["step"].values
    return _Run(rid, status, {"model.init_scale": scale, "train.seed": seed}, 1.0, len(steps),
                np.ones(len(steps), bool), steps, analysis=analysis, analysis_source="stored")


def test_emergence_curves_are_head_means_and_role_shares_averaged_over_seeds(tmp_path, monkeypatch):
    from dynamics.report import emergence

    P, D, N = ROLES.index("previous_token"), ROLES.index("diffuse"), ROLES.index("none")
    steps = [0, 10]
    # 1 layer x 4 heads, 2 snapshots, two seeds of init_scale 1.
    a = _analysis(steps, best=[[[0.1, 0.2, 0.3, 0.6]], [[0.2, 0.2, 0.9, 0.9]]],
                  dominant=[[[0, 0, 0, 1]], [[0, 0, 1, 1]]],
                  roles=[[[N, N, N, N]], [[P, D, D, N]]], divergence=[0.1, 0.4])
    b = _analysis(steps, best=[[[0.0, 0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0, 0.6]]],
                  dominant=[[[0, 0, 0, 0]], [[1, 1, 1, 1]]],
                  roles=[[[D, N, N, N]], [[P, P, P, P]]], divergence=[0.2, 0.2])
    runs = [_run("a", 1.0, 0, a), _run("b", 1.0, 1, b)]
    figs = _figures(monkeypatch, emergence)
    sec = emergence._emergence_section(_Ctx(tmp_path / "x", runs, None, AXES, tmp_path, True))
    assert "band: range (min-max) over seeds" in sec.figures[0][1]
    assert "not every seed has a value" not in sec.figures[0][1]  # both seeds have both steps

    best_ax, dom_ax = figs["emergence_slash.png"].axes[:2]
    # head means: a 0.3, 0.55; b 0, 0.9 -> over seeds 0.15, 0.725; band a..b per step
    assert np.allclose(_mean_lines(best_ax)["init_scale=1 (mean of 2)"], [[0, 0.15], [10, 0.725]])
    lo, hi = _band(best_ax)
    assert np.allclose([lo[0], hi[0], lo[10], hi[10]], [0.0, 0.3, 0.55, 0.9])
    # dominant fraction: a 1/4, 2/4; b 0, 4/4 -> 0.125, 0.75
    assert np.allclose(_mean_lines(dom_ax)["init_scale=1 (mean of 2)"], [[0, 0.125], [10, 0.75]])

    panels = {ax.get_title(): ax for ax in figs["emergence_roles.png"].axes if ax.get_visible()}
    assert list(panels) == ["previous_token", "diffuse", "none"]  # in ROLES order, only those that occur
    # previous_token: a 0, 1/4; b 0, 4/4 -> 0, 0.625. diffuse: a 0, 2/4; b 1/4, 0 -> 0.125, 0.25
    # none: a 4/4, 1/4; b 3/4, 0 -> 0.875, 0.125
    want = {"previous_token": [0, 0.625], "diffuse": [0.125, 0.25], "none": [0.875, 0.125]}
    for role, ys in want.items():
        assert np.allclose(_mean_lines(panels[role])["init_scale=1 (mean of 2)"], [[0, ys[0]], [10, ys[1]]]), role

    div_ax = figs["emergence_divergence.png"].axes[0]
    assert np.allclose(_mean_lines(div_ax)["init_scale=1 (mean of 2)"], [[0, 0.15], [10, 0.3]])


# --------------------------------------------------------------------------- bifurcation: marks, mean, counts


def test_bifurcation_marks_means_and_counts_have_known_values(tmp_path, monkeypatch):
    from dynamics.report import emergence

    steps = [0, 10, 20, 40, 80]

    def run(rid, scale, seed, bif, emerge, status="completed"):
        z = np.zeros((5, 1, 3))
        return _run(rid, scale, seed, _analysis(steps, z, z, z.astype(int), [0.1] * 5, bif, [emerge]), status)

    nan = np.nan
    runs = [run("s1a", 1.0, 0, 10, [nan, 40, 20]),  # first slash-dominant head: 20 (the earliest head)
            run("s1b", 1.0, 1, 20, [80, nan, nan]),
            run("s1c", 1.0, 2, 60, [nan, nan, nan]),  # bifurcation mean at 1.0: 30 (median 20); slash: 50
            run("s2a", 2.0, 0, nan, [nan, nan, nan]),
            run("s2b", 2.0, 1, 40, [nan, nan, nan]),
            run("s2c", 2.0, 2, nan, [10, 10, 10], status="running")]
    figs = _figures(monkeypatch, emergence)
    sec = emergence._bifurcation_section(_Ctx(tmp_path / "x", runs, None, AXES, tmp_path, True))
    top, bottom = figs["bifurcation.png"].axes[:2]

    def marks(ax):
        ticks = dict(zip([t.get_text() for t in ax.get_yticklabels()], ax.get_yticks(), strict=True))
        names = {v: k for k, v in ticks.items() if k in ("never", "not yet")}
        return sorted(((x, names.get(y, y)) for c in ax.collections for x, y in c.get_offsets().tolist()), key=str)

    assert marks(top) == sorted([(1.0, 10.0), (1.0, 20.0), (1.0, 60.0), (2.0, 40.0), (2.0, "never"), (2.0, "not yet")], key=str)
    # s2c is running: its 10 is hollow, not "never"
    assert marks(bottom) == sorted([(1.0, 20.0), (1.0, 80.0), (1.0, "never"), (2.0, 10.0), (2.0, "never"), (2.0, "never")],
                                   key=str)
    # two finished runs on one "never" mark lie exactly on each other: counted beside it
    never = dict(zip([t.get_text() for t in bottom.get_yticklabels()], bottom.get_yticks(), strict=True))["never"]
    assert [(t.xy, t.get_text()) for t in bottom.texts] == [((2.0, never), "\u00d72")]
    assert len(top.texts) == 0  # no two runs share a mark there
    assert "\u00d7n beside a mark: n runs at that point" in sec.figures[0][1]
    assert top.get_lines()[0].get_xydata().tolist() == [[1.0, 30.0], [2.0, 40.0]]
    assert bottom.get_lines()[0].get_xydata().tolist() == [[1.0, 50.0]]  # the running run's 10 is not in it
    caption = sec.figures[0][1]
    assert ("Counts: bifurcation: 1 of 5 finished run(s) never reached it, 1 of 1 unfinished run(s) not yet; "
            "slash emergence: 3 of 5 finished run(s) never reached it, 0 of 1 unfinished run(s) not yet.") in caption


# --------------------------------------------------------------------------- runs table and header


def test_runs_table_and_header_print_the_runs_own_numbers(tmp_path):
    from dynamics.report.page import _page, _runs_table

    runs = [_Run("ra", "completed", {"model.init_scale": 0.5, "train.seed": 0}, 2.71828, 9, np.ones(9, bool),
                 np.arange(9)),
            _Run("rb", "running", {"model.init_scale": 2.0, "train.seed": 1}, None, 9, np.arange(9) < 4, np.arange(9)),
            _Run("rc", "completed", {"model.init_scale": 2.0, "train.seed": 0}, 1.0, 9, np.ones(9, bool), np.arange(9))]
    pending = [_Run("rp", "pending", {"model.init_scale": 4.0, "train.seed": 0}, None, 0, np.zeros(0, bool),
                    np.zeros(0, np.int64))]
    text = _runs_table([*runs, *pending], AXES, "rb")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"<tr><td><code>(\w+)</code>.*?</tr>", text)}
    cells = {k: re.findall(r"<td[^>]*>(.*?)</td>", v) for k, v in rows.items()}
    assert cells["ra"][1:] == ["0.5", "0", "completed", "9/9", "2.7183", ""]
    # swept values as `dynamics status` prints them (the page had 2 where status said 2.0)
    assert cells["rb"][0].endswith("(shown)") and cells["rb"][1:6] == ["2.0", "1", "running", "4/9", "-"]
    assert cells["rp"][1:6] == ["4.0", "0", "pending", "-", "-"]
    from dynamics.identity import setting_cell  # a list too: the page showed Python's ['induction', 'markov']
    listed = _Run("rl", "completed", {"task.components": ["induction", "markov"], "train.seed": 0}, 1.0, 9,
                  np.ones(9, bool), np.arange(9))
    assert '<td>[&quot;induction&quot;,&quot;markov&quot;]</td><td>0</td>' in _runs_table(
        [listed], ["task.components", "train.seed"], None)
    assert setting_cell(["induction", "markov"]) == '["induction","markov"]'

    # the header: counts by status over recorded and pending runs, and how many of the index started
    page = _page(tmp_path / "s.zarr", runs, "rb", AXES, [], True, pending, {"ra", "rb", "rp"})
    assert "2 completed, 1 pending, 1 running (2 of 3 runs of the sweep index started)" in page


def test_choose_run_takes_the_lower_median_loss_for_odd_and_even_counts():
    def run(rid, loss):
        return _Run(rid, "completed", {}, loss, 3, np.ones(3, bool), np.arange(3))

    losses = {"a": 4.0, "b": 1.0, "c": 3.0, "d": 2.0}
    assert _choose_run([run(k, v) for k, v in losses.items()]) == "d"  # 1, 2 | 3, 4: lower median 2
    assert _choose_run([run(k, v) for k, v in losses.items() if k != "b"]) == "c"  # 2, 3, 4


# --------------------------------------------------------------------------- redundancy: the chosen run's last snapshot


def test_redundancy_reads_the_last_snapshot_its_roles_and_threshold(tmp_path, monkeypatch):
    from dynamics.report import redundancy

    # 1 layer x 4 heads; at the last snapshot heads 0 and 2 are near-duplicates (0.05), as are 1 and 3.
    far, near = 0.6, 0.05
    last = np.array([[0, far, near, far], [far, 0, far, near], [near, far, 0, far], [far, near, far, 0]])
    js = xr.DataArray(last.reshape(1, 4, 1, 4), dims=("layer", "head", "layer_b", "head_b"),
                      coords={"layer": [0], "head": np.arange(4), "layer_b": [0], "head_b": np.arange(4)})
    P, S, N = ROLES.index("previous_token"), ROLES.index("self"), ROLES.index("none")
    roles = xr.DataArray(np.array([[[N, N, N, N]], [[P, S, P, S]]], np.int8), dims=("snapshot", "layer", "head"),
                         coords={"step": ("snapshot", [0, 30])})
    analysis = xr.Dataset({"role": roles, "js_last": js}, attrs={"js_step": 30, "cluster_threshold": 0.2})
    run = _Run("rx", "completed", {}, 1.0, 2, np.ones(2, bool), np.array([0, 30]))
    ctx = _Ctx(tmp_path / "x", [run], "rx", [], tmp_path, True)
    ctx._chosen = (analysis, "stored")
    figs = _figures(monkeypatch, redundancy)
    sec = redundancy._redundancy_section(ctx)
    caption = sec.figures[0][1]
    assert caption.startswith("Run rx at step 30, stored analysis.") and "dashed cut (0.2)" in caption
    dendro, matrix = figs["redundancy.png"].axes[:2]
    leaves = [t.get_text() for t in dendro.get_xticklabels()]
    assert sorted(leaves) == ["L0H0 previous_token", "L0H1 self", "L0H2 previous_token", "L0H3 self"]
    pairs = {frozenset(leaves[:2]), frozenset(leaves[2:])}  # adjacent leaves: merged first
    assert pairs == {frozenset({"L0H0 previous_token", "L0H2 previous_token"}), frozenset({"L0H1 self", "L0H3 self"})}
    heights = sorted(max(line.get_ydata()) for line in dendro.get_lines() if line.get_linestyle() == "-")
    assert heights == pytest.approx([near, near, far])
    cut = [line for line in dendro.get_lines() if line.get_linestyle() == "--"]
    assert cut[0].get_ydata()[0] == 0.2
    # the matrix in dendrogram order: each tick's row holds that pair's distances
    order = [int(t.split()[0][3:]) for t in leaves]
    assert np.allclose(matrix.images[0].get_array(), last[np.ix_(order, order)])
    assert [t.get_text() for t in matrix.get_yticklabels()] == leaves


# --------------------------------------------------------------------------- from a store: JS step, roles per frame

TINY = {
    "model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 8},
    "task": {"name": "induction", "min_period": 2, "max_period": 4},
    "train": {"steps": 16, "batch_size": 8, "warmup_steps": 4, "lr": 1e-2, "eval_batches": 1},
    "record": {"dense_until": 4, "every": 4, "n_probe": 2, "eval_batch_size": 4},
}


def _random_run(path, run_id: str, seed: int) -> None:
    """A finished run whose attention is random (causal, rows summing to 1) at every snapshot, so
    each snapshot has its own JS distances and roles; no training."""
    from dynamics import store
    from dynamics.config import from_dict
    from dynamics.record import coords, snapshot_steps, variables

    cfg = from_dict(TINY)
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    recorded = variables(cfg, len(steps_at))
    writer = store.RunWriter(path, run_id, variables=recorded, coords=coords(cfg, steps_at),
                             attrs={"status": "completed", "config": cfg.to_dict()})
    rng = np.random.default_rng(seed)
    for name, (_, shape, dtype) in recorded.items():
        if name == "attention":
            T = shape[-1]
            a = rng.random(shape) ** 4 * np.tril(np.ones((T, T)))
            value = a / a.sum(-1, keepdims=True)
        elif name == "probe_tokens":
            value = rng.integers(0, 16, shape)
        else:
            value = rng.random(shape)
        writer.write_region(name, 0, np.asarray(value, dtype))
    writer.finalize()


@pytest.mark.parametrize("stored", [True, False])
def test_the_chosen_runs_js_distances_and_roles_are_its_last_snapshot(tmp_path, stored):
    from dynamics import cli, store
    from dynamics.report.data import _chosen_analysis, _collect_run

    path = tmp_path / "s.zarr"
    _random_run(path, "r1", 0)
    if stored:
        cli.analyse_store(str(path), ["r1"])
    truth = store.open_analysis(path, "r1") if stored else None
    if truth is None:
        from dynamics.analysis import analyse_run

        truth = analyse_run(store.open_run(path, "r1").load()).compute()
    run = _collect_run(path, "r1", None, True, store.run_attrs(path, "r1"))
    analysis, source = _chosen_analysis(path, run, True)
    assert source == ("stored" if stored else "computed")
    last_step = int(store.open_run(path, "r1")["step"].values[-1])
    assert analysis.attrs["js_step"] == last_step
    want = truth["js_distance"].isel(snapshot=-1).values
    assert not np.allclose(want, truth["js_distance"].isel(snapshot=-2).values, equal_nan=True)  # snapshots differ
    assert np.allclose(analysis["js_last"].values, want, equal_nan=True)
    assert (analysis["role"].values == truth["role"].values).all()


def test_the_chosen_runs_analysis_swapped_while_it_is_read_is_read_as_one_version(tmp_path, monkeypatch):
    # Its attributes were checked on opening and its roles and distances read after: an analyse
    # swapping a new version in between gave the old attributes with the new values.
    import shutil

    from dynamics import cli, store
    from dynamics.report.data import _chosen_analysis, _collect_run
    from tests.test_store_races import exchange_at_first_read

    path, other = tmp_path / "s.zarr", tmp_path / "new.zarr"
    _random_run(path, "r1", 0)
    cli.analyse_store(str(path), ["r1"])
    shutil.copytree(path, other)
    old = store.open_analysis(path, "r1").load()
    store.write_analysis(path, "r1", old.assign_attrs(marker=1))
    store.write_analysis(other, "r1", old.assign(role=old.role * 0 + 2, js_distance=old.js_distance / 2)
                         .assign_attrs(marker=2))
    run = _collect_run(path, "r1", None, False, store.run_attrs(path, "r1"))
    swapped = exchange_at_first_read(tmp_path, monkeypatch, ("analysis/r1/role/c", "analysis/r1/js_distance/c"),
                                     path / "analysis" / "r1", other / "analysis" / "r1")  # not a coordinate's
    analysis, source = _chosen_analysis(path, run, False)
    assert swapped and source == "stored"
    assert analysis.attrs["marker"] == 2 and (analysis["role"].values == 2).all()
    np.testing.assert_allclose(analysis["js_last"].values, old["js_distance"].isel(snapshot=-1).values / 2)


def test_each_attention_frame_is_titled_with_the_roles_of_its_own_step(tmp_path, monkeypatch):
    from dynamics import cli, store
    from dynamics.report import attention
    from dynamics.report.page import _read_runs

    path = tmp_path / "s.zarr"
    _random_run(path, "r1", 1)
    cli.analyse_store(str(path), ["r1"])
    seen = {}
    frames = attention._attention_frames

    def spy(fig, images, titles, suptitle, attn, run, roles_by_step, *rest):
        seen.update(roles_by_step)
        yield from frames(fig, images, titles, suptitle, attn, run, roles_by_step, *rest)

    monkeypatch.setattr(attention, "_attention_frames", spy)
    runs = _read_runs(path, ["r1"], None, True, None, lambda line: None)
    (tmp_path / "attention").mkdir()
    sec = attention._attention_section(_Ctx(path, runs, "r1", [], tmp_path, True))
    truth = store.open_analysis(path, "r1")
    assert sorted(seen) == truth["step"].values.tolist()
    for i, step in enumerate(truth["step"].values):
        assert seen[int(step)].tolist() == np.asarray(ROLES)[truth["role"].values[i]].tolist(), step
    n = truth.sizes["snapshot"]
    labels = re.findall(r'"label": "([^"]+)"', sec.html)
    assert labels[0] == f"step 0 (snapshot 1 of {n})" and labels[-1] == f"step {int(truth['step'][-1])} (snapshot {n} of {n})"
