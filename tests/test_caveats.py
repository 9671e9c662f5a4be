"""Tests for dynamics.caveats: what a completed run's figures do not say by themselves."""

import numpy as np
import pytest
import xarray as xr

from dynamics import caveats
from dynamics.config import load_config, with_values
from dynamics.train import train_run
from tests.conftest import TINY


def _run(eval_loss, attention):
    """A run group's two variables the caveats read: eval_loss (snapshot, component) and attention
    (snapshot, layer, head, probe, query, key)."""
    return xr.Dataset({"eval_loss": (("snapshot", "component"), np.asarray(eval_loss, np.float32)),
                       "attention": (("snapshot", "layer", "head", "probe", "query", "key"),
                                     np.asarray(attention, np.float16))})


def _attention(n_snapshots, change_at=None):
    a = np.full((n_snapshots, 1, 2, 1, 2, 2), 0.5)
    if change_at is not None:
        a[change_at:, 0, 1, 0, 1] = [0.25, 0.75]  # one head's one row moved
    return a


def test_eval_ends_are_the_mean_over_components_at_the_first_and_last_snapshots():
    run = _run([[2.0, 4.0], [1.0, 1.0], [0.5, 1.5]], _attention(3))
    assert caveats.eval_ends(run) == (3.0, 1.0)
    assert all(np.isnan(caveats.eval_ends(run.drop_vars("eval_loss"))))
    assert all(np.isnan(caveats.eval_ends(run.isel(snapshot=slice(0, 0)))))


def test_attention_unchanged_bit_for_bit_between_the_first_and_last_snapshots():
    assert caveats.attention_unchanged(_run([[1.0]] * 3, _attention(3)))
    assert not caveats.attention_unchanged(_run([[1.0]] * 3, _attention(3, change_at=2)))
    back = _attention(3, change_at=1)
    back[2] = back[0]  # moved in between and came back: the last is the first, as the role reads it
    assert caveats.attention_unchanged(_run([[1.0]] * 3, back))
    nan = _attention(3)
    nan[:, 0, 0, 0, 1] = np.nan  # NaN is no value: not "the same"
    assert not caveats.attention_unchanged(_run([[1.0]] * 3, nan))
    assert not caveats.attention_unchanged(_run([[1.0]], _attention(1)))  # one snapshot: nothing to compare
    assert not caveats.attention_unchanged(xr.Dataset())


def test_attention_unchanged_from_an_analysis_is_a_divergence_from_init_of_0_for_every_head():
    # read from the analysis where there is one: the recording's two whole snapshots were 64 MiB each
    # on a large run, for every run of a store, on every `analyse` (a kept one too), report and predict
    from dynamics.schema import ANALYSIS_VERSION

    def analysis(last, version=ANALYSIS_VERSION):
        return xr.Dataset({"divergence_from_init": (("snapshot", "layer", "head"), np.array([[[0.0, 0.0]], [last]]))},
                          attrs={"analysis_version": version})
    moved = _run([[1.0]] * 2, _attention(2, change_at=1))  # the recording says moved: the analysis is read
    assert caveats.attention_unchanged(moved, analysis([0.0, 0.0]))
    assert not caveats.attention_unchanged(moved, analysis([0.0, 1e-5]))
    assert not caveats.attention_unchanged(moved, analysis([0.0, np.nan]))
    assert not caveats.attention_unchanged(moved, analysis([0.0, 0.0]).isel(snapshot=[0]))
    assert not caveats.attention_unchanged(moved, xr.Dataset())  # no divergence_from_init: the recording
    # other analysers' figures are not read (predict read one, and a bad chunk there was a traceback)
    assert not caveats.attention_unchanged(moved, analysis([0.0, 0.0], version=ANALYSIS_VERSION - 1))
    assert not caveats.attention_unchanged(moved, analysis([0.0, 0.0], version=None))
    assert caveats.attention_unchanged(_run([[1.0]] * 2, _attention(2)), analysis([0.0, 1.0], version=None))


