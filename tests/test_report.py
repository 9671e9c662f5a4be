"""The HTML report on a small store trained for real: figures, captions, partial stores, CLI.

One session-scoped store holds three tiny runs of an init_scale x seed sweep:

- A: completed, analysed by ``dynamics analyse``, with CHG gates in its ``chg`` variable;
- B: completed, never analysed (the report analyses it in memory), with a derived
  ``gates.<run_id>`` dataset in the schema of ``dynamics.gates.fit_chg`` (3 restarts whose
  majority role differs from the region of their mean gates for head L0H0);
- C: stopped after step 20 and marked ``running`` with nobody holding its training lock, as
  a killed sweep leaves it (6 of 9 snapshots recorded, no analysis);
- P: in the sweep index only (init_scale 4.0): pending, never started;

plus a derived ``predict.slash`` curve in the schema of ``dynamics.predict.predict_runs``.
`build_report` is shared with tests/integration/test_report_browser.py (it reuses the
store when both run in one session).
"""

from __future__ import annotations

import ast
import html
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from PIL import Image

from dynamics import cli, store
from dynamics.analysis.pipeline import ANALYSIS_VERSION
from dynamics.report import CHG_LABELS, _choose_run, _Run, chg_label, write_report

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16},
    "task": {"name": "induction", "min_period": 2, "max_period": 6},
    "train": {"steps": 40, "batch_size": 8, "warmup_steps": 4, "lr": 1e-2, "eval_batches": 1},
    "record": {"dense_until": 8, "every": 8, "n_probe": 2, "eval_batch_size": 4},
}
STOP_AT = 20  # run C stops here: snapshots 0, 1, 2, 4, 8, 16 of 0..40 are recorded


class _Stop(Exception):
    """Raised from the progress callback to stop a run part-way, as a kill would."""


def _stop_at(step: int, total: int, loss: float) -> None:
    if step >= STOP_AT:
        raise _Stop


def _fill_chg(path: Path, run_id: str, cfg) -> None:
    """Give run A fitted gates at every 4th snapshot, unless training already fitted them.

    The recorder creates ``chg`` when record.chg_every > 0; until gates are fitted during
    training it stays NaN, so the test writes values through the store's run writer.
    """
    from dynamics.record import coords, snapshot_steps, variables

    ds = store.open_run(path, run_id)
    if bool(ds["chg"].notnull().any()):
        return
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    writer = store.RunWriter(path, run_id, variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                             attrs={}, resume=True)
    rng = np.random.default_rng(0)
    L, H = cfg.model.n_layers, cfg.model.n_heads
    for i in range(0, len(steps_at), 4):
        frac = i / (len(steps_at) - 1)  # gates drift apart as training goes on
        chg = np.clip(0.5 + (rng.random((L, H, 2)) - 0.5) * (0.2 + 0.8 * frac), 0, 1).astype(np.float32)
        role = np.array([CHG_LABELS.index(x) for x in chg_label(chg[..., 0], chg[..., 1]).ravel()], np.int8)
        writer.write_snapshot(i, {"chg": chg, "chg_role": role.reshape(L, H)})
    writer.finalize()


def _predict_curve() -> xr.Dataset:
    """A curve in the schema of dynamics.predict.predict_runs (horizon, model, fold)."""
    models = ["chance", "layer", "init_linear", "init_boosting", "linear", "boosting"]
    horizons = np.array([0.0, 0.1, 0.25, 0.5, 1.0])
    rng = np.random.default_rng(1)
    base = 0.5 + 0.4 * horizons[:, None, None] * (np.arange(len(models)) >= 4)[None, :, None]
    score = np.clip(base + rng.normal(0, 0.05, (len(horizons), len(models), 3)), 0, 1)
    return xr.Dataset(
        {"score": (("horizon", "model", "fold"), score),
         "score_mean": (("horizon", "model"), score.mean(-1)),
         "score_std": (("horizon", "model"), score.std(-1))},
        coords={"horizon": horizons, "model": models, "fold": np.arange(3)},
        attrs={"target": "slash", "description": "slash-dominant at the final snapshot", "metric": "auroc",
               "chance": 0.5, "horizon_unit": "fraction", "group_by": "seed", "analysis_version": ANALYSIS_VERSION},
    )


# Three restarts of head L0H0: facilitating, facilitating, interfering. Their mean gates
# (0.6, 0.4) fall in the irrelevant region, while the majority role is facilitating.
SPLIT_HEAD = np.array([[0.9, 0.6], [0.9, 0.6], [0.0, 0.0]], np.float32)


def _gates_dataset(cfg, seed: int = 2) -> xr.Dataset:
    """A CHG fit in the schema of dynamics.gates.fit_chg: chg (restart, layer, head, fit), per-restart
    codes chg_role and their majority role, as `dynamics gates` stores them."""
    L, H = cfg.model.n_layers, cfg.model.n_heads
    g = np.random.default_rng(seed).random((3, L, H, 2)).astype(np.float32)
    g[:, 0, 0] = SPLIT_HEAD
    codes = np.array([CHG_LABELS.index(x) for x in chg_label(g[..., 0], g[..., 1]).ravel()], np.int8).reshape(3, L, H)
    counts = np.stack([(codes == c).sum(0) for c in range(4)])
    return xr.Dataset({"chg": (("restart", "layer", "head", "fit"), g), "chg_role": (("restart", "layer", "head"), codes),
                       "role": (("layer", "head"), counts.argmax(0).astype(np.int8))},
                      coords={"restart": np.arange(3), "layer": np.arange(L), "head": np.arange(H),
                              "fit": ["plus", "minus"]})


def build_report(root: Path) -> tuple[Path, Path, dict]:
    """Train the store described in the module docstring and write its report (once per root).

    Returns (store path, index.html, {"A": run id, "B": ..., "C": ..., "P": ...}).
    """
    from dynamics.config import from_dict, with_values
    from dynamics.train import set_threads, train_run

    path, out, ids_file = root / "store.zarr", root / "report", root / "ids.json"
    if ids_file.exists():  # built earlier in this session by the other test module
        return path, out / "index.html", json.loads(ids_file.read_text())
    set_threads(1)
    raw = json.loads(json.dumps(TINY))
    points = {"A": (0.5, 0), "B": (2.0, 0), "C": (2.0, 1)}
    ids, index = {}, {"axes": ["model.init_scale", "train.seed"], "runs": {}}
    for name, (scale, seed) in points.items():
        cfg = with_values(from_dict(raw | {"record": raw["record"] | ({"chg_every": 4, "chg_steps": 5} if name == "A" else {})}),
                          {"model.init_scale": scale, "train.seed": seed})
        rid = ids[name] = cfg.run_id()
        index["runs"][rid] = {"model.init_scale": scale, "train.seed": seed}
        if name == "C":
            with pytest.raises(_Stop):
                train_run(cfg, str(path), rid, progress=_stop_at)
            store.update_run_attrs(path, rid, status="running")  # what a live (or killed) sweep shows
        else:
            assert train_run(cfg, str(path), rid).status == "completed"
        if name == "A":
            _fill_chg(path, rid, cfg)
        if name == "B":
            store.write_derived(path, f"gates.{rid}", _gates_dataset(cfg))
    ids["P"] = "rpending000"  # in the sweep index, never started
    index["runs"][ids["P"]] = {"model.init_scale": 4.0, "train.seed": 0}
    store.write_sweep_index(path, index)
    cli.analyse_store(str(path), [ids["A"]])
    store.write_derived(path, "predict.slash", _predict_curve())
    page = write_report(path, out)
    ids_file.write_text(json.dumps(ids))
    return path, page, ids


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    return build_report(tmp_path_factory.getbasetemp() / "report-store")


