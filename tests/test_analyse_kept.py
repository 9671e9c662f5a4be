"""A second `dynamics analyse` keeps each analysis these analysers wrote from the recording its
run holds now, and gives the same rows; ``--again`` (``again=True``) analyses every run anew."""

import json
import shutil
from pathlib import Path

import pytest

from dynamics import cli, store
from dynamics.analyse import ANALYSED_FROM, analyse_store
from dynamics.config import load_config, with_values
from dynamics.schema import ANALYSIS_VERSION
from dynamics.tables import analysed_line
from dynamics.train import train_run


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """Three completed tiny runs and a diverged one, analysed once: (store, rows, run ids)."""
    from tests.conftest import TINY

    d = tmp_path_factory.mktemp("kept")
    (d / "tiny.toml").write_text(TINY.format(steps=30, every=10))
    base = load_config(d / "tiny.toml")
    path = str(d / "s.zarr")
    ids = []
    for seed in (0, 1, 2):
        cfg = with_values(base, {"train.seed": seed})
        assert train_run(cfg, path).status == "completed"
        ids.append(cfg.run_id())
    # SGD at lr 100 blows up a few steps in (as in test_analyse's diverged run)
    cfg = with_values(base, {"train.lr": 100.0, "train.grad_clip": 0.0, "train.optimizer": "sgd",
                             "train.warmup_steps": 20, "record.dense_until": 0, "record.every": 1})
    assert train_run(cfg, path).status == "diverged"
    ids.append(cfg.run_id())
    rows = analyse_store(path)
    assert not any(r.get("skipped") or r.get("kept") for r in rows)
    return path, rows, ids


def _written(path: str, run_id: str) -> tuple[int, int]:
    """The identity of a run's stored analysis metadata file: a rewrite makes a new file."""
    st = (Path(path) / "analysis" / run_id / "zarr.json").stat()
    return st.st_ino, st.st_mtime_ns


def _copy(analysed, tmp_path) -> str:
    copy = str(tmp_path / "s.zarr")
    shutil.copytree(analysed[0], copy)
    return copy


def _without_kept(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "kept"} for r in rows]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_second_analyse_keeps_every_analysis_and_gives_the_same_rows(analysed, tmp_path, workers):
    _, rows, ids = analysed
    copy = _copy(analysed, tmp_path)
    before = {r: _written(copy, r) for r in ids}
    again = analyse_store(copy, workers=workers)  # in a worker process too
    assert [r.get("kept") for r in again] == [True] * 4
    # the diverged run's note (diverged_step, read_at_step) and every figure, as first computed
    assert _without_kept(again) == rows
    assert {r["status"] for r in again} == {"completed", "diverged"}
    assert {r: _written(copy, r) for r in ids} == before  # not one analysis rewritten


def test_again_analyses_every_run_anew_to_the_same_rows(analysed, tmp_path):
    _, rows, ids = analysed
    copy = _copy(analysed, tmp_path)
    before = {r: _written(copy, r) for r in ids}
    assert analyse_store(copy, again=True) == rows  # no row kept
    assert all(_written(copy, r) != before[r] for r in ids)


