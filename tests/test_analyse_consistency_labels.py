"""seed_consistency's groups: which runs count, and the label a group is printed with."""

import json
import re
import shutil

import numpy as np
import pytest
import xarray as xr

from dynamics import store
from dynamics.analyse import seed_consistency
from dynamics.analysis import ROLES
from dynamics.analysis.pipeline import ANALYSIS_VERSION
from dynamics.config import load_config, with_values
from dynamics.train import train_run


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    """Two finished runs of one config, seeds 0 and 1, each with an analysis whose final profiles
    are the other's with its heads swapped (similarity 1)."""
    from tests.conftest import TINY

    d = tmp_path_factory.mktemp("labels")
    (d / "tiny.toml").write_text(TINY.format(steps=2, every=10))
    base = load_config(d / "tiny.toml")
    path = str(d / "s.zarr")
    ids = []
    for seed in (0, 1):
        cfg = with_values(base, {"train.seed": seed})
        train_run(cfg, path)
        ids.append(cfg.run_id())
    profile = np.random.default_rng(0).random((len(ROLES) - 1, 1, 2, 2))  # (role_name, snapshot, layer, head)
    for rid, p in zip(ids, (profile, profile[..., ::-1]), strict=True):
        store.write_analysis(path, rid, xr.Dataset(
            {"role_score": (("role_name", "snapshot", "layer", "head"), p)},
            coords={"role_name": list(ROLES[:-1]), "layer": [0, 1], "head": [0, 1]},
            attrs={"analysis_version": ANALYSIS_VERSION}))
    return path, ids


@pytest.fixture
def copy(two_seeds, tmp_path):
    path, ids = two_seeds
    shutil.copytree(path, tmp_path / "s.zarr")
    return str(tmp_path / "s.zarr"), ids


def test_the_one_group_of_a_store_without_a_sweep_is_named_by_its_config_hash(copy):
    # no setting tells it from another group, and no sweep axis names it: the hash, not an empty label
    path, _ = copy
    [(label, similarity, _, n, _)] = seed_consistency(path)
    assert re.fullmatch(r"config [0-9a-f]{8}", label), label
    assert (similarity, n) == (pytest.approx(1.0, abs=1e-12), 2)
    assert store.open_derived(path, "consistency").label.values.tolist() == [label]


def test_only_the_runs_asked_for_are_compared(copy):
    # `analyse` passes the runs it has just analysed: one whose analysis failed this time is not
    # counted from the analysis an earlier one left
    path, ids = copy
    assert seed_consistency(path, ids[:1]) == []
    assert [n for *_, n, _ in seed_consistency(path, ids)] == [2]


def test_analyse_compares_the_runs_another_analysed_since_it_listed_its_own_and_leaves_out_its_failures(copy, capsys):
    # An `analyse` started before the sweep finished wrote consistency from its own runs alone,
    # over the fuller result a later `analyse` had written, when it ended last (a concurrency audit's)
    from dynamics.tables import print_consistency

    path, ids = copy
    print_consistency(path, [{"run": ids[0], "status": "completed"}])  # the other run: analysed elsewhere since
    assert "over 2 seeds" in capsys.readouterr().out
    assert store.open_derived(path, "consistency").sizes["pair"] == 1
    # or still training when this command listed it (a sweep's runs in flight), finished and analysed since
    print_consistency(path, [{"run": ids[0], "status": "completed"},
                             {"run": ids[1], "status": "running", "skipped": True, "reason": "unfinished"}])
    assert "over 2 seeds" in capsys.readouterr().out
    assert store.open_derived(path, "consistency").sizes["pair"] == 1
    # a run this command listed but could not analyse is not counted from the analysis it holds
    print_consistency(path, [{"run": ids[0], "status": "completed"},
                             {"run": ids[1], "status": "completed", "skipped": True, "error": "analysis failed"}])
    assert "over 2 seeds" not in capsys.readouterr().out
    assert store.open_derived(path, "consistency").sizes["group"] == 0
    assert [n for *_, n, _ in seed_consistency(path, leave_out=ids[1:])] == []


def test_a_run_the_sweep_index_does_not_list_joins_its_group(copy):
    # a run trained into a sweep's store by `dynamics run` (another seed of a swept point) has no
    # entry in the sweep index
    path, ids = copy
    store.write_sweep_index(path, {"axes": ["model.init_scale", "train.seed"],
                                   "runs": {ids[0]: {"model.init_scale": 1.0, "train.seed": 0}}})
    [(label, _, _, n, _)] = seed_consistency(path)
    assert label == json.dumps({"model.init_scale": 1.0}) and n == 2


def test_a_label_lists_the_swept_values_in_the_sweeps_axis_order(copy):
    # as the analyse table's columns: json's sort_keys had put model.init_scale before train.lr
    path, ids = copy
    entry = {"train.lr": 0.001, "model.init_scale": 1.0, "train.seed": 0}
    store.write_sweep_index(path, {"axes": ["train.lr", "model.init_scale", "train.seed"],
                                   "runs": {ids[0]: entry, ids[1]: {**entry, "train.seed": 1}}})
    [(label, _, _, n, _)] = seed_consistency(path)
    assert label == '{"train.lr": 0.001, "model.init_scale": 1.0}' and n == 2