def _srcs(text: str) -> list[str]:
    return [html.unescape(s) for s in re.findall(r'<img[^>]*\ssrc="([^"]+)"', text)]


def _frames(text: str) -> list[dict]:
    m = re.search(r'<script type="application/json" id="frames-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1).replace("<\\/", "</")) if m else []


def _png_ok(path: Path) -> bool:
    with Image.open(path) as im:
        return im.format == "PNG" and im.size[0] > 50 and im.size[1] > 50


# --------------------------------------------------------------------------- full report


def test_every_figure_file_referenced_exists(built):
    path, page, ids = built
    text = page.read_text()
    srcs = _srcs(text) + [f["src"] for f in _frames(text)]
    assert srcs
    for src in srcs:
        assert not src.startswith(("http:", "https:", "/")), src  # relative: the page works from file://
        assert _png_ok(page.parent / src), src


def test_report_has_every_figure_with_a_caption(built):
    _, page, ids = built
    text = page.read_text()
    names = {Path(s).name for s in _srcs(text)}
    expected = {"emergence_slash.png", "emergence_roles.png", "emergence_divergence.png", "bifurcation.png",
                "redundancy.png", "chg.png", "predict_slash.png"}
    assert expected <= names, f"missing figures: {expected - names}"
    figures = re.findall(r"<figure.*?</figure>", text, re.S)
    assert len(figures) == len(expected) + 1  # + the attention slider
    for fig in figures:
        caption = re.search(r"<figcaption>(.+?)</figcaption>", fig, re.S)
        assert caption and len(caption.group(1)) > 60, fig[:200]
    # Nothing is missing but the per-run gaps of the partial store.
    assert "Not available: the CHG" not in text and "Not available: the predictor" not in text
    assert 'src="http' not in text and "<script src" not in text  # self-contained: no CDN


def test_slider_scrubs_every_recorded_snapshot_of_the_median_run(built):
    path, page, ids = built
    text = page.read_text()
    chosen = re.search(r"Per-run figures show run <code>(\w+)</code>", text).group(1)
    losses = {k: store.run_attrs(path, ids[k])["last_loss"] for k in ("A", "B")}
    assert chosen == ids[min(losses, key=losses.get)]  # lower median of the two completed runs
    frames = _frames(text)
    steps = store.open_run(path, chosen)["step"].values.tolist()
    assert [f["step"] for f in frames] == steps
    assert len({f["src"] for f in frames}) == len(frames)
    assert f'max="{len(frames) - 1}"' in text and 'type="range"' in text
    # A browser that restores form values on reload (Firefox) would show frame 0 at another position.
    assert re.search(r'<input type="range" id="step-slider" autocomplete="off"', text)
    assert "probe sequence 0" in text  # the caption says which probe is shown
    # "one fixed sequence of 2" read as a 2-token sequence: say what the count is, and the length.
    assert "the first of the 2 fixed probe sequences, 16 tokens long" in text
    assert sorted(p.name for p in (page.parent / frames[0]["src"]).parent.iterdir()) == [Path(f["src"]).name for f in frames]


def test_partial_store_runs_are_analysed_in_memory_and_said_so(built):
    path, page, ids = built
    text = page.read_text()
    row = {k: re.search(rf"<tr><td><code>{ids[k]}</code>.*?</tr>", text).group(0) for k in ids}
    assert ">pending<" in row["P"] and "not started yet" in row["P"]  # in the sweep index, never started
    assert "2 completed, 1 pending, 1 stopped (3 of 4 runs of the sweep index started)" in text
    assert "stored by `dynamics analyse`" in html.unescape(row["A"])
    assert "computed for this report (not stored)" in row["B"]
    # "running" in its attrs, but nobody holds its training lock: killed, shown as `dynamics status` does.
    assert store.run_attrs(path, ids["C"])["status"] == "running"
    assert ">stopped<" in row["C"] and ">running<" not in row["C"]
    assert "computed for this report on 6 of 9 snapshots" in row["C"]
    assert "6/9" in row["C"]
    assert store.open_analysis(path, ids["B"]) is None  # the report never writes to the store
    assert "derived/gates." in text and "recorded during training (chg)" in text


# --------------------------------------------------------------------------- CLI and missing parts


def test_cli_without_computing_names_the_missing_runs_and_replaces_frames(built, tmp_path, capsys, monkeypatch):
    import shutil

    from dynamics.report import page as page_module

    path, page, ids = built
    out = tmp_path / "report"
    shutil.copytree(page.parent, out)  # an earlier report of a longer run in the same folder
    clock = iter(range(0, 10_000, 3))  # 3 s a look: a run read now and then takes 5 s
    monkeypatch.setattr(page_module, "monotonic", lambda: next(clock))
    assert cli.main(["report", str(path), "--out", str(out), "--run", ids["C"], "--no-compute"]) == 0
    printed = capsys.readouterr()
    assert (out / "index.html").as_uri() in printed.out
    # where it is, on stderr: it printed nothing for as long as it took
    lines = printed.err.splitlines()
    n = len(store.list_runs(str(path)))
    assert lines[0] == f"[report] reading {n} run(s)" and f"[report] read 1/{n} runs" in lines
    assert lines[-6:] == [f"[report] drawing {name}" for name in ("attention maps", "emergence curves", "bifurcation",
                                                                  "redundancy", "causal head gating", "predictor")]
    text = (out / "index.html").read_text()
    frames = _frames(text)
    assert len(frames) == 6
    assert len(list((out / frames[0]["src"]).parent.glob("*.png"))) == 6  # stale frames removed
    assert [p.name for p in (out / "figures").iterdir()] == [Path(frames[0]["src"]).parts[1]]  # the old report's went
    assert "Not available: emergence curves for 2 run(s) because they have no analysis" in text
    assert "role labels not available because the run has no stored analysis" in text
    # `dynamics analyse` skips an unfinished run: told to run it, its reader changed nothing
    plain = html.unescape(text)
    b, c = ids["B"], ids["C"]
    assert f"{b} (completed: no stored analysis (run `dynamics analyse`))" in plain
    assert (f"{c} (stopped: no stored analysis (`dynamics analyse` analyses it once it has finished; without "
            "--no-compute the report analyses what it has recorded))") in plain
    assert f"Not available: the dendrogram and JS matrix of run {ids['C']}" in text
    for src in _srcs(text) + [f["src"] for f in frames]:
        assert _png_ok(out / src), src

    assert cli.main(["report", str(path), "--out", str(tmp_path / "x"), "--run", "nope"]) == cli.EXIT_BAD_INPUT
    assert cli.main(["report", str(tmp_path), "--out", str(tmp_path / "x")]) == cli.EXIT_BAD_INPUT


def _unwritten_run(path, status: str) -> None:
    """A store at `path` holding run r0 of the TINY config, its arrays made but no snapshot written."""
    from dynamics.config import from_dict
    from dynamics.record import coords, snapshot_steps, variables

    cfg = from_dict(TINY)
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    store.RunWriter(path, "r0", variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                    attrs={"status": status, "config": cfg.to_dict()}).finalize()


def test_store_with_a_just_started_run_names_every_missing_part(tmp_path, monkeypatch):
    path = tmp_path / "s.zarr"
    _unwritten_run(path, "running")
    monkeypatch.chdir(tmp_path)
    with store.run_lock(path, "r0"):  # its trainer is alive: it holds the run's training lock
        page = write_report("s.zarr", "out")  # relative, as write_report's example
    assert page == tmp_path / "out" / "index.html" and page.as_uri()  # a relative page had no URI
    text = page.read_text()
    for needle in ("Not available: attention maps because run r0 (running) has no recorded snapshot yet",
                   "Not available: emergence curves for 1 run(s)",
                   "Not available: bifurcation and emergence steps against init_scale, lr or n_heads because the store "
                   "has no sweep index",
                   "Not available: the dendrogram and JS matrix of run r0 because the run has only 0 recorded snapshot(s)",
                   "Not available: the CHG scatter",
                   "Not available: the predictor curves"):
        assert needle in text, needle
    assert not _srcs(text)
    assert "failed (" not in text  # every gap is an expected one, not a crashed section


def test_a_store_path_whose_bytes_are_not_utf8_is_shown_not_a_crash(tmp_path):
    # Such bytes arrive as lone surrogates, which the page's UTF-8 write refused (a traceback).
    path = tmp_path / os.fsdecode(b"s\xff.zarr")
    _unwritten_run(path, "running")
    with store.run_lock(path, "r0"):
        page = write_report(path, tmp_path / os.fsdecode(b"out\xfe"))
    text = page.read_bytes().decode("utf-8")  # strict: the page is UTF-8 throughout
    assert "<title>dynamics report: s\ufffd.zarr</title>" in text
    assert f"Store <code>{html.escape(str(tmp_path))}/s\ufffd.zarr</code>" in text


def test_a_run_whose_arrays_cannot_be_read_is_not_said_to_have_no_snapshots(tmp_path):
    path = tmp_path / "s.zarr"
    _unwritten_run(path, "completed")
    meta = path / "runs" / "r0" / "attention" / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])
    text = html.unescape(write_report(path, tmp_path / "out").read_text())
    assert ("Not available: attention maps because run r0 (damaged) could not be read (StoreError: "
            in text)
    assert "runs/r0/attention/zarr.json of runs/r0 cannot be read" in text
    assert "no recorded snapshot" not in text