def test_heads_pinned_to_hard_templates_are_left_out_of_the_comparison():
    # their attention is the templates' by design: a run of two hard-pinned heads, whose loss fell
    # and whose gradients were not 0, was said to be a run "training never moved"; and a run with
    # one pinned head of four whose three free heads never moved (lr 1e-12) must still be said so
    def config(table, *heads):
        return {"intervene": {"templates": {**table, "heads": [{"layer": 0, "head": i, **h} for i, h in enumerate(heads)]}}}
    assert caveats.pinned(config({"hard": True}, {}, {})) == {(0, 0), (0, 1)}
    assert caveats.pinned(config({}, {}, {"hard": True})) == {(0, 1)}
    assert caveats.pinned(config({"hard": True}, {"hard": False})) == set()
    assert caveats.pinned(config({}, {})) == caveats.pinned({}) == caveats.pinned({"intervene": {}}) == set()
    both = _run([[2.0], [1.0]], _attention(2)).assign_attrs(config=config({"hard": True}, {}, {}))
    assert caveats.of_run(both, "completed") == {}  # no free head to have moved or not
    one = both.assign_attrs(config=config({}, {"hard": True}))  # head (0, 1) free, and unmoved
    assert caveats.of_run(one, "completed") == {"attention_unchanged": True}
    moved = _run([[2.0], [1.0]], _attention(2, change_at=1))  # head (0, 1) moved
    # the moved head pinned: the free one never moved
    assert caveats.of_run(moved.assign_attrs(config=config({}, {}, {"hard": True})), "completed") == {
        "attention_unchanged": True}
    assert caveats.of_run(moved.assign_attrs(config=config({}, {"hard": True})), "completed") == {}
    dfi = xr.Dataset({"divergence_from_init": (("snapshot", "layer", "head"), np.array([[[0.0, 0.0]], [[0.0, 0.2]]]))})
    assert caveats.attention_unchanged(moved, dfi, frozenset({(0, 1)}))  # the moved head is the pinned one
    assert not caveats.attention_unchanged(moved, dfi, frozenset({(0, 0)}))
    assert not caveats.attention_unchanged(moved, dfi, frozenset({(0, 0), (0, 1)}))


def test_of_run_says_a_rise_and_unmoved_heads_of_completed_runs_only():
    run = _run([[2.0], [3.0]], _attention(2))
    assert caveats.of_run(run, "completed") == {"loss_rose": (2.0, 3.0), "attention_unchanged": True}
    assert caveats.of_run(run, "diverged") == {} and caveats.of_run(run, "stopped") == {}
    assert caveats.of_run(_run([[2.0], [2.0]], _attention(2, change_at=1)), "completed") == {}  # level: no rise
    assert caveats.of_run(_run([[2.0], [np.inf]], _attention(2, change_at=1)), "completed") == {}


def test_apart_adds_digits_until_two_losses_differ():
    assert caveats.apart(2.30258, 2.71828) == ("2.303", "2.718")
    assert caveats.apart(2.7725887, 2.7725890) == ("2.7725887", "2.772589")
    assert caveats.apart(1.0, 1.0) == ("1", "1")  # equal: as far as 10 digits, then as they are


def test_text_and_notes_on_paper():
    rose = {"loss_rose": (2.5, 144.6)}
    assert caveats.text(rose) == "eval loss rose over training (2.5 -> 144.6 nats)"
    assert caveats.text({**rose, "attention_unchanged": True}) == (
        "eval loss rose over training (2.5 -> 144.6 nats); attention unchanged from the first snapshot")
    assert caveats.text({}) == "" and caveats.notes({"r0": {}}) == []
    said = {f"r{i}": {"loss_rose": [2.0, 3.0 + i]} for i in range(5)}  # a pair read back from JSON is a list
    said["r9"] = {"attention_unchanged": True}
    rose_line, still_line = caveats.notes(said)
    assert rose_line == ("loss rose in 5 completed run(s): the eval loss at the last snapshot is above that at step 0, "
                         "so training made them worse and their heads' figures are not those of a model that learned "
                         "its task: r0 (2 -> 3 nats), r1 (2 -> 4 nats), r2 (2 -> 5 nats), r3 (2 -> 6 nats), and 1 more")
    assert still_line.startswith("attention unchanged in 1 completed run(s): every head's attention on the probes is "
                                 "the same at the last snapshot as at the first")
    assert still_line.endswith("the run's grad_norm tells which): r9")


@pytest.mark.parametrize(("override", "zero_gradients"), [({"model.init_scale": 3e9}, True),
                                                          ({"train.lr": 1e-12}, False)])
