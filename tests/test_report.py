"""The report page as a whole: every figure and caption on the shared store, the missing parts
of a partial store, the CLI, and how write_report treats its output folder."""

from __future__ import annotations

import ast
import html
import json
import os
import re
from pathlib import Path

import pytest
from PIL import Image

from dynamics import cli, store
from dynamics.report import write_report
from tests._report_store import _frames, _predict_curve, _synthetic_store, _unwritten_run

ROOT = Path(__file__).resolve().parents[1]


def _srcs(text: str) -> list[str]:
    return [html.unescape(s) for s in re.findall(r'<img[^>]*\ssrc="([^"]+)"', text)]


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


def test_a_vocabulary_without_the_token_is_said_where_the_report_shows_roles(built):
    # TINY's vocabulary of 16 has no '/' (47): `dynamics analyse` says no head can be a token head;
    # the report showed no token panel and "token" in no title, which read as a finding
    from dynamics.analysis.pipeline import summary_row

    path, page, ids = built
    assert summary_row(store.open_analysis(path, ids["A"]))["token_unseen"] == 47  # the analyse table's footnote
    captions = [html.unescape(c) for c in re.findall(r"<figcaption>(.+?)</figcaption>", page.read_text(), re.S)]
    roles = next(c for c in captions if c.startswith("Fraction of heads holding each role"))
    # A stored, B and C analysed here: each run's own token_share, all NaN
    assert ("Token roles: token 47 is in no probe sequence of any of these 3 runs, so none of their heads "
            "can be measured as a token head (a vocabulary without it, or too few probes: record.n_probe)") in roles
    chosen = ("Token 47 is in none of this run's probe sequences, so none of its heads can be measured as a token "
              "head (a vocabulary without it, or too few probes: record.n_probe)")
    attention = next(c for c in captions if c.startswith("Attention of every head"))
    redundancy = next(c for c in captions if c.startswith("Run "))
    assert chosen in attention and chosen in redundancy  # their labels name each head's role
    assert not any("Token" in c for c in captions if c not in (roles, attention, redundancy))


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
    assert "<td>no stored analysis (run <code>dynamics analyse</code>)</td>" in plain
    assert ("<td>no stored analysis (<code>dynamics analyse</code> analyses it once it has finished; without "
            "--no-compute the report analyses what it has recorded)</td>") in plain
    # and what is missing, for each
    assert f"{b} (completed: no stored analysis (run <code>dynamics analyse</code>))" in plain
    assert f"{c} (stopped: no stored analysis (<code>dynamics analyse</code> analyses it" in plain
    # a page shows commands as code, never the terminal's backticks (alt text has no markup: plain)
    assert "`" not in re.sub(r'alt="[^"]*"', "", re.sub(r"<script>.*?</script>", "", text, flags=re.S))
    assert "<figcaption>" in text and all("`" not in alt for alt in re.findall(r'alt="([^"]*)"', text))
    assert f"Not available: the dendrogram and JS matrix of run {ids['C']}" in text
    for src in _srcs(text) + [f["src"] for f in frames]:
        assert _png_ok(out / src), src

    assert cli.main(["report", str(path), "--out", str(tmp_path / "x"), "--run", "nope"]) == cli.EXIT_BAD_INPUT
    assert cli.main(["report", str(tmp_path), "--out", str(tmp_path / "x")]) == cli.EXIT_BAD_INPUT


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
                   "Not available: bifurcation and emergence steps against a swept parameter because the store "
                   "has no sweep index",
                   "Not available: the dendrogram and JS matrix of run r0 because the run has only 0 snapshot(s) recorded",
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
    # and in any sentence that names it: the sections' "Not available" lines name their command
    assert f"<code>dynamics gates {html.escape(str(tmp_path))}/s\ufffd.zarr --run ID</code>" in text


@pytest.mark.parametrize("locale", [
    {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},  # an ASCII filesystem encoding
    {"PYTHONUTF8": "1"},
])
def test_the_page_is_utf8_whatever_the_filesystem_encoding(tmp_path, locale):
    # The whole page went through the filesystem encoding to mend undecodable path bytes: under an
    # ASCII one every report failed ("'ascii' codec can't encode character '\xb7'"), and a
    # Latin-1 one garbled the page's "·" and failed on a path outside Latin-1.
    import subprocess
    import sys

    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"model.init_scale": 1.0, "train.seed": 0}})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONUTF8", "PYTHONIOENCODING"))}
    r = subprocess.run([sys.executable, "-m", "dynamics", "report", str(path), "--out", str(tmp_path / "rep"),
                        "--no-compute"], capture_output=True, text=True, env=env | locale, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "rep" / "index.html").read_bytes().decode("utf-8")  # strict: UTF-8 throughout
    assert f"Store <code>{html.escape(str(path))}</code> · " in text


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