def test_a_finished_run_missing_a_chunk_it_wrote_is_damaged_not_drawn_as_nan(tmp_path):
    # zarr reads a lost chunk file as the fill value: a completed run whose attention chunks are
    # gone was drawn and analysed as NaN maps ("no role"), and the report exited 0.
    path = tmp_path / "s.zarr"
    _unwritten_run(path, "completed")  # arrays made, no chunk on disk: as if every chunk were lost
    damaged: dict[str, str] = {}
    text = html.unescape(write_report(path, tmp_path / "out", on_damaged=damaged.__setitem__).read_text())
    assert list(damaged) == ["r0"]
    assert "run r0: array attention at snapshot 0 (step 0): its chunk runs/r0/attention/c/0/" in damaged["r0"]
    assert "more chunk(s) of its arrays), though the run wrote it: zarr would read it as nan" in damaged["r0"]
    assert "run r0 (damaged) could not be read (StoreError: " in text


# --------------------------------------------------------------------------- small pieces


def test_chg_label_follows_the_paper_taxonomy():
    plus = np.array([0.9, 0.9, 0.1, 0.1, np.nan, 0.5])
    minus = np.array([0.9, 0.1, 0.1, 0.9, 0.5, 0.5])
    assert chg_label(plus, minus).tolist() == [*CHG_LABELS, "facilitating"]  # threshold counts as high


def test_choose_run_prefers_the_median_completed_run():
    def run(rid, status, loss, n):
        return _Run(rid, status, {}, loss, 9, np.arange(9) < n, np.arange(9))

    runs = [run("a", "completed", 2.0, 9), run("b", "completed", 1.0, 9), run("c", "completed", 3.0, 9),
            run("d", "running", 0.1, 4)]
    assert _choose_run(runs) == "a"
    assert _choose_run([run("d", "running", None, 4), run("e", "failed", None, 7)]) == "e"
    assert _choose_run([]) is None


def _imports(module: str) -> set[str]:
    """Every module named in an import statement of `module`'s file (lazy ones inside functions too)."""
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_report_never_imports_torch():
    # Static and transitive over the package: also catches imports inside functions.
    seen, todo, found = set(), ["dynamics", "dynamics.report"], []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _imports(module):
            if name.split(".")[0] == "torch":
                found.append(f"{module} imports {name}")
            elif name.startswith("dynamics.") and ((ROOT / (name.replace(".", "/") + ".py")).exists()
                                                   or (ROOT / name.replace(".", "/") / "__init__.py").exists()):
                todo.append(name)
    assert {"dynamics.store", "dynamics.analysis"} <= seen
    assert not found, found


# --------------------------------------------------------------------------- trust: colours, labels, status


