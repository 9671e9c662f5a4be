"""`dynamics.predict.targets`: each target read at the final snapshot, from a stored analysis or
recomputed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import xarray as xr

from dynamics import predict, store
from dynamics.analysis import analyse_run
from dynamics.predict import PredictError, PredictOptions, Run
from tests.test_predict import OFFSET, STEPS, H, L, P, T, flip_a_bit, make_runs, write_store


def test_targets_are_the_planted_fates(planted):
    runs, _, curve = planted
    for r in runs[:3]:
        fate = r.data.grad_norm.isel(snapshot=1, weight=0).values > np.exp(1.0)  # signal 2 vs noise sd 0.3
        rows = curve.row_run.values == r.run_id
        got = curve.target.values[rows].reshape(L, H)
        np.testing.assert_array_equal(got, fate.astype(float))
    assert set(curve.target_offset.values[curve.target.values == 1]) == {float(OFFSET)}


def test_other_targets_and_chg_where_fitted():
    runs = make_runs(n_seeds=4)
    quick = {"boosting_iter": 10, "n_splits": 2, "horizons": (0.1,)}
    rng = np.random.default_rng(5)
    with_chg = []
    for i, r in enumerate(runs):
        ds = r.data
        if i != 1:  # three runs fitted CHG; the other has no chg_role at all
            codes = np.full((STEPS.size, L, H), -1, np.int8)
            codes[-1] = rng.integers(0, 3, (L, H)) if i != 3 else -1  # run 3: no head fitted at the end
            codes[-1, 0, 0] = -1  # one unfitted head
            ds = ds.assign(chg_role=(("snapshot", "layer", "head"), codes))
        with_chg.append(Run(r.run_id, ds, r.seed, r.config))
    # given from Python, a run that never finished is named as such, not counted among completed runs
    failed = Run(runs[3].run_id, with_chg[3].data.assign_attrs(status="failed"), runs[3].seed, runs[3].config)
    chg_failed = predict.predict_runs([*with_chg[:3], failed], PredictOptions(target="chg", **quick))
    assert chg_failed.attrs["runs_unlabelled"][-1] == (
        f"{runs[3].run_id} (no head labelled at its final snapshot; failed, not completed)")
    chg = predict.predict_runs(with_chg, PredictOptions(target="chg", **quick))
    assert chg.attrs["metric"] == "balanced_accuracy"
    assert chg.sizes["head_row"] == 2 * (L * H - 1)  # 2 fitted runs, one unfitted head each
    assert set(chg.attrs["classes"]) <= {0, 1, 2}
    assert set(chg.attrs["class_names"]) <= {"facilitating", "irrelevant", "interfering"}
    assert runs[1].run_id not in chg.row_run.values
    # the runs without a label were dropped without a word ("heads in 2 runs", no "left out" line)
    unlabelled = [f"{runs[1].run_id} (no CHG fit recorded: record.chg_every = 0)",
                  f"{runs[3].run_id} (no head labelled at its final snapshot)"]
    assert chg.attrs["runs_unlabelled"] == unlabelled
    assert (f"left out: 2 run(s) with no head labelled for target chg: {', '.join(unlabelled)}"
            in predict.format_curve(chg).splitlines())

    imp = predict.predict_runs(runs, PredictOptions(target="importance", group_by="run", **quick))
    assert imp.attrs["metric"] == "spearman"
    assert float(imp.score.sel(model="chance").mean()) == 0.0
    ranks = imp.target.values[imp.row_run.values == runs[0].run_id].reshape(L, H)
    np.testing.assert_allclose(np.sort(ranks, axis=1), np.tile(np.linspace(0, 1, H), (L, 1)))
    # a run of one head per layer ranks no head within its layer: said as that, not as "no head labelled"
    lone = Run(runs[0].run_id, runs[0].data.isel(head=[0]), runs[0].seed, runs[0].config)
    imp = predict.predict_runs([lone, *runs[1:]], PredictOptions(target="importance", group_by="run", **quick))
    assert imp.attrs["runs_unlabelled"] == [f"{runs[0].run_id} (one head per layer: a rank within its layer is undefined)"]

    role = predict.predict_runs(runs, PredictOptions(target="role", **quick))
    assert role.attrs["metric"] == "balanced_accuracy"
    assert "slash" in role.attrs["class_names"]
    assert np.isfinite(role.score.values).all()

    red = predict.final_targets(runs[0].data, "redundant")
    assert red.attrs["source"] == "computed from the final snapshot"
    assert set(np.unique(red.target.values)) <= {0.0, 1.0}


def test_stored_analysis_gives_the_same_targets():
    r = make_runs(n_seeds=1)[0]
    analysis = analyse_run(r.data).load()
    for target in ("slash", "role", "redundant"):
        stored = predict.final_targets(r.data, target, analysis)
        fresh = predict.final_targets(r.data, target)
        assert stored.attrs["source"] == "stored analysis"
        np.testing.assert_array_equal(stored.target.values, fresh.target.values)
    stale = analysis.isel(snapshot=slice(0, -1))  # analysed before the run finished
    assert predict.final_targets(r.data, "slash", stale).attrs["source"] == "computed from the final snapshot"
    # without attention to recompute from, each reason is named (each was a KeyError)
    blind, ends = r.data.drop_vars("attention"), [float(v) for v in r.data["step"].values[-2:]]
    refusals = {f"ends at step {ends[0]:g}, not at the run's final step {ends[1]:g} \\(analysed before the run ended\\)": stale,
                "has no cluster": analysis.drop_vars("cluster"),
                "has cluster_threshold = 0.5, not 0.1": analysis.assign_attrs(cluster_threshold=0.5)}
    for why, given in refusals.items():
        with pytest.raises(PredictError, match=f"target 'redundant': run '.*'s stored analysis {why}, and the run has "
                                               f"no attention to recompute it from"):
            predict.final_targets(blind, "redundant", given)


def test_a_damaged_stored_analysis_is_recomputed_and_named_not_read(tmp_path, capsys):
    # Without a checksum a flipped bit in a stored analysis chunk could decode to another label,
    # read as the run's target; with one the read failed with a traceback out of `predict`
    path = tmp_path / "s.zarr"
    write_store(path, make_runs(n_seeds=3))
    ids = store.list_runs(path)
    for rid in ids:
        store.write_analysis(path, rid, analyse_run(store.open_run(path, rid)))
    flip_a_bit(path / "analysis" / ids[1] / "slash_dominant")
    opts = PredictOptions(target="slash", horizons=(0.1,), n_splits=2)
    curve = predict.predict_store(str(path), opts)
    assert curve.attrs["analysis_unreadable"] == [ids[1]]
    assert curve.attrs["target_sources"] == {"stored analysis": 2, predict.targets.UNREADABLE_SOURCE: 1}
    fresh = predict.predict_store(str(path), dataclasses.replace(opts, use_stored_analysis=False))
    np.testing.assert_array_equal(curve.target.values, fresh.target.values)
    assert (f"recomputed from the final snapshot: the target of 1 run(s) whose stored analysis could not be read "
            f"(damaged; `dynamics analyse` writes it again): {ids[1]}") in predict.format_curve(curve).splitlines()
    assert fresh.attrs["analysis_unreadable"] == []
    # a chunk file lost, which zarr would read as its fill value (0: no head slash-dominant)
    next(p for p in sorted((path / "analysis" / ids[2] / "slash_dominant" / "c").rglob("*")) if p.is_file()).unlink()
    lost = predict.predict_store(str(path), opts)
    assert lost.attrs["analysis_unreadable"] == [ids[1], ids[2]]
    np.testing.assert_array_equal(lost.target.values, fresh.target.values)
    # an index coordinate, which xarray decodes as the group is opened (a ValueError out of open_analysis)
    flip_a_bit(path / "analysis" / ids[0] / "head")
    coord = predict.predict_store(str(path), opts)
    assert coord.attrs["analysis_unreadable"] == ids
    np.testing.assert_array_equal(coord.target.values, fresh.target.values)
    # without attention there is nothing to recompute it from: one line naming the run
    run = store.open_run(path, ids[1]).drop_vars("attention")
    with pytest.raises(PredictError, match=f"run {ids[1]!r}'s stored analysis cannot be read \\(ValueError: Stored "
                                           f"and computed checksum do not match"):
        predict.final_targets(run, "slash", store.open_analysis(path, ids[1]))
    # as predict says it of a store of such runs, whose analyses it reads as it opens them
    blind, runs = tmp_path / "blind.zarr", make_runs(n_seeds=3)
    write_store(blind, [dataclasses.replace(r, data=r.data.drop_vars("attention")) for r in runs])
    for r in runs:
        store.write_analysis(blind, r.run_id, analyse_run(r.data))
    flip_a_bit(blind / "analysis" / runs[1].run_id / "slash_dominant")
    with pytest.raises(PredictError, match=f"run {runs[1].run_id!r}'s stored analysis cannot be read \\(ValueError: "
                                           f"Stored and computed checksum do not match"):
        predict.predict_store(str(blind), opts)


def test_an_analysis_swapped_between_predicts_open_and_its_read_of_the_labels_gives_one_versions_targets(
        tmp_path, monkeypatch):
    # load_store opened each analysis lazily, its attributes (analysers' version, thresholds, final
    # step) checked then and its labels read later: an `analyse` swapping in another version in
    # between gave the old version's attributes with the new one's labels, passed as the targets.
    import shutil

    from dynamics.analysis.roles import ROLES
    from dynamics.schema import ANALYSIS_VERSION
    from tests.test_store_races import exchange_at_first_read

    path, other = tmp_path / "s.zarr", tmp_path / "new.zarr"
    write_store(path, make_runs(n_seeds=3))
    ids = store.list_runs(path)
    for rid in ids:
        store.write_analysis(path, rid, analyse_run(store.open_run(path, rid)))
    shutil.copytree(path, other)
    old = store.open_analysis(path, ids[0]).load()
    # the new version: other analysers' (so not read as targets), whose every label differs from the old
    store.write_analysis(other, ids[0], old.assign(role=(old.role + 1) % len(ROLES))
                         .assign_attrs(analysis_version=ANALYSIS_VERSION + 1))
    opts = PredictOptions(target="role", horizons=(0.1,), n_splits=2, boosting_iter=10)
    fresh = predict.predict_store(str(path), dataclasses.replace(opts, use_stored_analysis=False))
    swapped = exchange_at_first_read(tmp_path, monkeypatch, f"analysis/{ids[0]}/role/c",  # its labels' first read
                                     path / "analysis" / ids[0], other / "analysis" / ids[0])
    curve = predict.predict_store(str(path), opts)
    assert swapped
    assert curve.attrs["target_sources"] == {"stored analysis": 2, "computed from the final snapshot": 1}
    np.testing.assert_array_equal(curve.target.values, fresh.target.values)


def _analysed_stores(tmp_path, stale: int | None = None):
    """(store, the same store without attention, its 3 runs), each run analysed; run `stale` by
    the analysers of the version before these."""
    from dynamics.schema import ANALYSIS_VERSION

    path, blind = tmp_path / "s.zarr", tmp_path / "blind.zarr"
    runs = make_runs(n_seeds=3)
    write_store(path, runs)
    write_store(blind, [dataclasses.replace(r, data=r.data.drop_vars("attention")) for r in runs])
    for p in (path, blind):
        for i, r in enumerate(runs):
            a = analyse_run(r.data)
            store.write_analysis(p, r.run_id, a.assign_attrs(analysis_version=ANALYSIS_VERSION - 1) if i == stale else a)
    return path, blind, runs


def test_runs_loaded_for_one_target_give_another_from_their_stored_analysis(tmp_path):
    # load_store read only the variables of the target it was given: runs loaded for slash (the
    # default) recomputed their roles, and without attention raised a KeyError
    path, blind, runs = _analysed_stores(tmp_path)
    for p in (path, blind):
        loaded = predict.load_runs(str(p))
        for target in ("role", "slash"):
            assert predict.target_table(loaded, PredictOptions(target=target)).attrs["sources"] == {"stored analysis": 3}
        # (every head of these runs is redundant: a constant target, which target_table refuses)
        assert {predict.final_targets(r.data, "redundant", r.analysis).attrs["source"] for r in loaded} == \
            {"stored analysis"}


def test_a_bad_chunk_in_labels_a_target_does_not_read_leaves_its_own_read(tmp_path):
    # load_store read every target's labels in one load: a bit flipped in the clusters (read by
    # --target redundant alone) made slash's stored labels unreadable, and a run without attention
    # refused (a review helper)
    path, blind, runs = _analysed_stores(tmp_path)
    for p in (path, blind):
        flip_a_bit(p / "analysis" / runs[1].run_id / "cluster")
        table = predict.target_table(predict.load_runs(str(p)), PredictOptions())
        assert table.attrs["sources"] == {"stored analysis": 3} and table.attrs["analysis_unreadable"] == []
    # while the clusters' own target names the run as damaged: recomputed, or without attention refused
    redundant = predict.load_runs(str(path), PredictOptions(target="redundant"))
    assert [r.run_id for r in redundant if r.analysis_unreadable] == [runs[1].run_id]
    with pytest.raises(PredictError, match=f"run {runs[1].run_id!r}'s stored analysis cannot be read"):
        predict.load_runs(str(blind), PredictOptions(target="redundant"))
    # and so does it of runs loaded for slash (their clusters left out as damaged): it had read
    # them as never analysed, a silent recompute, and without attention "has no cluster"
    sources = {r.run_id: predict.final_targets(r.data, "redundant", r.analysis).attrs["source"]
               for r in predict.load_runs(str(path))}
    assert sources == {r.run_id: predict.targets.UNREADABLE_SOURCE if r is runs[1] else "stored analysis" for r in runs}
    with pytest.raises(PredictError, match=f"run {runs[1].run_id!r}'s stored analysis cannot be read \\(ValueError: "
                                           f"Stored and computed checksum do not match"):
        predict.target_table(predict.load_runs(str(blind)), PredictOptions(target="redundant"))


def test_another_versions_analysis_is_not_read_for_targets_or_caveats(tmp_path):
    # Its divergence_from_init was read for the caveats (a bad chunk there: a traceback out of
    # predict, after every model was fitted), and a run without attention raised a KeyError
    from dynamics.schema import ANALYSIS_VERSION

    path, blind, runs = _analysed_stores(tmp_path, stale=1)
    for p in (path, blind):
        flip_a_bit(p / "analysis" / runs[1].run_id / "divergence_from_init")
    opts = PredictOptions(target="role", horizons=(0.1,), n_splits=2, boosting_iter=10)
    curve = predict.predict_store(str(path), opts)
    assert curve.attrs["target_sources"] == {"stored analysis": 2, "computed from the final snapshot": 1}
    assert curve.attrs["analysis_unreadable"] == []
    with pytest.raises(PredictError, match=f"target 'role': run {runs[1].run_id!r}'s stored analysis was written by "
                                           f"analysers version {ANALYSIS_VERSION - 1}, these are version "
                                           f"{ANALYSIS_VERSION}, and the run has no attention to recompute it from"):
        predict.predict_store(str(blind), opts)


def test_use_stored_analysis_false_computes_targets_even_when_runs_carry_an_analysis():
    # predict_runs read each Run's analysis whatever the option said: a curve recording
    # use_stored_analysis=False had its targets from the stored analysis.
    runs = [dataclasses.replace(r, analysis=analyse_run(r.data).load()) for r in make_runs(n_seeds=2)]
    assert predict.target_table(runs, PredictOptions()).attrs["sources"] == {"stored analysis": 2}
    fresh = predict.target_table(runs, PredictOptions(use_stored_analysis=False))
    assert fresh.attrs["sources"] == {"computed from the final snapshot": 2}
    blind = [dataclasses.replace(r, data=r.data.drop_vars("attention")) for r in runs]
    predict.check_runs(blind, PredictOptions())  # the stored analysis gives the targets
    with pytest.raises(PredictError, match="no attention to compute it from"):  # was a KeyError mid-way
        predict.check_runs(blind, PredictOptions(use_stored_analysis=False))


def _planted(t: int) -> tuple[np.ndarray, ...]:
    """(query, key) maps of a previous-token, a first-key (sink), a uniform and a self head."""
    prev = np.eye(t, k=-1)
    prev[0, 0] = 1.0
    sink = np.zeros((t, t))
    sink[:, 0] = 1.0
    return prev, sink, np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None], np.eye(t)


def _final_maps(maps) -> xr.Dataset:
    """A one-snapshot run (step 10) of one probe from maps[layer][head], each (query, key)."""
    attn = np.array(maps)[None, :, :, None]  # (snapshot, layer, head, probe, query, key)
    return xr.Dataset({"attention": (("snapshot", "layer", "head", "probe", "query", "key"), attn)},
                      coords={"step": ("snapshot", [10]), "layer": [0, 1], "head": [0, 1, 2]})


def test_the_redundant_target_is_one_for_heads_in_a_cluster_of_two_or_more():
    # Known answer: layer 0's heads 0 and 1 both attend to the previous token, and layer 1's head 0
    # does too (clusters span layers); layer 0's head 2 attends to the first key, layer 1's head 1 to
    # itself, layer 1's head 2 uniformly: each alone. The fixture of the other tests has every head
    # redundant, so a target of 1 everywhere passed them all.
    prev, sink, uniform, self_ = _planted(6)
    ds = _final_maps([[prev, prev, sink], [prev, self_, uniform]])
    got = predict.final_targets(ds, "redundant")
    np.testing.assert_array_equal(got.target.values, [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # a head missing from a narrower layer (NaN attention, label -1) has no target
    ds["attention"][0, 1, 2] = np.nan
    np.testing.assert_array_equal(predict.final_targets(ds, "redundant").target.values,
                                  [[1.0, 1.0, 0.0], [1.0, 0.0, np.nan]])


def test_a_lone_head_has_no_redundancy_target():
    # It was labelled 0 ("not redundant"), a claim about a comparison that cannot be made.
    r = make_runs(n_seeds=1)[0]
    one = r.data.isel(layer=[0], head=[0])
    assert np.isnan(predict.final_targets(one, "redundant").target.values).all()
    two = r.data.isel(layer=[0], head=[0, 1])
    assert np.isfinite(predict.final_targets(two, "redundant").target.values).all()


@pytest.mark.parametrize("target", ["slash", "role", "importance", "redundant"])
def test_a_run_picked_from_a_padded_sweep_has_its_own_targets_and_none_for_heads_it_lacks(target):
    # open_sweep pads a shorter run's snapshots and a smaller model's heads with NaN, and
    # .sel(run=...) keeps that padding: the final snapshot read was padding (every role 'none',
    # every importance NaN), and a head the run lacks was labelled 'none' rather than left out.
    r = make_runs(n_seeds=1)[0].data
    padded = r.pad(snapshot=(0, 2), head=(0, 1)).assign_coords(head=np.arange(H + 1))  # (..., H + 1) heads
    assert np.isnan(padded["step"].values[-1])
    want = predict.final_targets(r, target).target.values  # (L, H)
    got = predict.final_targets(padded, target).target.values  # (L, H + 1)
    if target != "importance":  # with the run's stored analysis, of H heads: recomputed (a broadcast error)
        stored = predict.final_targets(padded, target, analyse_run(r).compute())
        assert stored.attrs["source"] == "computed from the final snapshot"
        np.testing.assert_array_equal(stored.target.values, got)
    np.testing.assert_array_equal(got[:, :H], want)
    assert np.isnan(got[:, H]).all()
    assert np.isfinite(want).any()
    np.testing.assert_array_equal(predict.horizon_steps(padded, [0.5, 1.0], "fraction"), [50.0, 100.0])


def test_a_nan_importance_leaves_its_peers_ranked():
    # rankdata made the whole layer NaN: one head's NaN importance took every head of its layer
    # out of the importance target and out of both rank features
    from dynamics.predict.features import head_features

    imp = np.array([[[1.0, np.nan, 3.0, 2.0], [4.0, 3.0, 2.0, 1.0]]])  # (snapshot, layer, head)
    ds = xr.Dataset({"importance": (("snapshot", "layer", "head"), imp)},
                    coords={"step": ("snapshot", [100]), "layer": [0, 1], "head": [0, 1, 2, 3]})
    expected = [[0.0, np.nan, 1.0, 0.5], [1.0, 2 / 3, 1 / 3, 0.0]]
    np.testing.assert_allclose(predict.final_targets(ds, "importance").target.values, expected)
    np.testing.assert_allclose(head_features(ds).sel(feature="importance_rank_h").values, expected)
    # one importance left in a layer: no peer to rank against, so no target (a feature of 0.5)
    lone = ds.copy(data={"importance": np.array([[[1.0, np.nan, np.nan, np.nan], [4.0, 3.0, 2.0, 1.0]]])})
    assert np.isnan(predict.final_targets(lone, "importance").target.values[0]).all()
    np.testing.assert_allclose(head_features(lone).sel(feature="importance_rank_h").values[0],
                               [0.5, np.nan, np.nan, np.nan])


def test_the_importance_target_and_features_are_michels_gate_times_the_recorded_gradient():
    # With learned gates the recorded |dL/dg| is not Michel et al.'s |dL/dxi| = g |dL/dg|: a
    # nearly shut head (g 0.01) ranked first in its layer on |dL/dg| alone.
    from dynamics.predict.features import head_features

    imp = np.array([[[4.0, 3.0, 2.0, 1.0]]])  # (snapshot, layer, head): recorded |dL/dg|
    gate = np.array([[[0.01, 1.0, 1.0, 1.0]]])  # michel: 0.04, 3, 2, 1
    ds = xr.Dataset({"importance": (("snapshot", "layer", "head"), imp), "gate": (("snapshot", "layer", "head"), gate)},
                    coords={"step": ("snapshot", [100]), "layer": [0], "head": [0, 1, 2, 3]})
    expected = [[0.0, 1.0, 2 / 3, 1 / 3]]
    np.testing.assert_allclose(predict.final_targets(ds, "importance").target.values, expected)
    feats = head_features(ds)
    np.testing.assert_allclose(feats.sel(feature="importance_rank_h").values, expected)
    np.testing.assert_allclose(feats.sel(feature="importance_h").values, np.log10(imp[0] * gate[0] + 1e-12))
    # fixed gates (g = 1) and no gate recorded give the recorded value itself
    ones = ds.assign(gate=ds.gate * 0 + 1)
    np.testing.assert_array_equal(predict.final_targets(ones, "importance").target.values,
                                  predict.final_targets(ds.drop_vars("gate"), "importance").target.values)


def test_stored_analysis_under_other_thresholds_is_not_read_as_the_target():
    # The curve records the thresholds of its options; a stored analysis made under others
    # defines another target, so the target is recomputed (or refused without attention).
    from dynamics.analysis.pipeline import AnalysisOptions

    r = make_runs(n_seeds=1)[0]
    analysis = analyse_run(r.data).load()  # kappa 0.5, cluster threshold 0.1
    strict = AnalysisOptions(kappa=0.95)  # the planted slash heads put 0.9 on their offset
    got = predict.final_targets(r.data, "slash", analysis, strict)
    assert got.attrs["source"] == "computed from the final snapshot"
    assert got.target.values.sum() == 0 < predict.final_targets(r.data, "slash", analysis).target.values.sum()
    loose = AnalysisOptions(cluster_threshold=0.9)
    got = predict.final_targets(r.data, "redundant", analysis, loose)
    assert got.attrs["source"] == "computed from the final snapshot"  # the values alike: every head redundant at both
    np.testing.assert_array_equal(got.target.values, predict.final_targets(r.data, "redundant", None, loose).target.values)
    other_token = AnalysisOptions(roles=dataclasses.replace(strict.roles, token_id=3))
    assert predict.final_targets(r.data, "role", analysis, other_token).attrs["source"] != "stored analysis"
    other_induction = AnalysisOptions(roles=dataclasses.replace(strict.roles, induction=0.9))
    assert predict.final_targets(r.data, "role", analysis, other_induction).attrs["source"] != "stored analysis"
    assert predict.final_targets(r.data, "role", analysis).attrs["source"] == "stored analysis"
    with pytest.raises(PredictError, match="kappa"):
        predict.final_targets(r.data.drop_vars("attention"), "slash", analysis, strict)
    # An analysis stored by older analysers (no or another analysis_version) is not read either.
    old = analysis.copy()
    old.attrs = {k: v for k, v in analysis.attrs.items() if k != "analysis_version"}
    assert predict.final_targets(r.data, "role", old).attrs["source"] == "computed from the final snapshot"


def test_a_sink_head_is_not_a_slash_target_nor_a_long_offset_feature():
    # A sink head puts all of every row on key 0, so slash_score(T - 1) = A[T-1, 0] = 1; the
    # offset window (T // 2) must keep it out of the slash target however the target is read.
    r = make_runs(n_seeds=1)[0]
    attention = r.data["attention"].values.copy()
    sink = np.zeros((P, T, T))
    sink[..., 0] = 1.0
    attention[:, 0, 0] = sink  # every snapshot: the feature below reads an early one
    ds = r.data.assign(attention=(r.data["attention"].dims, attention))
    stored = predict.final_targets(ds, "slash", analyse_run(ds).load())
    fresh = predict.final_targets(ds, "slash")
    assert fresh.attrs["source"] == "computed from the final snapshot"
    for targets in (stored, fresh):
        assert targets.target.values[0, 0] == 0.0
        assert targets.offset.values[0, 0] <= T // 2
    np.testing.assert_array_equal(stored.target.values, fresh.target.values)
    np.testing.assert_array_equal(stored.offset.values, fresh.offset.values)
    features = predict.head_features(ds.isel(snapshot=slice(0, 3)))
    assert float(features.sel(layer=0, head=0, feature="best_offset_h")) <= T // 2


# Known answers that mutants of this module passed (a mutation audit's): each pins a behaviour
# a mutant changed without any other test noticing.


def test_the_redundant_target_counts_a_cluster_of_exactly_two():
    # Mutant `>= 2` -> `>= 3`: the existing known answer has a cluster of three; a pair of heads
    # with the same map is redundant too. Layer 0: prev, prev, sink; layer 1: self, uniform, sink.
    prev, sink, uniform, self_ = _planted(6)
    ds = _final_maps([[prev, prev, sink], [self_, uniform, sink]])
    np.testing.assert_array_equal(predict.final_targets(ds, "redundant").target.values, [[1, 1, 1], [0, 0, 1]])


def test_a_stored_analysis_with_other_role_thresholds_than_ours_is_not_read():
    # Mutant comparing threshold dicts as `stored >= wanted`: an analysis recording a threshold
    # these options lack was read as made under the same ones.
    r = make_runs(n_seeds=1)[0]
    analysis = analyse_run(r.data).load()
    assert predict.final_targets(r.data, "role", analysis).attrs["source"] == "stored analysis"
    extra = analysis.copy()
    extra.attrs = {**analysis.attrs, "role_thresholds": {**analysis.attrs["role_thresholds"], "retired": 0.5}}
    assert predict.final_targets(r.data, "role", extra).attrs["source"] == "computed from the final snapshot"


def test_exactly_min_heads_labelled_heads_are_enough():
    # Mutant `n < min_heads` -> `<=`: "need at least 32" refused 32 heads.
    runs = make_runs(n_seeds=2)  # 2 runs x 16 heads, every head labelled
    rows = predict.target_table(runs, PredictOptions(min_heads=32))
    assert rows.sizes["head_row"] == 32
    with pytest.raises(predict.PredictError, match="32 labelled head"):
        predict.target_table(runs, PredictOptions(min_heads=33))



def test_too_few_labelled_heads_name_the_runs_that_gave_none():
    # Six runs of one head per layer refused "0 labelled head(s), need at least 10" with no word
    # of why: the reason was kept only for a curve that got made.
    runs = make_runs(n_seeds=5)
    lone = [Run(r.run_id, r.data.isel(head=[0]), r.seed, r.config) for r in runs]
    with pytest.raises(predict.PredictError) as refused:
        predict.target_table(lone, PredictOptions(target="importance"))
    ids = [r.run_id for r in runs]
    assert str(refused.value) == (
        "target 'importance': 0 labelled head(s), need at least 10; 5 run(s) gave none: "
        + ", ".join(f"{i} (one head per layer: a rank within its layer is undefined)" for i in ids[:3])
        + ", and 2 more")
    with pytest.raises(predict.PredictError) as refused:  # exactly three: each named, no ", and 0 more"
        predict.target_table(lone[:3], PredictOptions(target="importance"))
    assert str(refused.value).endswith(f"{ids[2]} (one head per layer: a rank within its layer is undefined)")
    # one head per layer leaves a slash label defined: its reason is not the rank's
    blind = []
    for r in lone[:3]:
        data = r.data.copy(deep=True)
        data["attention"][-1] = np.nan  # no final attention: no head labelled
        blind.append(Run(r.run_id, data, r.seed, r.config))
    with pytest.raises(predict.PredictError) as refused:
        predict.target_table(blind, PredictOptions(target="slash"))
    assert f"{ids[0]} (no head labelled at its final snapshot)" in str(refused.value)
    assert "rank" not in str(refused.value)
    with pytest.raises(predict.PredictError) as refused:  # every run labelled: the count alone
        predict.target_table(runs[:2], PredictOptions(min_heads=33))
    assert str(refused.value) == "target 'slash': 32 labelled head(s), need at least 33"


def test_a_constant_target_and_a_single_group_are_refused_by_name():
    # Mutants `values.size < 2` -> `< 1` and `len(groups) < 2` -> `< 1`: a store without slash
    # heads, or runs of one seed grouped by seed, went on to fit without the message that says why.
    from tests.test_predict import make_run

    flat = [Run(f"r{s}", make_run(s, np.zeros((2, 8), bool)), seed=s) for s in range(2)]
    # only the targets that vary here are offered: these runs' roles are all one and every head is
    # redundant, and each constant target had named the others ("may vary here")
    for t in ("role", "redundant"):
        assert len({v for r in flat for v in predict.final_targets(r.data, t).target.values.ravel()}) == 1
    with pytest.raises(predict.PredictError, match=r"^target 'slash' is constant: every one of 32 heads has the value 0; "
                                                   r"--target importance varies here$"):
        predict.target_table(flat, PredictOptions())
    with pytest.raises(predict.PredictError, match=r"^target 'redundant' is constant: every one of 32 heads has the "
                                                   r"value 1; --target importance varies here$"):
        predict.target_table(flat, PredictOptions(target="redundant"))
    unranked = [Run(r.run_id, r.data.drop_vars("importance"), r.seed) for r in flat]
    with pytest.raises(predict.PredictError, match=r"value 0; no other target \(role, importance, redundant\) varies "
                                                   r"on these runs either$"):
        predict.target_table(unranked, PredictOptions())
    # a target predict would refuse on these runs is not named either: one run without importance
    # refuses --target importance ("records no importance"), which was offered
    with pytest.raises(predict.PredictError, match=r"value 0; no other target \(role, importance, redundant\) varies"):
        predict.target_table([unranked[0], flat[1]], PredictOptions())
    # no run fitted CHG gates: chg is not named (named, it was refused next: "no CHG fit recorded")
    codes = np.zeros((STEPS.size, 2, 8), np.int8)
    codes[-1, 0, 0] = 1  # a run that fitted CHG, whose heads end in two classes: chg is offered
    fitted = [Run(r.run_id, r.data.assign(chg_role=(("snapshot", "layer", "head"), codes)), r.seed) for r in flat]
    with pytest.raises(predict.PredictError, match=r"--target importance or chg varies here$"):
        predict.target_table(fitted, PredictOptions())
    # one run of two fitted them: offered too (the runs without are named if it is chosen)
    with pytest.raises(predict.PredictError, match=r"--target importance or chg varies here$"):
        predict.target_table([fitted[0], flat[1]], PredictOptions())
    with pytest.raises(predict.PredictError, match=r"no other target \(role, importance, chg, redundant\) varies"):
        predict.target_table([Run(r.run_id, r.data.assign(chg_role=(("snapshot", "layer", "head"), codes * 0)), r.seed)
                              for r in unranked], PredictOptions())
    fates = np.zeros((2, 8), bool)
    fates[0, :4] = True
    same_seed = [Run(f"r{c}", make_run(c, fates), seed=0, config=str(c)) for c in range(2)]
    with pytest.raises(predict.PredictError, match="labelled heads fall in one group"):
        predict.target_table(same_seed, PredictOptions(group_by="seed"))


def test_a_stored_slash_analysis_under_other_offsets_is_not_read():
    # Mutant leaving slash_offsets out of the settings compared: an analysis whose offsets window
    # differs from these options' defines another slash target, yet was read as this one.
    r = make_runs(n_seeds=1)[0]
    analysis = analyse_run(r.data).load()
    assert predict.final_targets(r.data, "slash", analysis).attrs["source"] == "stored analysis"
    other = analysis.copy()
    lo, hi = analysis.attrs["slash_offsets"]
    other.attrs = {**analysis.attrs, "slash_offsets": [lo, hi - 1]}
    assert predict.final_targets(r.data, "slash", other).attrs["source"] == "computed from the final snapshot"


def test_a_role_targets_agreement_is_the_analysis_role_resampled_stored_or_recomputed():
    from dynamics.analysis.probe_resample import label_agreement

    r = make_runs(n_seeds=1)[0]
    analysis = analyse_run(r.data).load()
    expected = label_agreement(analysis["role"].isel(snapshot=-1), analysis["role_resampled"]).transpose("layer", "head")
    stored = predict.final_targets(r.data, "role", analysis)
    fresh = predict.final_targets(r.data, "role")
    assert stored.attrs["source"] == "stored analysis" and fresh.attrs["source"] == "computed from the final snapshot"
    for got in (stored, fresh):
        np.testing.assert_array_equal(got["agreement"].values, expected.values)
    assert "agreement" not in predict.final_targets(r.data, "slash", analysis)
    # the stored resamples are read with the stored labels: a planted disagreement shows
    planted = analysis.copy()
    planted["role_resampled"] = planted["role_resampled"].copy(data=np.where(
        np.arange(200)[:, None, None] < 50, 8 - analysis["role"].isel(snapshot=-1).values[None], analysis["role"].isel(
            snapshot=-1).values[None]).astype(np.int8))
    assert (predict.final_targets(r.data, "role", planted)["agreement"] == 0.75).all()
    # one probe: nothing resampled, no agreement
    one = r.data.isel(probe=[0])
    assert "agreement" not in predict.final_targets(one, "role")


def test_the_probe_sensitive_note_counts_the_targets_few_resamples_keep():
    from dynamics.predict.targets import probe_sensitive_note

    (line,) = probe_sensitive_note(np.array([0.5, 0.895, 0.9, 1.0, np.nan]))
    assert line.startswith("probe-sensitive targets: 2 of the 4 heads measured get their final label on fewer than "
                           "90% of 200 bootstrap resamples of their run's probes")
    assert probe_sensitive_note(np.array([0.9, 1.0])) == [] == probe_sensitive_note(None)
    assert probe_sensitive_note(np.array([np.nan, np.nan])) == []


def test_a_role_curve_keeps_each_targets_agreement_and_says_how_many_are_probe_sensitive():
    runs = make_runs(n_seeds=3)
    curve = predict.predict_runs(runs, PredictOptions(target="role", boosting_iter=10, n_splits=3, horizons=(0.1,)))
    agreement = curve["target_agreement"].values
    assert agreement.shape == curve["target"].shape and np.isfinite(agreement).all()
    for rid in np.unique(curve.row_run.values):
        run = next(r for r in runs if r.run_id == rid)
        rows = curve.row_run.values == rid
        expected = predict.final_targets(run.data, "role")["agreement"].values.ravel()
        np.testing.assert_array_equal(agreement[rows], expected[curve.row_layer.values[rows] * H + curve.row_head.values[rows]])
    assert (agreement == 1.0).all()  # these planted heads: every resample agrees, and nothing is said
    assert "probe-sensitive" not in predict.format_curve(curve)
    fewer = curve.assign(target_agreement=curve["target_agreement"].where(curve.row_head != 0, 0.5))
    said = [x for x in predict.format_curve(fewer).splitlines() if x.startswith("probe-sensitive targets: ")]
    assert len(said) == 1 and said[0].startswith(f"probe-sensitive targets: {int((curve.row_head == 0).sum())} of the "
                                                 f"{curve.sizes['head_row']} heads measured")
    assert "target_agreement" not in predict.predict_runs(runs, PredictOptions(
        target="slash", boosting_iter=10, n_splits=3, horizons=(0.1,)))


def test_a_damaged_role_resampled_is_computed_again_not_raised():
    # the labels read from the stored analysis, their resamples not: the agreement is computed
    # from the final snapshot as analyse computes it, the same values
    import dask.array as da

    r = make_runs(n_seeds=1)[0]
    analysis = analyse_run(r.data).load()
    want = predict.final_targets(r.data, "role", analysis)["agreement"].values

    def broken(block):
        raise OSError("chunk failed its checksum")

    damaged = analysis.copy()
    lazy = da.from_array(analysis["role_resampled"].values, chunks=-1).map_blocks(broken, dtype=np.int8)
    damaged["role_resampled"] = (analysis["role_resampled"].dims, lazy)
    got = predict.final_targets(r.data, "role", damaged)
    assert got.attrs["source"] == "stored analysis"
    np.testing.assert_array_equal(got["agreement"].values, want)