def test_a_stale_or_changed_or_damaged_analysis_is_analysed_again(analysed, tmp_path):
    _, rows, ids = analysed
    copy = _copy(analysed, tmp_path)
    older, unmarked, retrained, damaged = ids

    def edit_attrs(run_id: str, change) -> None:
        meta = Path(copy) / "analysis" / run_id / "zarr.json"
        doc = json.loads(meta.read_text())
        change(doc["attributes"])
        meta.write_text(json.dumps(doc))

    edit_attrs(older, lambda a: a.update(analysis_version=ANALYSIS_VERSION - 1))  # other analysers wrote it
    edit_attrs(unmarked, lambda a: a.pop(ANALYSED_FROM))  # written before the mark was: which recording, unknown
    # trained again under the same id (its group moved out by hand): another recording, another wall time
    store.update_run_attrs(copy, retrained, wall_time=store.run_attrs(copy, retrained)["wall_time"] + 1.0)
    chunk = next(p for p in (Path(copy) / "analysis" / damaged / "role").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.unlink()  # a chunk file of the stored analysis lost
    again = analyse_store(copy)
    assert [r.get("kept") for r in again] == [None] * 4  # each analysed anew, none an error
    # the older analysers' figures are gone: the row names their version, the others' nothing
    assert again == [{**r, "replaced": str(ANALYSIS_VERSION - 1)} if r["run"] == older else r for r in rows]
    for rid in ids:
        stored = store.open_analysis(copy, rid)
        assert stored.attrs["analysis_version"] == ANALYSIS_VERSION
        assert stored.attrs[ANALYSED_FROM]["wall_time"] == store.run_attrs(copy, rid)["wall_time"]
    assert [r.get("kept") for r in analyse_store(copy)] == [True] * 4  # and kept from then on
    # written by other dynamics code (an edit, an upgrade) that left ANALYSIS_VERSION as it was
    edit_attrs(older, lambda a: a[ANALYSED_FROM].update(code_hash="0" * 64))
    assert [r.get("kept") for r in analyse_store(copy, [older, unmarked])] == [None, True]
    # computed with other versions of the libraries the analysers use (a store copied from elsewhere)
    edit_attrs(unmarked, lambda a: a[ANALYSED_FROM]["libraries"].update(numpy="0.0"))
    assert [r.get("kept") for r in analyse_store(copy, [older, unmarked])] == [True, None]


def test_a_stored_analysis_missing_a_variable_is_analysed_again(analysed, tmp_path):
    # A copy cut short can leave out a variable's folder, and a group without consolidated metadata
    # opens without it: one the table reads (role) failed every plain `analyse` (KeyError, exit 1),
    # one it does not (role_score) was kept, and cross-seed consistency then ended in a traceback.
    _, rows, ids = analysed
    copy = _copy(analysed, tmp_path)
    shutil.rmtree(Path(copy) / "analysis" / ids[0] / "role")
    shutil.rmtree(Path(copy) / "analysis" / ids[1] / "role_score")
    again = analyse_store(copy)
    assert again == [{**r, "kept": True} if r["run"] not in ids[:2] else r for r in rows]
    assert {"role", "role_score"} <= set(store.open_analysis(copy, ids[0]).data_vars)
    assert cli.main(["analyse", copy, "--workers", "1"]) == 0  # consistency too, from every run's analysis


def test_the_code_hash_is_taken_as_the_analysers_are_imported():
    # Taken first as `analyse` wrote its first analysis, it hashed files edited since the analysers
    # were imported, stamping the old code's results as the new code's, to be kept.
    import subprocess
    import sys

    code = ("import dynamics.analysis, dynamics.provenance as p; "
            "print(p.process_code_hash.cache_info().misses)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "1"


def test_the_command_says_which_runs_it_kept_and_again_redoes_them(analysed, tmp_path, capsys):
    _, rows, _ = analysed
    copy = _copy(analysed, tmp_path)
    capsys.readouterr()
    assert cli.main(["analyse", copy, "--workers", "1"]) == 0
    out = capsys.readouterr()
    assert f"[analyse] 1/4 {rows[0]['run']} kept (analysed before, by these analysers)" in out.err
    assert out.out.splitlines()[-1] == ("analysed no run: kept 4 analysed before by these analysers, from the "
                                        "recordings they hold now (`--again` analyses them again)")
    assert cli.main(["analyse", copy, "--workers", "1", "--again"]) == 0
    out = capsys.readouterr()
    assert "kept" not in out.err and out.out.splitlines()[-1].startswith("analysed 4 runs in ")


def test_the_closing_line_counts_runs_analysed_and_kept():
    fresh, kept, skipped = {"run": "a"}, {"run": "b", "kept": True}, {"run": "c", "skipped": True}
    assert analysed_line([fresh, fresh, kept], 1.25, "s.zarr") == (
        "analysed 2 runs in 1.2s -> s.zarr (analysis/<run_id>); kept 1 analysed before by these analysers, "
        "from the recordings they hold now (`--again` analyses it again)")
    assert analysed_line([fresh, skipped], 0.5, "s.zarr") == "analysed 1 run in 0.5s -> s.zarr (analysis/<run_id>)"
    assert analysed_line([skipped], 0.5, "s.zarr") == "analysed no run: none could be (the table says why)"


def test_the_command_names_the_analysers_whose_analyses_it_replaced(analysed, tmp_path, capsys):
    # a researcher may have quoted an older version's figures: replaced, they are gone from the store
    _, rows, ids = analysed
    copy = _copy(analysed, tmp_path)
    for rid, change in ((ids[0], {"analysis_version": 3}), (ids[1], {"analysis_version": 3}), (ids[2], None)):
        meta = Path(copy) / "analysis" / rid / "zarr.json"
        doc = json.loads(meta.read_text())
        doc["attributes"].update(change) if change else doc["attributes"].pop("analysis_version")
        meta.write_text(json.dumps(doc))
    # a damaged one (a chunk lost) is named too: its version is read from its zarr.json alone
    next(p for p in (Path(copy) / "analysis" / ids[1] / "role").rglob("*") if p.is_file() and p.name != "zarr.json").unlink()
    capsys.readouterr()
    assert cli.main(["analyse", copy, "--workers", "1"]) == 0
    out = capsys.readouterr()
    said = {line.split()[2]: line.split(" ", 3)[3] for line in out.err.splitlines() if line.startswith("[analyse]")}
    assert said == {ids[0]: "analysed (replacing the analysis of analysers version 3)",
                    ids[1]: "analysed (replacing the analysis of analysers version 3)",
                    ids[2]: "analysed (replacing the analysis of analysers that stamped no version)",
                    ids[3]: "kept (analysed before, by these analysers)"}
    assert out.out.splitlines()[-1].endswith(
        "; kept 1 analysed before by these analysers, from the recordings they hold now (`--again` analyses it "
        "again); replaced the analyses of 2 runs by analysers version 3, 1 run by analysers that stamped no version")
    # --again over this version's own analyses replaces no other version's
    assert cli.main(["analyse", copy, "--workers", "1", "--again"]) == 0
    assert "replac" not in capsys.readouterr().out + "".join(str(r) for r in analyse_store(copy, again=True))


def test_the_closing_line_names_the_versions_replaced():
    rows = [{"run": "a", "replaced": "10"}, {"run": "b", "replaced": "9"}, {"run": "c", "replaced": "10"}]
    assert analysed_line(rows, 2.0, "s.zarr") == (
        "analysed 3 runs in 2.0s -> s.zarr (analysis/<run_id>); replaced the analyses of 2 runs by analysers "
        "version 10, 1 run by analysers version 9")