def _written_run(path: Path, run_id: str, cfg, status: str, config: dict | None = None) -> None:
    """Run `run_id` of `cfg`, no training: a finished one with every chunk written (ones), as a
    finished run has them; an unfinished one with none recorded yet."""
    from dynamics.record import coords, snapshot_steps, variables

    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    recorded = variables(cfg, len(steps_at))
    writer = store.RunWriter(path, run_id, variables=recorded, coords=coords(cfg, steps_at),
                             attrs={"status": status, "config": config or cfg.to_dict()})
    if status in ("completed", "diverged"):  # a finished run's chunks are all there (store.check_recorded)
        for name, (_, shape, dtype, *_) in recorded.items():
            writer.write_region(name, 0, np.ones(shape, dtype))
    writer.finalize()


def _synthetic_store(path: Path, points: dict[str, dict], status: str = "completed") -> None:
    """Runs with constant arrays (cheap: no training), each at its swept point, and the sweep index."""
    from dynamics.config import from_dict

    cfg = from_dict(TINY)
    for rid in points:
        _written_run(path, rid, cfg, status)
    store.write_sweep_index(path, {"axes": sorted({a for p in points.values() for a in p}), "runs": points})


def _capture_figures(monkeypatch, module) -> dict:
    """Keep every Figure `module` saves, by its relative path, to read what it drew."""
    from dynamics.report import draw

    figs = {}

    def keep(fig, out, rel):
        figs[rel] = fig
        return draw._save(fig, out, rel)

    monkeypatch.setattr(module, "_save", keep)
    return figs


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


def test_runs_of_other_base_configs_at_one_swept_point_are_not_averaged_as_seeds(tmp_path):
    # Two sweeps of init_scale x seed into one store, the second with --set train.lr=...: grouped by
    # the swept values alone, the curves' "mean over seeds" averaged two configs (mean of 4).
    from dynamics.config import from_dict, with_values
    from dynamics.report.data import _collect_or_note, _colour_axes, _pending_runs, _setting_axes
    from dynamics.report.draw import _groups

    base = from_dict(TINY)
    path = tmp_path / "s.zarr"
    points = {}
    for lr in (1e-2, 1e-3):
        for seed in (0, 1):
            cfg = with_values(base, {"train.lr": lr, "train.seed": seed})
            _written_run(path, cfg.run_id(), cfg, "completed")
            points[cfg.run_id()] = {"model.init_scale": 1.0, "train.seed": seed}
    points["rother"] = {"model.init_scale": 2.0, "train.seed": 0}  # pending: varies init_scale
    index = {"axes": ["model.init_scale", "train.seed"], "runs": points}
    store.write_sweep_index(path, index)
    runs = [_collect_or_note(path, rid, index, False) for rid in store.list_runs(path)]  # grouping needs no analysis
    axes = _colour_axes([*runs, *_pending_runs(index, store.list_runs(path))], index)  # as write_report does
    axes += _setting_axes(runs, axes)
    groups = _groups(runs, axes)
    assert sorted(len(m) for m in groups.members.values()) == [2, 2]
    assert sorted(groups.labels[k] for k in groups.keys) == ["init_scale=1, lr=0.001", "init_scale=1, lr=0.01"]
    # The runs table names what the legends tell apart: it listed init_scale and seed only, so a
    # run could not be told to be in the lr=0.001 group or the lr=0.01 one.
    page = write_report(path, tmp_path / "out", compute_missing=False).read_text()
    table = page[page.index("<table>"):page.index("</table>")]
    assert "<th>init_scale</th><th>seed</th><th>lr</th>" in table
    # in the grid's order, as `dynamics status` lists them (init_scale, then seed), not by id; at
    # one point, in the order the index records the runs: the lr=0.01 sweep's before the lr=0.001 one's
    order = list(points)
    grid = [*sorted(runs, key=lambda r: (r.params["train.seed"], order.index(r.run_id))), "rother"]
    assert re.findall(r"<tr><td><code>(\w+)</code>", table) == [getattr(r, "run_id", r) for r in grid]
    for r in runs:
        lr = store.run_attrs(path, r.run_id)["config"]["train"]["lr"]
        assert re.search(f"<code>{r.run_id}</code>(?: \\(shown\\))?</td><td>1</td><td>{r.params['train.seed']}</td><td>{lr:g}</td>", table)


def test_the_runs_table_names_the_setting_that_tells_runs_at_one_swept_point_apart():
    # A seed sweep from two base configs (--set train.lr=...) into one store, and a seed sweep of
    # conditioned gates beside its free runs (README, Configs): the runs table showed only the swept
    # columns, so the two runs of one seed were two identical rows.
    from dynamics.config import from_dict, with_values
    from dynamics.identity import seed_settings
    from dynamics.report.data import _table_settings
    from dynamics.report.page import _runs_table

    base = from_dict(TINY)
    gated = from_dict({**TINY, "intervene": {"conditioned_gates": {"pool": "mean"}}})

    def run(rid, cfg, seed):
        return _Run(rid, "completed", {"train.seed": seed}, 1.0, 3, np.ones(3, bool), np.arange(3),
                    settings=seed_settings(with_values(cfg, {"train.seed": seed}).to_dict()))

    pending = _Run("rp", "pending", {"train.seed": 1}, None, 3, np.zeros(3, bool), np.arange(3))

    def table(runs):
        axes = ["train.seed", *_table_settings(runs, ["train.seed"], ["train.seed"])]
        text = _runs_table([*runs, pending], axes, None)
        return text, {r.split("</code>")[0]: re.findall(r"<td>([^<]*)</td>", r)[:len(axes)]
                      for r in text.split("<tr><td><code>")[1:]}

    text, rows = table([run("ra", with_values(base, {"train.lr": 3e-3}), 0), run("rb", base, 0)])
    assert "<th>seed</th><th>lr</th>" in text
    assert rows == {"ra": ["0", "0.003"], "rb": ["0", "0.01"], "rp": ["1", ""]}  # pending: no settings to show
    text, rows = table([run("ra", gated, 0), run("rb", base, 0)])
    assert "<th>conditioned_gates</th>" in text and rows["rb"] == ["0", "none"] and "mean" in rows["ra"][1]


