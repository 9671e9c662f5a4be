"""The page: ``write_report`` builds every section and writes one self-contained HTML file
(inline style and plain JavaScript: the step slider, and a self-test for the browser test)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import html
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from time import monotonic

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from dynamics import store
from dynamics.caveats import text
from dynamics.grid import grid_key
from dynamics.identity import setting_cell
from dynamics.paths import shown
from dynamics.refused import WRITE_REFUSED
from dynamics.report.attention import _attention_section
from dynamics.report.chg import _chg_section
from dynamics.report.data import (
    _choose_run,
    _collect_or_note,
    _colour_axes,
    _Ctx,
    _pending_runs,
    _Run,
    _Section,
    _setting_axes,
    _table_settings,
    chosen_why,
    training_notes,
)
from dynamics.report.draw import _alt, _prose, _short, _warn
from dynamics.report.emergence import _bifurcation_section, _emergence_section
from dynamics.report.predictor import _predict_section
from dynamics.report.redundancy import _redundancy_section
from dynamics.status import sweep_points

# --------------------------------------------------------------------------- public API


def write_report(
    store_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    run_id: str | None = None,
    *,
    compute_missing: bool = True,
    on_damaged: Callable[[str, str], None] | None = None,
    on_damaged_data: Callable[[str], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write the HTML report of a store: ``out_dir/index.html`` plus ``out_dir/figures/<generation>/``.

    The write is atomic from a reader's view: the figures are drawn into a new folder
    ``figures/<generation>/`` that nothing links to yet, the page is written beside index.html
    and moved onto it (one rename), and only then are the previous report's figures deleted.
    At every moment the folder holds the previous complete report or the new one; a report
    stopped part-way (Ctrl-C, SIGKILL) leaves the previous one as it was, and its unlinked
    folder is removed by the next report. The new files are fsynced before the rename, so a
    power cut does not leave a page linking to empty figures either.

    Parameters
    ----------
    store_path : str or PathLike
        A dynamics store (local path or fsspec URL); only read.
    out_dir : str or PathLike
        Local directory, created if missing. ``index.html`` and the report's folders in
        ``figures/`` are replaced; nothing else in it is touched.
    run_id : str, optional
        The run whose attention maps, dendrogram and JS matrix are shown. Default: the
        completed run with the median final loss (a typical run, not the luckiest seed);
        without completed runs, the one with the most recorded snapshots.
    compute_missing : bool
        Analyse runs that have no stored analysis in memory, on their recorded snapshots
        (True), or name them as missing (False).
    on_damaged : callable, optional
        Called with the run id and the store's one-line reason for each run whose group
        cannot be read (damaged); the page lists such a run as "damaged" either way.
    on_damaged_data : callable, optional
        Called with one line for each piece of stored data, in a run the page does not list as
        damaged, that could not be read because it is damaged (a lost chunk, a failed checksum):
        a run's stored analysis, a derived curve or gates dataset, the recordings a section
        draws. The page says each where the data would have been shown, either way.
    on_note : callable, optional
        Called with each note the page carries under its heading: runs not all trained by the same
        code (:func:`dynamics.provenance.mixed_code`), or torch build, device and CPU kernels
        (``mixed_execution``), or data for one task setting (``mixed_data``); and, once written, with a line on
        earlier figures that could not be removed (without it: on the page only; a RuntimeWarning).
    progress : callable, optional
        Called with a line on where the report is: as it starts reading the runs, between
        two runs at most every 5 s while it reads them (reading a run can mean analysing it,
        with ``compute_missing``: one long run is one long pause), and as it starts each
        section's figures.

    Returns
    -------
    Path
        ``out_dir/index.html``; open it in a browser (``file://`` works).

    Raises
    ------
    StoreError
        If `store_path` is not a store, `run_id` is not one of its runs, `out_dir` holds
        an index.html or figures/*.png that no report wrote, or another report is being
        written into `out_dir`.

    Example
    -------
    >>> page = write_report("runs/quickstart.zarr", "runs/quickstart-report")  # doctest: +SKIP
    >>> print(page.as_uri())  # doctest: +SKIP
    """
    progress = progress or (lambda line: None)
    if not store.is_store(store_path):
        raise store.StoreError(f"not a dynamics store: {store_path}")
    ids = store.list_runs(store_path, damaged="include")  # a damaged run is listed as unreadable
    if run_id is not None and run_id not in ids:
        raise store.StoreError(f"no run {run_id!r} in {store_path}; runs: {', '.join(ids) or '(none)'}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise store.StoreError(f"report directory {out} exists and is not a directory")
    refuse_foreign_files(out)  # before the folder is made: a refused one is left as it was
    out.mkdir(parents=True, exist_ok=True)
    with _sole_writer(out):  # two reports at once deleted each other's figures
        earlier = _linked_figures(out / "index.html")  # read before the page is replaced
        (out / "figures").mkdir(parents=True, exist_ok=True)
        stage = _new_generation(out / "figures")
        page, draft = out / "index.html", out / f".index.html.{stage.name}.tmp"
        try:
            (stage / "attention").mkdir()
            index = sweep_points(store_path, ids) or None  # an entry that is no run id: no point, not pending
            runs = _read_runs(store_path, ids, index, compute_missing, on_damaged, progress)
            notes = training_notes(runs)
            for note in notes if on_note is not None else []:
                on_note(note)
            pending = _pending_runs(index, ids)  # in the sweep index, not started: listed, never drawn
            chosen = run_id or _choose_run(runs)
            axes = _colour_axes([*runs, *pending], index)  # pending runs too: colours stay put as the sweep fills in
            axes += _setting_axes(runs, axes)
            href = f"figures/{stage.name}/"
            ctx = _Ctx(store_path, runs, chosen, axes, stage, compute_missing, pending=pending, href=href)
            sections = []
            for name, make in (("attention maps", _attention_section), ("emergence curves", _emergence_section),
                               ("bifurcation", _bifurcation_section), ("redundancy", _redundancy_section),
                               ("causal head gating", _chg_section), ("predictor", _predict_section)):
                progress(f"drawing {name}")
                sections.append(_safe(make, ctx))

            table_axes = list((index or {}).get("axes", []))  # every swept axis, varied among these runs or not
            table_axes += _table_settings(runs, table_axes, axes)
            swept = set((index or {}).get("runs", {}))
            draft.write_text(shown(_page(store_path, runs, chosen, table_axes, sections, compute_missing, pending,
                                          swept, href, index, notes)), encoding="utf-8")  # a path in any sentence
            _fsync_tree(stage, draft)
            os.replace(draft, page)  # the switch: one rename, so a reader sees the old page or the new one
        except BaseException:  # Ctrl-C included: the previous report stays whole, the new figures go
            draft.unlink(missing_ok=True)
            shutil.rmtree(stage, ignore_errors=True)
            raise
        _fsync(out)  # the rename on disk before old figures go; past the clean-up, which deleted the new ones
        try:
            _remove_earlier_reports(out, keep=stage.name, linked=earlier)
        except OSError as e:  # the new page is in place and whole: "stopped, run it again" said it was not
            (on_note or _warn)(f"the report is written, but the earlier report's figures could not all be removed "
                               f"({e.strerror or e} on {e.filename or out / 'figures'}); the next report tries again")
        # once the page that names them is in place; a run listed as damaged went to on_damaged
        for line in dict.fromkeys([*(d for r in runs if r.status != "damaged" for d in r.damage), *ctx.damaged]):
            if on_damaged_data is not None:
                on_damaged_data(line)
        return page.absolute()  # as_uri(), as its example does, needs an absolute path


def _read_runs(store_path, ids: list[str], index: dict | None, compute_missing: bool,
               on_damaged: Callable[[str, str], None] | None, progress: Callable[[str], None]) -> list[_Run]:
    """Every run's data for the page, in the grid's order (`status`'s: a categorical axis was drawn in run-id order,
    hashes), with a progress line at the start and, between runs, at most every 5 s: the part of a report that grows
    with the store (and, analysing runs without a stored analysis, the slow one), where it had printed nothing."""
    missing = " (analysing those without a stored analysis)" if compute_missing else ""
    progress(f"reading {len(ids)} run(s){missing}")
    runs, last = [], monotonic()
    for i, rid in enumerate(sorted(ids, key=grid_key(index or {}))):
        if monotonic() - last >= 5.0:
            last = monotonic()
            progress(f"read {i}/{len(ids)} runs")
        runs.append(_collect_or_note(store_path, rid, index, compute_missing, on_damaged))
    return runs


# Figure folders of a report: figures/<date>-<time>-<n>, each holding the marker file _MARK from its
# start. A folder is deleted only with both, or when the previous page linked to it: a user's folder
# that happens to be named like one is not the report's to delete.
_GENERATION = re.compile(r"\d{8}-\d{6}-\d+")
_DRAFT = re.compile(r"\.index\.html\.\d{8}-\d{6}-\d+\.tmp")
_MARK = ".dynamics-report"
# What a page links to: figures/<generation>/..., or figures/*.png and figures/attention/*.png
# (reports written before figures went into folders of their own). Only img src and the frames'
# JSON "src" count: a caption naming a path (a store in a folder named figures/...) is no link.
_LINK = re.compile(r'(?:<img[^>]*\ssrc="|"src": ")(figures/[^"]+)"')


@contextlib.contextmanager
def _sole_writer(out: Path):
    """Hold an exclusive ``flock`` on the report folder, or raise StoreError at once.

    Each report deletes the figure folders of the others when it ends, so a second report
    into the same folder while one is being written (a second terminal, a loop) left a page
    whose figures were gone. Without fcntl (Windows) nothing is held.
    """
    if fcntl is None:
        yield
        return
    fd = os.open(out, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise store.StoreError(f"{out}: another dynamics report is being written into it; "  # the CLI puts
                                   f"wait for it to finish, or choose another folder") from None  # --out before
        yield
    finally:
        os.close(fd)  # releases the flock


def _new_generation(figures: Path) -> Path:
    """Create and return an unused ``figures/<date>-<time>-<n>`` folder (named by when it was made),
    with the marker that says a report made it."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    n = 0
    while True:
        folder = figures / f"{stamp}-{n}"
        try:
            folder.mkdir()
            break
        except FileExistsError:
            n += 1
    try:
        (folder / _MARK).write_text("figures of a dynamics report; deleted by the next report into this folder\n")
    except BaseException:  # a full disk: the folder (and an empty marker) would stay until the next report
        with contextlib.suppress(OSError):
            (folder / _MARK).unlink(missing_ok=True)
            folder.rmdir()
        raise
    return folder


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's entries to disk (best effort: some systems cannot open a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(stage: Path, draft: Path) -> None:
    """Put the new figures and page on disk before the page is switched.

    Without it, a power cut within seconds of a report (ext4's default delayed allocation)
    can leave the new index.html, written back on its rename, linking to PNGs still empty,
    and the previous figures deleted. fsync in threads: the file system commits them together
    (25 files: 0.01 s, against 0.1 s one after another).
    """
    from concurrent.futures import ThreadPoolExecutor

    folders = [stage, *(p for p in stage.rglob("*") if p.is_dir())]
    files = [p for p in stage.rglob("*") if p.is_file()] + [draft]
    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        list(pool.map(_fsync, files))
    for folder in [*folders, stage.parent]:  # the entries: the files in their folders, the folder in figures/
        _fsync(folder)


def _linked_figures(page: Path) -> set[str]:
    """The paths under figures/ (as "figures/...") that a report page links to; none without a page.

    Only a dynamics report's page is read here: `refuse_foreign_files` refused any other.
    """
    try:
        text = page.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return set()
    return {html.unescape(m) for m in _LINK.findall(text)}


def _remove_earlier_reports(out: Path, keep: str, linked: set[str]) -> None:
    """Delete what earlier reports left in `out`: the figure folders the old page linked to and
    those carrying the report's marker (of reports stopped part-way), their page drafts, and
    the PNGs that a page written before figures went into folders of their own linked to
    (figures/*.png and figures/attention/*.png). Everything else is the user's and stays."""
    figures = out / "figures"
    folders = {Path(rel).parts[1] for rel in linked if len(Path(rel).parts) > 2}
    for entry in figures.iterdir():
        # not a link: what it points to is outside the report's folder (rmtree refused one too)
        if entry.is_symlink() or not (entry.is_dir() and entry.name != keep and _GENERATION.fullmatch(entry.name)):
            continue
        if entry.name in folders or (entry / _MARK).is_file():
            _delete_generation(entry)
        else:  # made, and stopped before its marker was written: empty, so nobody's files
            with contextlib.suppress(OSError):
                entry.rmdir()
    for rel in linked:
        old = out / rel
        if old.suffix == ".png" and old.parent in (figures, figures / "attention") and old.is_file():
            old.unlink(missing_ok=True)
    legacy = figures / "attention"  # the old layout's frames folder, gone once the page's frames are
    if "attention" in folders and legacy.is_dir() and not any(legacy.iterdir()):
        legacy.rmdir()
    for entry in out.iterdir():
        if _DRAFT.fullmatch(entry.name):
            entry.unlink(missing_ok=True)


def _delete_generation(folder: Path) -> None:
    """Delete a report's figure folder, its marker last: rmtree took the marker when it came
    first in the listing, and a report stopped part-way through left half a folder that no
    later report would recognise as its own to delete."""
    for child in folder.iterdir():
        if child.name == _MARK:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)  # an error raised, not ignored: with the marker gone no later report took the rest
        else:
            child.unlink(missing_ok=True)
    (folder / _MARK).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


def refuse_foreign_files(out: Path) -> None:
    """StoreError for a directory whose index.html or figures/*.png a report did not write.

    The report replaces index.html, and figures/*.png are what reports written before figures
    went into ``figures/<generation>/`` folders left; in a folder with no report page, those are
    the user's files (the report would leave them, but does not mix its page into their folder).
    The CLI asks the same before any work (`usage.check_report_dir`).
    """
    page, figdir = out / "index.html", out / "figures"
    if figdir.exists() and not figdir.is_dir():  # the report's figures go in folders under it
        raise store.StoreError(f"{out} holds a file named figures; a report keeps its figures in a figures/ folder")
    if page.is_dir() or (page.is_symlink() and not page.exists()):  # the page is renamed onto it
        raise store.StoreError(f"{out} holds an index.html that is not a file (a folder, or a link to nothing); "
                               f"refusing to replace it")
    if page.exists():
        if "<title>dynamics report" not in page.read_text(errors="replace")[:2000]:
            raise store.StoreError(f"{out} holds an index.html that is not a dynamics report; refusing to replace it")
    elif figdir.is_dir() and any([*figdir.glob("*.png"), *figdir.glob("attention/*.png")]):
        raise store.StoreError(f"{out} holds figures/*.png but no report index.html; refusing to delete PNG files "
                               f"a dynamics report did not write")


def _safe(make: Callable, ctx: _Ctx) -> _Section:
    """Build one section; an unexpected error becomes a "Not available" line, not a crash."""
    try:
        return make(ctx)
    except OSError as e:
        # A full disk (or a file-size limit, a read-only filesystem) is no section's problem: as a
        # "Not available" line it replaced a whole report with a near-empty one, exit 0.
        if e.errno in WRITE_REFUSED:
            raise
        return _unavailable(make, ctx, e)
    except Exception as e:  # noqa: BLE001 - a report of a partial store must still be written
        return _unavailable(make, ctx, e)


def _unavailable(make: Callable, ctx: _Ctx, e: Exception) -> _Section:
    """The section of ``make`` that failed with ``e``: one "Not available" line naming why."""
    anchor = make.__name__.strip("_").removesuffix("_section")
    section = _Section(anchor, anchor.replace("_", " ").capitalize())
    why = f"{type(e).__name__}: {e}"
    if store.failed_checksum(e) or "decompression" in why:
        # a chunk that cannot be decoded: named with its run, array and snapshot (every chunk of
        # the runs read, on this failure only), not as zarr's bytes of both checksums
        found = (store.unreadable_chunk(ctx.path, r.run_id) for r in ctx.runs if r.status != "damaged")
        why = str(next((f for f in found if f is not None), None) or why)
        ctx.damaged.append(why)
    section.missing.append(f"Not available: the {anchor} figures because building them failed ({why}).")
    return section


# --------------------------------------------------------------------------- page


_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, Segoe UI, sans-serif; margin: 0 auto; max-width: 1180px; padding: 0 18px 48px; color: #222; }
h1 { font-size: 1.5em; margin: 20px 0 4px; } h2 { font-size: 1.2em; margin-top: 34px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
nav a { margin-right: 14px; } .meta { color: #555; font-size: 0.9em; }
figure { margin: 14px 0 22px; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.88em; color: #444; max-width: 980px; }
table { border-collapse: collapse; font-size: 0.85em; } th, td { border-bottom: 1px solid #e4e4e4; padding: 3px 9px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.missing, .note { background: #fff6e5; border-left: 4px solid #e0a030; padding: 6px 10px; font-size: 0.9em; }
.controls { display: flex; align-items: center; gap: 12px; margin-bottom: 6px; }
#step-slider { flex: 1; max-width: 640px; } #step-label { font-variant-numeric: tabular-nums; min-width: 15em; }
pre#selftest { display: none; }
"""

# Plain inline script (no modules, no network): the slider, a play button, and a self-test
# that runs only when the page is opened with #selftest (the browser test reads its verdict).
_JS = r"""
(function () {
  "use strict";
  var data = document.getElementById("frames-data");
  var frames = data ? JSON.parse(data.textContent) : [];
  var slider = document.getElementById("step-slider");
  var img = document.getElementById("frame");
  var label = document.getElementById("step-label");
  var play = document.getElementById("play");
  var timer = null;
  function show(i) {
    var f = frames[i];
    if (!f) { return; }
    img.src = f.src;
    label.textContent = f.label;
    if (f.alt) { img.alt = f.alt; }  // the shown step's roles, which its panel titles draw
    slider.setAttribute("aria-valuetext", f.label);  // "step 500 (snapshot 17 of 17)", not "16"
  }
  if (slider && img && label) {
    slider.addEventListener("input", function () { show(parseInt(slider.value, 10)); });
    // Warm the browser cache so scrubbing does not flicker.
    frames.forEach(function (f) { var pre = new Image(); pre.src = f.src; });
  }
  if (play && slider) {
    play.addEventListener("click", function () {
      if (timer) { clearInterval(timer); timer = null; play.textContent = "Play"; return; }
      play.textContent = "Pause";
      timer = setInterval(function () {
        var next = (parseInt(slider.value, 10) + 1) % frames.length;
        slider.value = String(next);
        show(next);
        if (next === frames.length - 1) { clearInterval(timer); timer = null; play.textContent = "Play"; }
      }, 400);
    });
  }
  window.reportFrames = frames;
})();
"""

_SELFTEST_JS = r"""
(function () {
  "use strict";
  if (location.hash !== "#selftest") { return; }
  function loadImage(src) {
    return new Promise(function (resolve) {
      var im = new Image();
      im.onload = function () { resolve({src: src, ok: im.naturalWidth > 0}); };
      im.onerror = function () { resolve({src: src, ok: false}); };
      im.src = src;
    });
  }
  function settle(im) {
    return new Promise(function (resolve) {
      if (im.complete) { resolve(); return; }
      im.addEventListener("load", function () { resolve(); });
      im.addEventListener("error", function () { resolve(); });
    });
  }
  function run() {
    var verdict = {errors: window.reportErrors.slice(), images: {}, frames: {}, slider: {}};
    var imgs = Array.prototype.slice.call(document.images);
    var broken = imgs.filter(function (im) { return !(im.complete && im.naturalWidth > 0); })
                     .map(function (im) { return im.getAttribute("src"); });
    verdict.images = {total: imgs.length, broken: broken};
    var frames = window.reportFrames || [];
    Promise.all(frames.map(function (f) { return loadImage(f.src); })).then(function (results) {
      verdict.frames = {total: frames.length,
                        broken: results.filter(function (r) { return !r.ok; }).map(function (r) { return r.src; })};
      var slider = document.getElementById("step-slider");
      var img = document.getElementById("frame");
      var label = document.getElementById("step-label");
      if (!slider || !img || !label || frames.length < 2) {
        verdict.slider = {present: !!slider, changed: false, reason: "no slider or fewer than 2 snapshots"};
        return verdict;
      }
      var before = {src: img.getAttribute("src"), label: label.textContent, value: slider.value, alt: img.alt};
      slider.value = slider.max;
      slider.dispatchEvent(new Event("input", {bubbles: true}));
      var after = {src: img.getAttribute("src"), label: label.textContent, value: slider.value,
                   spoken: slider.getAttribute("aria-valuetext"), alt: img.alt};
      return settle(img).then(function () {
        after.loaded = img.naturalWidth > 0;
        verdict.slider = {present: true, before: before, after: after,
                          changed: before.src !== after.src && before.label !== after.label && after.loaded};
        return verdict;
      });
    }).then(function (v) {
      v.errors = window.reportErrors.slice();
      v.ok = v.errors.length === 0 && v.images.broken.length === 0 && v.frames.broken.length === 0 && v.slider.changed === true;
      document.getElementById("selftest").textContent = JSON.stringify(v);
      document.title = "selftest " + (v.ok ? "pass" : "fail");
    }).catch(function (e) {
      document.getElementById("selftest").textContent = JSON.stringify({ok: false, errors: ["self-test crashed: " + e]});
    });
  }
  if (document.readyState === "complete") { run(); } else { window.addEventListener("load", run); }
})();
"""

# Installed first, in <head>, so errors of every later script are caught for the self-test.
_ERRORS_JS = r"""
window.reportErrors = [];
window.addEventListener("error", function (e) {
  if (e.target && e.target !== window && e.target.tagName) { return; }  // resource errors: the image checks report those
  window.reportErrors.push("error: " + e.message + " at " + e.filename + ":" + e.lineno);
}, true);
window.addEventListener("unhandledrejection", function (e) { window.reportErrors.push("unhandled rejection: " + e.reason); });
(function () {
  var original = console.error;
  console.error = function () {
    window.reportErrors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
})();
"""


def _runs_table(runs: list[_Run], axes: list[str], chosen: str | None) -> str:
    """One row per run, recorded or pending (status "pending": in the sweep index, not started)."""
    head = "".join(f"<th>{html.escape(_short(a))}</th>" for a in axes)
    rows = []
    for r in runs:
        # a setting a recorded run lacks is an [intervene] section it has none of; a pending run has no settings
        values = [r.params[a] if a in r.params else r.settings.get(a, "none") if r.settings else "" for a in axes]
        cells = "".join(f"<td>{html.escape(setting_cell(v))}</td>" for v in values)  # as `dynamics status` shows them
        # as `dynamics status` says it: "-" is a loss not written yet, not a NaN one
        loss = f"{r.last_loss:.4f}" if r.last_loss is not None else "not finite" if r.status == "diverged" else "-"
        mark = " (shown)" if r.run_id == chosen else ""
        # "-": none read (pending, or a run that could not be read, whose placeholder said 0/0)
        snaps = "-" if r.status == "pending" or not r.n_snapshots else f"{r.n_recorded}/{r.n_snapshots}"
        rows.append(f"<tr><td><code>{html.escape(r.run_id)}</code>{mark}</td>{cells}<td>{html.escape(r.status)}</td>"
                    f"<td class=num>{snaps}</td><td class=num>{loss}</td>"
                    f"<td>{_prose('; '.join(filter(None, (r.analysis_note, text(r.caveats)))))}</td></tr>")
    return (f"<table><thead><tr><th>run</th>{head}<th>status</th><th>snapshots recorded</th>"
            f"<th>last training loss (nats)</th><th>analysis</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _page(path, runs, chosen, axes, sections: list[_Section], compute_missing: bool,
          pending: list[_Run] | None = None, swept: set[str] | None = None, href: str = "",
          index: dict | None = None, notes: list[str] | None = None) -> str:
    title = f"dynamics report: {shown(Path(os.fspath(path)).name)}"
    when = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    pending = pending or []
    counts: dict[str, int] = {}
    for r in [*runs, *pending]:
        counts[r.status] = counts.get(r.status, 0) + 1
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no runs"
    if pending:  # a sweep with runs still to start must not look complete
        # Counted over the sweep index: a run trained into the store by `dynamics run` is not one of its runs.
        started = sum(r.run_id in swept for r in runs) if swept is not None else len(runs)
        status = f"{status} ({started} of {started + len(pending)} runs of the sweep index started)"
    policy = ("Runs without stored analysis are analysed here, in memory, on the snapshots recorded so far "
              "(nothing is written to the store)." if compute_missing else
              "Runs without stored analysis are left out of the analysis figures (--no-compute).")
    nav = " ".join(f'<a href="#{s.anchor}">{html.escape(s.title.split(":")[0])}</a>' for s in sections)
    body = []
    for s in sections:
        parts = [f'<section id="{s.anchor}"><h2>{html.escape(s.title)}</h2>', s.html]
        for rel, caption in s.figures:
            parts.append(f'<figure><img src="{html.escape(href + rel)}" alt="{html.escape(_alt(caption))}">'
                         f"<figcaption>{_prose(caption)}</figcaption></figure>")
        parts.extend(f'<p class="missing">{_prose(m)}</p>' for m in s.missing)
        parts.append("</section>")
        body.append("\n".join(parts))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<script>{_ERRORS_JS}</script>
<style>{_CSS}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="meta">Store <code>{html.escape(shown(os.fspath(path)))}</code> · {html.escape(status)} · written {when}.
Per-run figures show run <code>{html.escape(str(chosen))}</code>{html.escape(chosen_why(runs, chosen))}. {_prose(policy)}</p>
{"".join(f'<p class="note">Note: {_prose(n[0].upper() + n[1:])}.</p>' for n in notes or [])}
<nav>{nav}</nav>
<h2>Runs</h2>
{_runs_table(sorted([*runs, *pending], key=lambda r: grid_key(index or {})(r.run_id)), axes, chosen)}
{"".join(body)}
<pre id="selftest">pending</pre>
<script>{_JS}</script>
<script>{_SELFTEST_JS}</script>
</body>
</html>
"""
