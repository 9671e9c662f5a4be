"""Reading the runs for the report: their status, an analysis stored or computed here, damaged
recordings and analyses, and the swept values and settings the runs table shows."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from dynamics import cli, store
from dynamics.report import _choose_run, _Run, write_report
from tests._report_store import TINY, _flip, _synthetic_store, _unwritten_run, _written_run


def test_partial_store_runs_are_analysed_in_memory_and_said_so(built):
    path, page, ids = built
    text = page.read_text()
    row = {k: re.search(rf"<tr><td><code>{ids[k]}</code>.*?</tr>", text).group(0) for k in ids}
    assert ">pending<" in row["P"] and "not started yet" in row["P"]  # in the sweep index, never started
    assert "2 completed, 1 pending, 1 stopped (3 of 4 runs of the sweep index started)" in text
    assert "stored by <code>dynamics analyse</code>" in html.unescape(row["A"])  # the terminal's `quotes` as code
    assert "computed for this report (not stored)" in row["B"]
    # "running" in its attrs, but nobody holds its training lock: killed, shown as `dynamics status` does.
    assert store.run_attrs(path, ids["C"])["status"] == "running"
    assert ">stopped<" in row["C"] and ">running<" not in row["C"]
    assert "computed for this report on 6 of 9 snapshots" in row["C"]
    assert "6/9" in row["C"]
    assert store.open_analysis(path, ids["B"]) is None  # the report never writes to the store
    assert "derived/gates." in text and "recorded during training (chg)" in text


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


def test_an_unfinished_run_missing_a_chunk_before_its_checkpoint_is_damaged_not_drawn_as_nan(built, tmp_path):
    # Only finished runs were checked: a stopped run's lost attention chunk read as NaN, its
    # snapshot drawn as an all-grey frame and analysed here as every head "none" (a spike to 1 in
    # the role shares), while the runs table said "computed for this report on 6 of 9 snapshots".
    path, _, ids = built
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    attrs = store.run_attrs(copy, ids["C"])
    assert attrs["status"] == "running" and attrs["checkpoint_step"] == 16  # snapshots 0, 1, 2, 4, 8, 16 written
    (copy / "runs" / ids["C"] / "attention" / "c" / "4").rename(tmp_path / "lost")  # snapshot 4: step 8
    damaged: dict[str, str] = {}
    text = html.unescape(write_report(copy, tmp_path / "out", run_id=ids["C"], on_damaged=damaged.__setitem__).read_text())
    assert list(damaged) == [ids["C"]]
    assert f"run {ids['C']}: array attention at snapshot 4 (step 8): its chunk runs/{ids['C']}/attention/c/4/" in damaged[ids["C"]]
    row = re.search(rf"<tr><td><code>{ids['C']}</code>.*?</tr>", text).group(0)
    assert "<td>damaged</td>" in row and "computed for this report" not in row
    assert "<td>damaged</td><td class=num>-</td>" in row  # nothing read: not 0/0, "0 of 0 snapshots recorded"
    assert f"Not available: attention maps because run {ids['C']} (damaged) could not be read (StoreError: " in text
    # what was written after the checkpoint is not expected: the same run whole is no damage
    (tmp_path / "lost").rename(copy / "runs" / ids["C"] / "attention" / "c" / "4")
    damaged.clear()
    text = html.unescape(write_report(copy, tmp_path / "out", run_id=ids["C"], on_damaged=damaged.__setitem__).read_text())
    assert not damaged and "computed for this report on 6 of 9 snapshots" in text


def test_a_snapshot_half_written_past_the_last_checkpoint_is_not_counted(built, tmp_path):
    # A snapshot's arrays are written side by side, before the checkpoint: a run stopped (or read)
    # part way through has its importance and not its attention. Counted as recorded (from its
    # importance), it made analyse_run refuse the whole run: the run had no analysis, and the
    # attention and redundancy sections of the run shown were "Not available", exit 0.
    path, _, ids = built
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    run = ids["C"]
    assert store.run_attrs(copy, run)["checkpoint_step"] == 16  # snapshots 0, 1, 2, 4, 8, 16 written
    store.update_run_attrs(copy, run, checkpoint_step=8)  # stopped between snapshot 16's arrays and its checkpoint
    shutil.rmtree(copy / "runs" / run / "attention" / "c" / "5")  # step 16's attention not written yet
    damaged: dict[str, str] = {}
    text = html.unescape(write_report(copy, tmp_path / "out", run_id=run, on_damaged=damaged.__setitem__).read_text())
    assert not damaged and "failed" not in text
    row = re.search(rf"<tr><td><code>{run}</code>.*?</tr>", text).group(0)
    assert "computed for this report on 5 of 9 snapshots" in row and "5/9" in row


def test_the_page_says_why_its_per_run_figures_show_the_run_they_show():
    from dynamics.report.data import chosen_why

    def run(rid, status, loss):
        return _Run(rid, status, {}, loss, 9, np.ones(9, bool), np.arange(9))

    three = [run("a", "completed", 2.0), run("b", "completed", 1.0), run("c", "completed", 3.0)]
    assert chosen_why(three, "a") == " (of the 3 completed run(s), the one with the median final loss; --run ID shows another)"
    assert chosen_why(three[:2], "b") == (" (of the 2 completed run(s), the one with the median final loss, the lower "
                                          "for an even count; --run ID shows another)")
    assert chosen_why(three, "c") == " (chosen with --run)"
    stopped = [run("d", "stopped", None)]
    assert chosen_why(stopped, "d") == (" (no completed run has a finite final loss: the run with the most "
                                        "snapshots recorded)")
    # a run diverged at step 0 wrote a snapshot 0 of NaN: none recorded before it diverged, which
    # "only 0 snapshot(s) recorded" did not say
    from dynamics.report.data import _recorded, _to_analyse

    early = _Run("e", "diverged", {}, 3.47, 1, np.zeros(1, bool), np.arange(1))
    assert _recorded(early) == "0 snapshot(s) recorded before it diverged"
    assert _recorded(run("d", "stopped", None)) == "9 snapshot(s) recorded"
    assert _to_analyse(early).startswith("`dynamics analyse` cannot analyse it: only 0 snapshot(s) recorded before it "
                                         "diverged, and an analysis needs 4")
    # the median is over the analysed runs where any is, as _choose_run takes it: an unanalysed
    # run of loss 0.5 made the sentence count 4 runs and describe another one
    for r in three:
        r.analysis = xr.Dataset()
    four = [*three, run("e", "completed", 0.5)]
    assert chosen_why(four, "a") == (" (of the 3 analysed completed run(s), the one with the median final loss; "
                                     "--run ID shows another)")


def test_choose_run_prefers_the_median_completed_run():
    def run(rid, status, loss, n):
        return _Run(rid, status, {}, loss, 9, np.arange(9) < n, np.arange(9))

    runs = [run("a", "completed", 2.0, 9), run("b", "completed", 1.0, 9), run("c", "completed", 3.0, 9),
            run("d", "running", 0.1, 4)]
    assert _choose_run(runs) == "a"
    assert _choose_run([run("d", "running", None, 4), run("e", "failed", None, 7)]) == "e"
    assert _choose_run([]) is None
    # of the completed runs, those with an analysis: a run too short to analyse was shown by
    # default, with no roles or redundancy figure, beside runs that had them
    analysed = xr.Dataset(attrs={"analysis_version": 1})
    short = [run("s1", "completed", 1.0, 3), run("s2", "completed", 1.5, 3), run("x", "completed", 2.5, 9)]
    short[2].analysis = analysed
    assert _choose_run(short) == "x"
    assert _choose_run(short[:2]) == "s1"  # none analysed: the median of all, as before


def test_the_runs_table_says_a_diverged_runs_loss_is_not_finite_and_attention_says_no_snapshot_ever():
    # As `dynamics status` says it: "-" reads as a loss not written yet (still training, killed).
    from dynamics.report.page import _runs_table

    runs = [_Run("nan", "diverged", {}, None, 9, np.arange(9) < 2, np.arange(9)),
            _Run("live", "running", {}, None, 9, np.arange(9) < 2, np.arange(9))]
    cells = {r.run_id: re.search(rf"<code>{r.run_id}</code>.*?</tr>", _runs_table(runs, [], None)).group(0)
             for r in runs}
    assert "<td class=num>not finite</td>" in cells["nan"] and "<td class=num>-</td>" in cells["live"]
    # a run that diverged at step 0 will never record a snapshot: "yet" said it might
    from dynamics.report.attention import _attention_section
    from dynamics.report.data import _Ctx

    for status, end in (("diverged", "has no recorded snapshot."), ("running", "has no recorded snapshot yet.")):
        run = _Run("r0", status, {}, None, 9, np.zeros(9, bool), np.arange(9))
        sec = _attention_section(_Ctx(Path("unused.zarr"), [run], "r0", [], Path("unused"), True))
        assert sec.missing == [f"Not available: attention maps because run r0 ({status}) {end}"]


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
        assert re.search(f"<code>{r.run_id}</code>(?: \\(shown\\))?</td><td>1.0</td><td>{r.params['train.seed']}</td><td>{lr}</td>",
                         table)


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
    assert "stored by <code>dynamics analyse</code>" not in row
    # a chunk of it failing its checksum is no damage: it is set aside unread, as it would be whole
    chunk = next(p for p in sorted((copy / "analysis" / ids["A"] / "role" / "c").rglob("*")) if p.is_file())
    chunk.write_bytes(bytes(b ^ 0x08 if i == len(chunk.read_bytes()) // 2 else b
                            for i, b in enumerate(chunk.read_bytes())))
    text = html.unescape(write_report(copy, tmp_path / "out3", compute_missing=False).read_text())
    row = re.search(rf"<tr><td><code>{ids['A']}</code>.*?</tr>", text).group(0)
    assert "stored analysis is from an older version of the analysers" in row and "could not be read" not in text
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
    said = ("its stored analysis could not be read (a chunk failed its checksum; <code>dynamics analyse</code> writes "
            "it again)")
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


def test_a_run_analysed_here_whose_recordings_fail_their_checksum_is_named_and_exits_1(built, tmp_path, capsys):
    # With no stored analysis the report analyses the run itself: a recording failing its checksum
    # there put zarr's error in the run's row ("ValueError: Stored and computed checksum do not
    # match. Stored: b'...'"), left the run out of the figures and exited 0 saying nothing.
    path, _, ids = built
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    shutil.rmtree(copy / "analysis" / ids["A"])
    chunk = _flip(copy / "runs" / ids["A"] / "attention" / "c")
    assert cli.main(["report", str(copy), "--out", str(tmp_path / "out"), "--run", ids["B"]]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[report]")]
    snapshot = chunk.relative_to(copy / "runs" / ids["A"] / "attention" / "c").parts[0]
    assert len(err) == 1 and err[0].startswith(f"dynamics: {copy}: run {ids['A']}: array attention at snapshot {snapshot} (step ")
    assert "(damaged: its CRC32C checksum does not match" in err[0]
    text = html.unescape((tmp_path / "out" / "index.html").read_text())
    row = re.search(rf"<tr><td><code>{ids['A']}</code>.*?</tr>", text).group(0)
    assert f"analysing it here failed: {err[0].removeprefix('dynamics: ')}" in row
    assert "Stored and computed checksum" not in text


def test_damaged_stored_data_of_readable_runs_is_named_on_stderr_and_exits_1(built, tmp_path, capsys):
    # A stored analysis, the chosen run's recordings or a predictor curve failing its checksum was
    # named on the page only: the command printed "report written" and exited 0, as for a sound store.
    path, _, ids = built
    assert cli.main(["report", str(path), "--out", str(tmp_path / "ok"), "--run", ids["A"]]) == 0
    assert "dynamics:" not in capsys.readouterr().err
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    _flip(copy / "analysis" / ids["A"] / "role" / "c")
    _flip(copy / "runs" / ids["A"] / "attention" / "c")
    curve = next(p for p in sorted((copy / "derived").glob("predict*")))
    _flip(curve / "score" / "c")
    assert cli.main(["report", str(copy), "--out", str(tmp_path / "out"), "--run", ids["A"]]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[report]")]
    assert err[0] == (f"dynamics: run {ids['A']}: its stored analysis could not be read (a chunk failed its checksum; "
                      "`dynamics analyse` writes it again)")
    assert err[1].startswith(f"dynamics: {copy}: run {ids['A']}: array attention at snapshot ")
    assert err[2] == f"dynamics: derived/{curve.name}: a chunk failed its checksum"
    assert len(err) == 3  # no run is listed as damaged: each is readable, its row shown
    text = html.unescape((tmp_path / "out" / "index.html").read_text())
    assert "<td>damaged</td>" not in text


def _section_as_a_file(built, tmp_path, section: str):
    """A copy of the built store whose `section` folder is a file holding "x"."""
    copy = tmp_path / "store.zarr"
    shutil.copytree(built[0], copy)
    shutil.rmtree(copy / section)
    (copy / section).write_text("x")
    return copy


def test_a_derived_that_is_a_file_is_named_not_read_as_no_predictor_run_yet(built, tmp_path, capsys):
    # The page said "the store has no derived predict.<target> dataset (run the predictor ... first)",
    # exit 0, and `dynamics predict` then refused the store as damaged.
    copy = _section_as_a_file(built, tmp_path, "derived")
    assert cli.main(["report", str(copy), "--out", str(tmp_path / "out")]) == 1
    why = f"{copy}: derived is not a folder (the store is damaged); move it aside"
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[report]")]
    assert len(err) == 1 and err[0].startswith(f"dynamics: {why}")
    text = html.unescape((tmp_path / "out" / "index.html").read_text())
    assert f"Not available: the predictor curves because derived/ could not be read ({why}" in text
    assert "dynamics predict" not in text
    assert (copy / "derived").read_text() == "x"


def test_an_analysis_that_is_a_file_is_named_not_read_as_never_analysed(built, tmp_path, capsys):
    # The page listed every run as "no stored analysis (run dynamics analyse)", exit 0, and
    # `dynamics analyse` then refused the store: analysis is not a folder.
    copy = _section_as_a_file(built, tmp_path, "analysis")
    assert cli.main(["report", str(copy), "--out", str(tmp_path / "out"), "--no-compute"]) == 1
    why = f"{copy}: analysis is not a folder (the store is damaged); move it aside"
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[report]")]
    assert err and all(why in line and "`dynamics analyse` writes it again" not in line for line in err), err
    assert (copy / "analysis").read_text() == "x"
    with pytest.raises(store.StoreError, match="analysis is not a folder"):
        store.open_analysis(str(copy), store.list_runs(str(copy))[0])


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
    # (the synthetic r0's attention is the same at every snapshot: its note comes first)
    assert "runs/r1/zarr.json cannot be read (damaged)" in [line for line in err if "note:" not in line
                                                             and not line.startswith("[report]")][0]
    text = (tmp_path / "out" / "index.html").read_text()
    assert re.search(r"<code>r1</code></td><td>2.0</td><td>0</td><td>damaged</td>", text)  # not the run shown
    assert "<code>r0</code> (shown)" in text


def test_a_run_that_ends_while_the_report_reads_it_shows_the_loss_it_ended_with(built):
    # The report read a run's attrs once; run_status then read the status the run had ended with
    # since, and the row said "completed" beside last loss "-" from the attrs read while it ran.
    from dynamics.report.data import _collect_run

    path, _, ids = built
    attrs = store.run_attrs(path, ids["A"])
    assert attrs["status"] == "completed" and attrs["last_loss"] is not None
    while_running = {k: v for k, v in attrs.items() if k != "last_loss"} | {"status": "running"}
    run = _collect_run(path, ids["A"], None, False, while_running)  # nobody holds its lock: it has ended
    assert run.status == "completed"
    assert run.last_loss == attrs["last_loss"]


def test_an_unfinished_runs_last_loss_is_the_one_status_gives_the_last_its_store_records(built, tmp_path):
    # The report read the attrs' last_loss, its session's last (past the checkpoint: 1.3175 at an
    # unrecorded step, status 1.2990), or after a kill an earlier session's or none ("-", status 0.8556).
    import shutil

    from dynamics.report.data import _collect_run
    from dynamics.status import status_table

    src, _, ids = built
    path = tmp_path / "s.zarr"
    shutil.copytree(src, path)
    run_id = ids["A"]
    losses = store.open_run(path, run_id)["loss"].values
    at = store.checkpoint_step(path, run_id)
    for status, attr in (("interrupted", 123.0), ("running", None)):  # "running", no lock held: killed
        store.update_run_attrs(path, run_id, status=status, last_loss=attr)
        run = _collect_run(path, run_id, None, False, store.run_attrs(path, run_id))
        header, rows, _ = status_table(str(path))
        row = dict(zip(header, next(r for r in rows if r[0] == run_id), strict=True))
        assert f"{run.last_loss:.4f}" == row["last_loss"] == f"{losses[at - 1]:.4f}", (status, run.last_loss, row)


def test_a_finished_run_too_short_to_analyse_is_said_so_not_sent_to_dynamics_analyse(tmp_path):
    # `dynamics analyse` refuses a run of 3 snapshots; the report told its reader to run it
    import json as _json

    from dynamics.config import from_dict
    from dynamics.train import train_run
    from tests._report_store import TINY as RAW

    raw = _json.loads(_json.dumps(RAW))
    raw["train"].update(steps=2, warmup_steps=1)
    path = tmp_path / "s.zarr"
    rid = train_run(from_dict(raw), str(path)).run_id
    text = html.unescape(write_report(path, tmp_path / "out", compute_missing=False).read_text())
    text = re.sub(r"<[^>]+>", "", text)  # `quotes` are <code> on the page
    assert f"{rid} (shown)completed3/3" in text
    assert ("no stored analysis (dynamics analyse cannot analyse it: only 3 snapshot(s) recorded, and an analysis "
            "needs 4)") in text
    assert "run dynamics analyse" not in text


def test_the_page_names_completed_runs_training_made_worse_or_never_moved(tmp_path, capsys):
    # Drawn like any run: lr 100 runs' heads in every figure, and no word that their loss had risen.
    import zarr

    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"train.seed": 0}, "r1": {"train.seed": 1}})  # ones: attention never moves
    evals = zarr.open_array(f"{path}/runs/r1/eval_loss", mode="r+")
    evals[-1] = 144.6
    moved = zarr.open_array(f"{path}/runs/r0/attention", mode="r+")
    moved[-1, 0, 0, 0, 1, 0] = 0.5  # query 1 now weighs key 0 half as much as key 1
    assert cli.main(["report", str(path), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    page = html.unescape((tmp_path / "out" / "index.html").read_text())
    rose = ("loss rose in 1 completed run(s): the eval loss at the last snapshot is above that at step 0, so training "
            "made them worse and their heads' figures are not those of a model that learned its task: r1 (1 -> 144.6 nats)")
    assert f"dynamics: note: {rose}" in err.splitlines() and f"Note: L{rose[1:]}." in page
    assert "Note: Attention unchanged in 1 completed run(s): every head's attention" in page
    assert re.search(r"<code>r1</code>.*eval loss rose over training \(1 -> 144\.6 nats\); attention unchanged from the "
                     r"first snapshot</td></tr>", page)
    assert not re.search(r"<code>r0</code>((?!</tr>).)*(rose|unchanged)", page)  # its row only


def test_a_run_of_one_probe_is_not_said_to_lack_the_resampled_bifurcation(tmp_path, capsys):
    # its analysis leaves bifurcation_resampled and role_resampled out on purpose (nothing to resample), and the
    # runs table said "stored by `dynamics analyse` (lacks bifurcation_resampled)", as of a damaged one
    import tomllib

    from dynamics.config import from_dict
    from dynamics.report.data import _collect_run
    from dynamics.train import train_run
    from tests.conftest import TINY as TINY_TOML

    path = str(tmp_path / "s.zarr")
    for n_probe in (1, 4):
        raw = tomllib.loads(TINY_TOML.format(steps=20, every=10))
        raw["record"]["n_probe"] = n_probe
        train_run(from_dict(raw), path)
    assert cli.main(["analyse", path, "--workers", "1"]) == 0
    capsys.readouterr()
    notes, read = {}, {}
    for rid in store.list_runs(path):
        attrs = store.run_attrs(path, rid)
        run = _collect_run(path, rid, None, False, attrs)
        notes[attrs["config"]["record"]["n_probe"]] = run.analysis_note
        read[attrs["config"]["record"]["n_probe"]] = {"bifurcation_resampled", "role_resampled"} & set(run.analysis)
    assert notes == {1: "stored by `dynamics analyse`", 4: "stored by `dynamics analyse`"}
    # the report reads both resampled variables of a run that has them (its captions name the heads)
    assert read == {1: set(), 4: {"bifurcation_resampled", "role_resampled"}}