def test_the_runs_table_and_status_name_the_same_settings_in_the_same_order():
    # Two copies of one grouping: status sorted the settings that differ at some swept point, the
    # report listed them point by point, so one store's two tables put them in other orders when
    # two points differ in different settings (lr at seed 0, the gates at seed 1).
    from dynamics.config import from_dict, with_values
    from dynamics.identity import seed_settings
    from dynamics.report.data import _table_settings
    from dynamics.status import setting_columns

    base = from_dict(TINY)
    gated = from_dict({**TINY, "intervene": {"conditioned_gates": {"pool": "mean"}}})
    runs = [(rid, with_values(cfg, {"train.seed": seed}))
            for rid, cfg, seed in (("ra", with_values(base, {"train.lr": 3e-3}), 0), ("rb", base, 0),
                                   ("rc", base, 1), ("rd", gated, 1))]
    report = [_Run(rid, "completed", {"train.seed": cfg.train.seed}, 1.0, 3, np.ones(3, bool), np.arange(3),
                   settings=seed_settings(cfg.to_dict())) for rid, cfg in runs]
    status = setting_columns({rid: seed_settings(cfg.to_dict()) for rid, cfg in runs},
                             {rid: [str(cfg.train.seed)] for rid, cfg in runs})
    assert status == ["intervene.conditioned_gates", "train.lr"]
    assert _table_settings(report, ["train.seed"], ["train.seed"]) == status


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
    # Ranked among all three runs of the sweep (0.45: the middle of the 0..0.9 range), not among
    # the two that have gates, where init_scale 1.0 would take the colour of 0.5 in the curves.
    assert [tuple(np.round(c.get_facecolors()[0, :3], 4)) for c in dots] == [
        tuple(np.round(to_rgba(viridis(x))[:3], 4)) for x in (0.45, 0.9)]


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
    share = {line.get_label(): line.get_ydata().tolist() for line in figs["chg.png"].axes[2].get_lines()}
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


def test_status_pending_and_stopped_runs(tmp_path):
    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0}}, status="running")
    index = store.read_sweep_index(path)
    index["runs"]["r9"] = {"model.init_scale": 2.0, "train.seed": 0}  # in the sweep, never started
    store.write_sweep_index(path, index)

    def rows(text):
        return {m.group(1): m.group(0) for m in re.finditer(r"<tr><td><code>(\w+)</code>.*?</tr>", text)}

    text = write_report(path, tmp_path / "a").read_text()
    assert ">stopped<" in rows(text)["r0"]  # "running", but no process holds its training lock
    assert ">pending<" in rows(text)["r9"] and "not started yet" in rows(text)["r9"]
    assert "1 pending, 1 stopped (1 of 2 runs of the sweep index started)" in text
    assert "have not started yet (pending): r9" in text
    with store.run_lock(path, "r0"):  # a live trainer holds it
        text = write_report(path, tmp_path / "b").read_text()
    assert ">running<" in rows(text)["r0"]


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
    assert ((2.0, ticks["not yet"]), True) in marks  # unfinished without it: "not yet", not "never"
    (mean_line,) = ax.get_lines()
    assert mean_line.get_xydata().tolist() == [[1.0, 20.0]]  # finished runs where it happened only
    assert mean_line.get_marker() not in (None, "None", "", " ")  # one point: a bare line drew nothing
    caption = sec.figures[0][1]
    assert "live (running)" in caption and "stopped (stopped)" in caption and "not yet" in caption
    assert "bifurcation: 1 of 3 finished run(s) never reached it, 1 of 2 unfinished run(s) not yet" in caption
    assert "mean over the finished runs where the event happened" in caption


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


def test_a_run_outside_the_sweep_index_shows_its_own_nested_swept_value(tmp_path):
    # A run trained into a sweep's store by `dynamics run` is not in the sweep index: its value of
    # each swept axis comes from its own config, at any depth (intervene.templates.weight).
    from dynamics.config import from_dict

    cfg = from_dict(TINY)
    raw = cfg.to_dict()
    raw.pop("sweep")
    raw["intervene"] = {"templates": {"weight": 0.5, "heads": [{"layer": 0, "head": 0, "pattern": "previous_token"}]}}
    path = tmp_path / "s.zarr"
    _written_run(path, "rextra", cfg, "completed", config=raw)
    store.write_sweep_index(path, {"axes": ["intervene.templates.weight", "train.seed"], "runs": {}})
    text = write_report(path, tmp_path / "out", compute_missing=False).read_text()
    row = re.search(r"<tr><td><code>rextra</code>.*?</tr>", text).group(0)
    assert re.findall(r"<td>([^<]*)</td>", row)[:2] == ["0.5", "0"], row


def test_started_count_is_over_the_sweep_index_only(tmp_path):
    # rx was trained into the sweep's store by `dynamics run`: it is listed, but it is not one of
    # the sweep index's runs, so it must not count as a started run of the sweep.
    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0},
                            "rx": {"model.init_scale": 2.0, "train.seed": 0}})
    index = store.read_sweep_index(path)
    del index["runs"]["rx"]
    index["runs"]["r9"] = {"model.init_scale": 4.0, "train.seed": 0}  # in the sweep, never started
    store.write_sweep_index(path, index)
    text = write_report(path, tmp_path / "out", compute_missing=False).read_text()
    assert "2 completed, 1 pending (1 of 2 runs of the sweep index started)" in text


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


def test_a_diverged_runs_captions_do_not_wait_for_more_snapshots(built, tmp_path):
    # Run C's 6 of 9 snapshots, relabelled as a run that diverged there: it will record no more,
    # so its captions must not say "so far", as they do for a run that may still be resumed.
    path, _, ids = built
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    store.update_run_attrs(copy, ids["C"], status="diverged")
    text = html.unescape(write_report(copy, tmp_path / "out", run_id=ids["C"]).read_text())
    assert "Only 6 of 9 snapshots were recorded (diverged)." in text
    assert "(the last snapshot recorded before it diverged)" in text and "so far (diverged)" not in text
    live = html.unescape(write_report(path, tmp_path / "live", run_id=ids["C"]).read_text())
    assert "Only 6 of 9 snapshots are recorded so far (stopped)." in live


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


def test_an_analysis_stored_by_older_analysers_is_recomputed_and_said_so(built, tmp_path):
    # Run A's stored analysis, stamped as another version: its numbers are not mixed with this version's.
    path, _, ids = built
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    stale = store.open_analysis(copy, ids["A"]).load()
    stale.attrs["analysis_version"] = 1
    store.write_analysis(copy, ids["A"], stale)
    text = html.unescape(write_report(copy, tmp_path / "out").read_text())
    row = re.search(rf"<tr><td><code>{ids['A']}</code>.*?</tr>", text).group(0)
    assert "computed for this report (not stored); the stored one is from an older version of the analysers" in row
    assert "stored by `dynamics analyse`" not in row
    # without computing, the chosen run's figures say the same, not that it has no analysis
    text = html.unescape(write_report(copy, tmp_path / "out2", run_id=ids["A"], compute_missing=False).read_text())
    assert "role labels not available because the run's stored analysis is from an older version" in text
    assert (f"the dendrogram and JS matrix of run {ids['A']} because the run's stored analysis is from an older "
            "version") in text