def test_runs_that_training_never_moved_complete_and_are_named(tmp_path, capsys, override, zero_gradients):
    # init_scale 3e9: the second block's LayerNorm input reaches ~1e19, its squares overflow float32,
    # and its output is 0, so every gradient is exactly 0 and the run "completed" at ln(16) with
    # roles like any run's. lr 1e-12: the weights move, the float16 attention does not.
    from dynamics import open_run, store
    from dynamics.analyse import analyse_one
    from dynamics.tables import print_analysis

    cfg_path = tmp_path / "tiny.toml"
    cfg_path.write_text(TINY.format(steps=12, every=4))
    path = str(tmp_path / "s.zarr")
    cfg = with_values(load_config(cfg_path), override)
    train_run(cfg, path, progress=lambda *a, **k: None)
    rid = cfg.run_id()
    assert store.run_attrs(path, rid)["status"] == "completed"
    run = open_run(path, rid, dask=False)
    assert (float(run.grad_norm.max()) == 0.0) is zero_gradients
    row = analyse_one(path, rid)
    assert row["attention_unchanged"] is True
    kept = analyse_one(path, rid)  # a second analyse keeps the stored analysis, and says it again
    assert kept["kept"] and kept["attention_unchanged"] is True
    print_analysis([row])
    assert any(line.startswith("attention unchanged in 1 completed run(s)") and line.endswith(f": {rid}")
               for line in capsys.readouterr().out.splitlines())


def test_apart_goes_as_far_as_ten_digits_and_notes_count_past_four_unmoved_runs():
    assert caveats.apart(1.000000001, 1.000000002) == ("1.000000001", "1.000000002")
    line, = caveats.notes({f"r{i}": {"attention_unchanged": True} for i in range(6)})
    assert line.endswith(": r0, r1, r2, r3, and 2 more")


NOTE = "Note: Attention unchanged in 1 completed run(s)"


@pytest.mark.parametrize("how", ["computed", "stored", "no-compute", "too short"])
def test_the_report_names_an_unmoved_run_whichever_way_it_has_its_analysis(tmp_path, how):
    # the synthetic store's attention never moves; the caveat was tested only on an analysis the
    # report computed itself, not on the usual one that `dynamics analyse` stored, nor without one
    import html

    from dynamics import cli
    from dynamics.config import from_dict
    from tests._report_store import TINY as RAW
    from tests._report_store import _synthetic_store, _written_run

    path = tmp_path / "s.zarr"
    if how == "too short":  # 3 snapshots: no analysis, read from the recording
        raw = {**RAW, "train": {**RAW["train"], "steps": 2, "warmup_steps": 1}}
        _written_run(path, "r0", from_dict(raw), "completed")
    else:
        _synthetic_store(path, {"r0": {"train.seed": 0}})
    if how == "stored":
        assert cli.main(["analyse", str(path)]) == 0
    extra = ["--no-compute"] if how == "no-compute" else []
    assert cli.main(["report", str(path), "--out", str(tmp_path / "out"), *extra]) == 0
    assert NOTE in html.unescape((tmp_path / "out" / "index.html").read_text())


@pytest.fixture
def reads(monkeypatch):
    """Whether each caveat check had the run's analysis to read (not two whole attention snapshots)."""
    seen = []
    real = caveats.attention_unchanged

    def spy(run, analysis=None, pinned_heads=frozenset()):
        seen.append(analysis is not None and "divergence_from_init" in analysis)
        return real(run, analysis, pinned_heads)

    monkeypatch.setattr(caveats, "attention_unchanged", spy)
    return seen


def test_analyse_report_and_predict_read_unmoved_heads_from_the_analysis(tmp_path, reads):
    # 1.1 s and 300 MB a run for the recording's two snapshots on a large run: the analysis is read,
    # which no output shows
    from dynamics import cli
    from dynamics.analyse import analyse_one
    from tests._report_store import _synthetic_store
    from tests.test_predict import make_runs, write_store

    path = tmp_path / "s.zarr"
    _synthetic_store(path, {"r0": {"train.seed": 0}})
    assert cli.main(["report", str(path), "--out", str(tmp_path / "o1")]) == 0  # computed by the report
    row, kept = analyse_one(str(path), "r0"), analyse_one(str(path), "r0")
    assert kept.get("kept") and row["attention_unchanged"] and kept["attention_unchanged"]
    assert cli.main(["report", str(path), "--out", str(tmp_path / "o2")]) == 0  # stored
    other = tmp_path / "p.zarr"
    write_store(other, make_runs(n_seeds=4))
    assert cli.main(["analyse", str(other)]) == 0
    assert cli.main(["predict", str(other), "--horizon", "0", "--folds", "2"]) == 0
    assert len(reads) >= 8 and all(reads), reads