# --------------------------------------------------------------------------- the output folder


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
    assert err == (f"dynamics: error: --out {out}: another dynamics report is being written into it; wait for it to "
                   "finish, or choose another folder\n")
    assert not any(out.iterdir())
    # the demo too, before its sweep: it trained, analysed and predicted, then was refused
    demo = tmp_path / "demo.zarr"
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert cli.main(["demo", "--out", str(demo), "--report", str(out)]) == cli.EXIT_BAD_INPUT
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert err == (f"dynamics: error: --report {out}: another dynamics report is being written into it; wait for it "
                   "to finish, or choose another folder\n")
    assert not demo.exists()


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


@pytest.mark.parametrize("code", ["ENOSPC", "EFBIG", "EDQUOT", "EROFS"])
def test_a_full_disk_in_a_section_stops_the_report_and_keeps_the_previous_one(tmp_path, monkeypatch, code):
    # savefig's "No space left on device" became a "Not available" line like any section's error:
    # the report replaced a whole one with a near-empty page and exited 0, "report written".
    import errno

    from dynamics.report import page as page_module

    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_derived(path, "predict.slash", _predict_curve())
    out = tmp_path / "out"
    before = write_report(path, out).read_text()

    def full(ctx):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(page_module, "_emergence_section", full)
    with pytest.raises(OSError) as raised:
        write_report(path, out)
    assert raised.value.errno == getattr(errno, code)
    assert (out / "index.html").read_text() == before and _png_ok(out / _srcs(before)[0])
    # other errors of a section are still its own "Not available" line, the rest of the page written
    def _emergence_section(ctx):  # named as the section it stands in for, which the line names
        return open(tmp_path / "gone" / "x")

    monkeypatch.setattr(page_module, "_emergence_section", _emergence_section)
    page = write_report(path, out).read_text()
    assert "Not available: the emergence figures because building them failed (FileNotFoundError: " in page


def test_earlier_figures_that_cannot_be_removed_are_a_note_once_the_new_page_is_written(tmp_path, monkeypatch):
    # A colleague's read-only figure folder: the page was already replaced, whole, when deleting the
    # old folder failed, and the command said "report stopped: Permission denied ... run it again", exit 1.
    import errno

    from dynamics.report import page as page_module

    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_derived(path, "predict.slash", _predict_curve())
    out = tmp_path / "out"
    before = _srcs(write_report(path, out).read_text())
    old = out / before[0]

    def refused(folder):
        raise PermissionError(errno.EACCES, "Permission denied", str(old))

    monkeypatch.setattr(page_module, "_delete_generation", refused)
    notes = []
    after = _srcs(write_report(path, out, on_note=notes.append).read_text())
    assert after != before and _png_ok(out / after[0]) and old.is_file()
    assert notes == [f"the report is written, but the earlier report's figures could not all be removed (Permission "
                     f"denied on {old}); the next report tries again"]
    with pytest.warns(RuntimeWarning, match="could not all be removed"):  # not a line on stdout
        write_report(path, out)
    monkeypatch.undo()
    write_report(path, out)  # and the next one does
    assert not old.exists()


def test_an_interrupt_after_the_page_is_switched_keeps_the_new_figures(tmp_path, monkeypatch):
    # The flush after the switch sat in the clean-up's try: Ctrl-C (or SIGTERM, now an interrupt)
    # there deleted the figures the new page linked to.
    from dynamics.report import page as page_module

    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_derived(path, "predict.slash", _predict_curve())
    out = tmp_path / "out"
    write_report(path, out)
    real = page_module._fsync

    def interrupted(p):
        if Path(p) == out:
            raise KeyboardInterrupt
        return real(p)

    monkeypatch.setattr(page_module, "_fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_report(path, out)
    linked = _srcs((out / "index.html").read_text())
    assert linked and all(_png_ok(out / rel) for rel in linked)


def test_a_figure_subfolder_that_cannot_be_removed_keeps_its_marker_for_the_next_report(tmp_path, monkeypatch):
    # rmtree(ignore_errors) of the old attention/ folder, then the marker: the rest stayed, with no
    # marker, so no later report took it, and the note promising that the next one would never came
    import shutil

    from dynamics.report import page as page_module

    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_derived(path, "predict.slash", _predict_curve())
    out = tmp_path / "out"
    old = out / _srcs(write_report(path, out).read_text())[0]
    (old.parent / "attention").mkdir(exist_ok=True)
    (old.parent / "attention" / "snapshot_0000.png").write_bytes(b"png")
    real = shutil.rmtree

    def refused(p, *a, **k):
        if Path(p).name == "attention" and not k.get("ignore_errors"):
            raise PermissionError(13, "Permission denied", str(p))
        return real(p, *a, **k)

    monkeypatch.setattr(page_module.shutil, "rmtree", refused)
    notes = []
    write_report(path, out, on_note=notes.append)
    assert len(notes) == 1 and "could not all be removed (Permission denied on " in notes[0]
    assert (old.parent / page_module._MARK).is_file()  # still the report's own, for the next one
    monkeypatch.undo()
    write_report(path, out)
    assert not old.parent.exists()


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