def test_a_damaged_stored_analysis_is_recomputed_and_said_so(built, tmp_path):
    # It was recomputed without a word: the page read as if nothing were wrong with the store
    path, _, ids = built
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    chunk = next(p for p in sorted((copy / "analysis" / ids["A"] / "role" / "c").rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x08
    chunk.write_bytes(bytes(data))
    said = ("its stored analysis could not be read (a chunk failed its checksum; `dynamics analyse` writes it "
            "again)")
    text = html.unescape(write_report(copy, tmp_path / "out").read_text())
    row = re.search(rf"<tr><td><code>{ids['A']}</code>.*?</tr>", text).group(0)
    assert f"computed for this report (not stored); {said}" in row
    text = html.unescape(write_report(copy, tmp_path / "out2", compute_missing=False).read_text())
    assert said in re.search(rf"<tr><td><code>{ids['A']}</code>.*?</tr>", text).group(0)
    # a chunk file lost, from the analysis and from the predictor's curve: named, not read as fill values
    chunk.unlink()
    curve = next(p for p in sorted((copy / "derived").glob("predict*")))
    next(p for p in sorted((curve / "score" / "c").rglob("*")) if p.is_file()).unlink()
    text = html.unescape(write_report(copy, tmp_path / "out3").read_text())
    row = re.search(rf"<tr><td><code>{ids['A']}</code>.*?</tr>", text).group(0)
    assert (f"its stored analysis could not be read (StoreError: {copy}: analysis/{ids['A']}: array role has 1 of "
            f"its 1 chunk(s) missing") in row
    assert (f"Not available: the predictor curve derived/{curve.name} because it could not be read ({copy}: "
            f"derived/{curve.name}: array score has 1 of its") in text


def _flip(folder: Path) -> Path:
    """Flip one bit in the middle of the first chunk file under `folder`; returns the chunk."""
    chunk = next(p for p in sorted(folder.rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x20
    chunk.write_bytes(bytes(data))
    return chunk


def test_a_recording_or_curve_failing_its_checksum_is_named_where_it_was_read(built, tmp_path, capsys):
    # zarr's own error stood on the page ("ValueError: Stored and computed checksum do not match.
    # Stored: b'...'"), a whole section lost for one curve, and the command exited 0 saying nothing
    path, _, ids = built
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    _flip(copy / "runs" / ids["B"] / "head" / "c")  # read as the run is opened
    chunk = _flip(copy / "runs" / ids["A"] / "attention" / "c")  # read for the attention maps of A, shown
    curve = next(p for p in sorted((copy / "derived").glob("predict*")))
    _flip(curve / "score" / "c")
    assert cli.main(["report", str(copy), "--out", str(tmp_path / "out"), "--run", ids["A"]]) == 1
    err = capsys.readouterr().err
    assert (f"dynamics: {copy}: run {ids['B']}: array head: its chunk runs/{ids['B']}/head/c/0 cannot be decoded "
            f"(damaged: its CRC32C checksum does not match") in err
    assert err.strip().splitlines()[-1] == f"dynamics: 1 run(s) could not be read (damaged), skipped: {ids['B']}"
    text = html.unescape((tmp_path / "out" / "index.html").read_text())
    assert re.search(rf"<code>{ids['B']}</code></td>.*?<td>damaged</td>", text)
    snapshot = chunk.relative_to(copy / "runs" / ids["A"] / "attention" / "c").parts[0]
    assert (f"Not available: the attention figures because building them failed ({copy}: run {ids['A']}: array "
            f"attention at snapshot {snapshot}") in text
    assert (f"Not available: the predictor curve derived/{curve.name} because it could not be read (a chunk failed "
            f"its checksum).") in text
    assert "Stored and computed checksum" not in text


def test_js_distances_failing_their_checksum_are_recomputed_and_the_caption_says_so(built, tmp_path):
    # The runs table reads no JS distances, so it said "stored by `dynamics analyse`" while the
    # dendrogram was recomputed from the recordings without a word
    path, _, ids = built
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    _flip(copy / "analysis" / ids["A"] / "js_distance" / "c")
    text = html.unescape(write_report(copy, tmp_path / "out", run_id=ids["A"]).read_text())
    assert f"Run {ids['A']} at step" in text and ", analysed for this report, its stored analysis could not be read. " in text


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
    slash.attrs.update(runs_left_out=["rdiv (diverged)"], folds_sharing_seeds=1, n_splits=3)  # as predict tells them
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
            "test targets are one class: points are means over the other 1, no band from one fold") in text
    assert "Left out: 1 run(s) not completed, so without a final role (rdiv (diverged))." in text
    assert "Caution: in 1 of 3 folds a test run shares its seed" in text
    assert "Left out" not in captions["predict_role.png"] and "Caution" not in captions["predict_role.png"]
    assert "predict_redundant.png" not in captions
    assert sec.missing == ["Not available: predictor curves for redundant because its AUROC is undefined on every test "
                           "fold of derived/predict.redundant (seed=0; seed=1; seed=2), whose test targets are one class."]


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


def test_write_report_keeps_files_no_report_wrote(tmp_path):
    # write_report deletes figures/*.png before drawing: in a folder with no report page those
    # were the user's own figures, and were lost (the index.html check was in the CLI only).
    path = tmp_path / "s.zarr"
    store.init_store(path)
    paper = tmp_path / "paper"
    (paper / "figures" / "attention").mkdir(parents=True)
    (paper / "figures" / "attention" / "fig1.png").write_bytes(b"mine")
    with pytest.raises(store.StoreError, match=r"holds figures/\*\.png but no report index.html"):
        write_report(path, paper)
    assert (paper / "figures" / "attention" / "fig1.png").read_bytes() == b"mine"
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<html>my notes</html>")
    with pytest.raises(store.StoreError, match="holds an index.html that is not a dynamics report"):
        write_report(path, site)
    assert (site / "index.html").read_text() == "<html>my notes</html>"
    # A folder named index.html was a traceback (IsADirectoryError); a link to nothing was replaced.
    (site / "index.html").unlink()
    (site / "index.html").mkdir()
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "index.html").symlink_to(tmp_path / "nowhere")
    for folder in (site, tmp_path / "link"):
        with pytest.raises(store.StoreError, match="holds an index.html that is not a file"):
            write_report(path, folder)
    assert (site / "index.html").is_dir() and (tmp_path / "link" / "index.html").is_symlink()


def test_a_file_named_figures_is_refused_in_one_line(tmp_path, capsys):
    # It crashed with a FileExistsError traceback when the report made its figures folder.
    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0}})
    out = tmp_path / "out"
    out.mkdir()
    (out / "figures").write_text("mine")
    assert cli.main(["report", str(path), "--out", str(out)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a file named figures" in err
    assert (out / "figures").read_text() == "mine" and not (out / "index.html").exists()


def test_a_report_folder_without_write_permission_is_refused_in_one_line(tmp_path, capsys):
    # An existing folder was not checked for permission: a PermissionError traceback when the
    # report made its figures folder.
    import os
    import subprocess

    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0}})
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o555)
    immutable = os.access(out, os.W_OK)  # root writes anyway: make the folder immutable instead
    if immutable and subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode != 0:
        out.chmod(0o755)
        pytest.skip("no way to make a folder unwritable here (root, and chattr +i refused)")
    try:
        assert cli.main(["report", str(path), "--out", str(out)]) == cli.EXIT_BAD_INPUT
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(out)], check=True)
        out.chmod(0o755)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {out}: no permission to write in {out}" in err
    assert not any(out.iterdir())


def test_report_reads_each_runs_attributes_once_and_lists_a_damaged_run_as_damaged(tmp_path, monkeypatch, capsys):
    # The CLI read every run's attributes to look for damage, then the report read them again for
    # its rows (a damaged run three times, and listed with status "unknown").
    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0},
                            "r1": {"model.init_scale": 2.0, "train.seed": 0}})
    meta = path / "runs" / "r1" / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])
    reads = []
    real = store.run_attrs
    monkeypatch.setattr(store, "run_attrs", lambda p, rid: reads.append(rid) or real(p, rid))
    assert cli.main(["report", str(path), "--out", str(tmp_path / "out"), "--no-compute"]) == 1
    assert sorted(reads) == ["r0", "r1"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "dynamics: 1 run(s) could not be read (damaged), skipped: r1"
    assert "runs/r1/zarr.json cannot be read (damaged)" in [line for line in err if not line.startswith("[report]")][0]
    text = (tmp_path / "out" / "index.html").read_text()
    assert re.search(r"<code>r1</code></td><td>2</td><td>0</td><td>damaged</td>", text)  # not the run shown
    assert "<code>r0</code> (shown)" in text


def test_a_report_stopped_while_deleting_an_old_folder_leaves_it_for_the_next(tmp_path, monkeypatch):
    # rmtree took the marker whenever the listing gave it first: stopped part-way (a kill-anywhere
    # audit), half a folder stayed that no later report knew for its own. And a report stopped
    # between making its folder and marking it left an empty folder nothing removed.
    from dynamics.report import page as page_module

    path = tmp_path / "s.zarr"
    store.init_store(path)
    out = tmp_path / "out"
    figures = out / "figures"
    stopped = figures / "20240101-120000-0"  # a report stopped part-way: marked, never linked
    (stopped / "attention").mkdir(parents=True)
    (stopped / page_module._MARK).write_text("")
    for i in range(16):
        (stopped / f"fig{i}.png").write_bytes(b"png")
        (stopped / "attention" / f"snapshot_{i:04d}.png").write_bytes(b"png")
    empty = figures / "20240101-120000-1"  # made, stopped before its marker
    empty.mkdir()
    mine = figures / "20240101-120000-2"  # named like one, but the user's
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    unlinked = []
    real = os.unlink
    monkeypatch.setattr(os, "unlink", lambda p, *a, **k: (unlinked.append(os.fsdecode(p)), real(p, *a, **k))[1])
    write_report(path, out)
    monkeypatch.undo()
    in_stopped = [Path(p).name for p in unlinked if Path(p).name.startswith(("fig", "snapshot", page_module._MARK))]
    assert len(in_stopped) == 33 and in_stopped[-1] == page_module._MARK, in_stopped  # the marker last
    assert not stopped.exists() and not empty.exists()
    assert (mine / "notes.txt").read_text() == "mine"


def test_a_figure_folder_that_is_a_link_is_not_followed(tmp_path):
    # A figures/<generation> that is a symlink: the marker-last deletion listed and deleted what
    # it pointed to, outside the report's folder (rmtree, before it, refused a link).
    from dynamics.report import page as page_module

    path = tmp_path / "s.zarr"
    store.init_store(path)
    elsewhere = tmp_path / "kept" / "20240101-120000-0"
    (elsewhere / "sub").mkdir(parents=True)
    for f in (elsewhere / page_module._MARK, elsewhere / "precious.png", elsewhere / "sub" / "a.png"):
        f.write_bytes(b"x")
    figures = tmp_path / "out" / "figures"
    figures.mkdir(parents=True)
    (figures / elsewhere.name).symlink_to(elsewhere, target_is_directory=True)
    write_report(path, tmp_path / "out")
    assert sorted(p.name for p in elsewhere.rglob("*")) == sorted([page_module._MARK, "precious.png", "sub", "a.png"])


def test_a_second_report_into_a_folder_being_written_is_refused_in_one_line(tmp_path, capsys):
    # Two reports into one folder at once: the first to end deleted the other's figures folder
    # (and page draft), so the page left behind linked to PNGs that were gone.
    fcntl = pytest.importorskip("fcntl")
    import os

    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0}})
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as the report being written holds it
        assert cli.main(["report", str(path), "--out", str(out)]) == cli.EXIT_BAD_INPUT
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"another dynamics report is being written into {out}" in err
    assert not any(out.iterdir())


def test_a_report_stopped_part_way_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    # write_report deleted the old figures first and replaced index.html last: stopped in between
    # (Ctrl-C, SIGKILL), the old page linked to PNGs that were gone.
    from dynamics.report import page as page_module

    path = tmp_path / "s.zarr"
    store.init_store(path)  # no runs: one figure, the predictor curve (derived/ only)
    store.write_derived(path, "predict.slash", _predict_curve())
    out = tmp_path / "out"
    before = write_report(path, out).read_text()
    linked = _srcs(before)
    assert [Path(s).name for s in linked] == ["predict_slash.png"]

    def stopped(ctx):
        raise KeyboardInterrupt  # as Ctrl-C, in the first section

    monkeypatch.setattr(page_module, "_attention_section", stopped)
    with pytest.raises(KeyboardInterrupt):
        write_report(path, out)
    monkeypatch.undo()
    assert (out / "index.html").read_text() == before
    assert _png_ok(out / linked[0])
    assert [p.name for p in (out / "figures").iterdir()] == [Path(linked[0]).parts[1]]  # the unfinished one went

    killed = out / "figures" / "20000101-000000-0"  # what a SIGKILL part-way leaves: a folder no page links to
    (killed / "attention").mkdir(parents=True)
    (killed / page_module._MARK).write_text("")  # made by a report
    (out / ".index.html.20000101-000000-0.tmp").write_text("half a page")
    (out / "figures" / "mine").mkdir()  # not a name a report gives: the user's, kept
    after = _srcs(write_report(path, out).read_text())
    assert _png_ok(out / after[0]) and after != linked
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(["mine", Path(after[0]).parts[1]])
    assert sorted(p.name for p in out.iterdir()) == ["figures", "index.html"]


def test_a_report_deletes_only_figure_folders_it_made_or_its_page_linked_to(tmp_path):
    # Every folder of figures/ named like a report's (<date>-<time>-<n>) was deleted by the next
    # report, so a user's figures/20240101-120000-0/ went; and with a report page present, every
    # figures/*.png went too, the user's included.
    path = tmp_path / "s.zarr"
    store.init_store(path)  # no runs: no figures are drawn, only folders made and deleted
    out = tmp_path / "out"
    figures = out / "figures"
    mine = figures / "20240101-120000-0"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    (figures / "attention").mkdir()  # empty, and no page links into it: the user's
    write_report(path, out)
    assert (figures / "attention").is_dir()
    first = next(p.name for p in figures.iterdir() if p not in (mine, figures / "attention"))
    (figures / "fig1.png").write_bytes(b"mine")  # the user's, beside a report
    # A page written before figures went into folders (and before folders had the marker): it
    # links to figures/*.png, figures/attention/*.png and an unmarked generation folder; those go.
    old = figures / "20230101-000000-0"
    old.mkdir()
    for f in (figures / "emergence.png", figures / "attention" / "snapshot_0000.png", old / "bifurcation.png"):
        f.write_bytes(b"old")
    frames = json.dumps([{"src": "figures/attention/snapshot_0000.png", "step": 0, "label": "step 0"}])
    (out / "index.html").write_text(
        f'<!DOCTYPE html><html><head><title>dynamics report: s.zarr</title></head><body>'
        f'<p>Store <code>/data/figures/{mine.name}/s.zarr</code></p>'  # a path named on the page is no link
        f'<img src="figures/emergence.png"><img src="figures/20230101-000000-0/bifurcation.png">'
        f'<img src="figures/{first}/x.png"><script type="application/json" id="frames-data">{frames}</script></body></html>')
    write_report(path, out)
    left = {p.name for p in figures.iterdir()} - {mine.name, "fig1.png"}
    assert (mine / "notes.txt").read_text() == "mine" and (figures / "fig1.png").read_bytes() == b"mine"
    assert len(left) == 1 and left != {first}  # the new report's folder only


def test_the_new_report_is_on_disk_before_its_page_is_switched(tmp_path, monkeypatch):
    # Nothing was fsynced: after a power cut, the renamed index.html could link to figures whose
    # data never reached the disk, the previous figures deleted. A power cut cannot be staged
    # here, so the order of the real system calls is recorded instead.
    import os

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name the file an fsync'd descriptor is")
    path = tmp_path / "s.zarr"
    store.init_store(path)
    out = tmp_path / "out"
    calls = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append(("replace", str(b))) or replace(a, b))
    write_report(path, out)
    monkeypatch.undo()
    switch = calls.index(("replace", str(out / "index.html")))
    before = {p for _, p in calls[:switch]}
    stage = next((out / "figures").iterdir())
    made = [stage, *stage.rglob("*"), out / "figures"]
    assert all(str(p) in before for p in made), (made, before)
    assert any(Path(p).name.startswith(".index.html.") for p in before)  # the page's draft
    assert ("fsync", str(out)) in calls[switch:]  # the rename itself, before the old figures go


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
    assert _outdated(_predict_curve(), ctx(rc="completed")) == ""  # a curve without its runs: nothing to compare


def test_predictor_band_is_the_capped_one_predict_judged_and_the_caption_gives_its_answer(tmp_path, monkeypatch):
    # With 2 folds mean + sd passes 1, which no fold can score: the figure filled mean -+ sd while
    # `dynamics predict` judged "how early" on the band capped to [0, 1], and the caption did not
    # say what it had answered.
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
    curve.attrs["readable_summary"] = answer.line
    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_derived(path, "predict.slash", curve)
    figs = {}
    monkeypatch.setattr(predictor, "_save", lambda fig, out, rel: figs.setdefault(rel, fig) and rel)
    sec = predictor._predict_section(_Ctx(path, [], None, [], tmp_path, True))
    ax = figs["predict_slash.png"].axes[0]
    tops = [float(p.vertices[:, 1].max()) for c in ax.collections for p in c.get_paths()]
    assert len(tops) == 6 and max(tops) == 1.0  # linear's band reaches 1, capped; none passes it
    caption = dict(sec.figures)["predict_slash.png"]
    assert "band: +-1 s.d. (capped to the metric's range) over 2 cross-validation folds" in caption
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


def test_chg_taxonomy_shares_over_training_are_fractions_of_the_heads_at_each_fit(tmp_path, monkeypatch):
    # A share over heads x fits (sum / labels.size) drew the same single-fit figure and halved
    # these two fits' shares: each point is the fraction of the 4 heads holding the label then.
    from dynamics.config import from_dict
    from dynamics.gates import UNFITTED
    from dynamics.record import coords, snapshot_steps, variables
    from dynamics.report import chg

    raw = json.loads(json.dumps(TINY))
    cfg = from_dict(raw | {"record": raw["record"] | {"chg_every": 4, "chg_steps": 5}})
    path = tmp_path / "s.zarr"
    _written_run(path, "r0", cfg, "completed")
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    S, L, H = len(steps_at), cfg.model.n_layers, cfg.model.n_heads
    assert (L, H) == (2, 2) and S >= 3
    position = {0: (0.9, 0.9), 1: (0.9, 0.1), 2: (0.1, 0.1)}  # facilitating, irrelevant, interfering
    codes = {0: [0, 0, 0, 0], 2: [0, 1, 2, 2]}  # fitted at snapshots 0 and 2 only
    gates = np.full((S, L, H, 2), np.nan, np.float32)
    roles = np.full((S, L, H), UNFITTED, np.int8)
    for i, cs in codes.items():
        gates[i] = np.array([position[c] for c in cs], np.float32).reshape(L, H, 2)
        roles[i] = np.array(cs, np.int8).reshape(L, H)
    writer = store.RunWriter(path, "r0", variables=variables(cfg, S), coords=coords(cfg, steps_at), attrs={},
                             resume=True)
    writer.write_region("chg", 0, gates)
    writer.write_region("chg_role", 0, roles)
    writer.finalize()

    figs = _capture_figures(monkeypatch, chg)
    write_report(path, tmp_path / "out", compute_missing=False)
    ax3 = next(ax for ax in figs["chg.png"].axes if ax.get_ylabel() == "heads with this CHG label (fraction)")
    share = {line.get_label(): line.get_xydata().tolist() for line in ax3.get_lines()}
    at = [float(steps_at[0]), float(steps_at[2])]
    assert share["facilitating"] == [[at[0], 1.0], [at[1], 0.25]]
    assert share["irrelevant"] == [[at[0], 0.0], [at[1], 0.25]]
    assert share["interfering"] == [[at[0], 0.0], [at[1], 0.5]]
