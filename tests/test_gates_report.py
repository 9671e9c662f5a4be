"""`gates.report`: the table and the lines `dynamics gates` prints (tied labels, contrastive
restarts, unsettled gates, rho and its weights) and the runs it refuses to fit."""

import numpy as np
import pytest
import torch

from dynamics.config import ConfigError, from_dict
from dynamics.gates import IRRELEVANT, chg_roles, fit_chg, gate_report, label_agreement, report_lines, report_table
from dynamics.train import build
from tests.test_gates import FAST, TINY, one_thread, tiny_model  # noqa: F401 - fixtures: one_thread (autouse), tiny


def test_the_table_marks_tied_labels_and_shows_where_contrastive_restarts_split(tiny):
    # A 1-1 split of two restarts was printed as "facilitating" beside G+ 1.000, G- 0.419 (irrelevant by
    # the means), and restarts keeping and dropping a head as keep 0.500 with one averaged loss line.
    import xarray as xr

    model, cfg = tiny
    ds = xr.concat([gate_report(model, cfg, FAST)] * 2, "restart", data_vars="minimal")
    roles = np.zeros(ds.chg_role.shape, dtype=np.int8)  # (restart, layer, head)
    roles[1, 0, 1] = IRRELEVANT
    ds["chg_role"] = (("restart", "layer", "head"), roles)
    majority, agreement = label_agreement(roles)
    ds["role"], ds["agreement"] = (("layer", "head"), majority), (("layer", "head"), agreement)
    gate = np.full(roles.shape, 0.9)
    gate[:, 0, 0] = [1e-4, 1.0]
    ds["contrast_gate"] = (("restart", "layer", "head"), gate)
    loss = np.array([[[3.0, 3.0, 3.2], [2.0, 5.0, 5.0]], [[3.0, 4.0, 4.0], [2.0, 5.0, 5.0]]])
    ds["contrast_loss"] = xr.DataArray(loss, dims=("restart", "side", "state"),
                                       coords={"side": ["retain", "forget"], "state": ["full", "gated", "circuit"]})
    ds.attrs.update(retain="offset_copy", forget="markov")
    header, rows = report_table(ds)
    col = {name: i for i, name in enumerate(header)}
    by_head = {(r[0], r[1]): r for r in rows}
    # "^": the roles set here are not the ones these gates give, so the means shown disagree with them
    means = chg_roles(ds.chg.sel(fit="plus").mean("restart").values, ds.chg.sel(fit="minus").mean("restart").values)
    assert [by_head[("0", "1")][col["label"]], by_head[("0", "0")][col["label"]]] == [
        "facilitating*" + ("^" if means[0, 1] != 0 else ""), "facilitating" + ("^" if means[0, 0] != 0 else "")]
    assert (by_head[("0", "0")][col["keep"]], by_head[("0", "0")][col["k.agree"]]) == ("0.500", "0.50")
    assert (by_head[("1", "1")][col["keep"]], by_head[("1", "1")][col["k.agree"]]) == ("0.900", "1.00")
    lines = report_lines(ds)
    assert ("labels marked *: the restarts tie at 1 head (L0H1), so no role is a majority there; the label shown "
            "is the first tied one in the order facilitating, irrelevant, interfering, inconsistent") in lines
    assert ("contrast retain offset_copy: held-out NLL 3.0000 -> 3.5000 (restarts 3.0000 to 4.0000) gated, "
            "3.6000 (restarts 3.2000 to 4.0000) with only the kept heads (gate >= threshold)") in lines
    assert ("contrast forget markov: held-out NLL 2.0000 -> 5.0000 gated, 5.0000 with only the kept heads "
            "(gate >= threshold)") in lines


def test_report_weights_the_ablation_delta_by_the_mixture_weights():
    # With weights 3:1 the weighted delta is 0.75 d0 + 0.25 d1, not the plain mean over components
    # (which equal weights made indistinguishable): rho and the table's dloss column both read it.
    from scipy.stats import spearmanr

    cfg = from_dict({**TINY, "model": {**TINY["model"], "n_heads": 4},
                     "task": {**TINY["task"], "weights": [3.0, 1.0]}})
    torch.manual_seed(0)
    ds = gate_report(build(cfg, torch.device("cpu")), cfg, FAST)
    delta = ds.delta_loss.values  # (L, H, C)
    weighted = 0.75 * delta[..., 0] + 0.25 * delta[..., 1]
    minus = ds.chg.sel(fit="minus").mean("restart").values
    assert ds.attrs["weights"] == [0.75, 0.25]
    assert ds.attrs["rho"] == pytest.approx(spearmanr(minus.ravel(), weighted.ravel()).statistic)
    # the data are such that the unweighted mean ranks the heads differently
    assert spearmanr(minus.ravel(), delta.mean(-1).ravel()).statistic != pytest.approx(ds.attrs["rho"])
    header, rows = report_table(ds)
    col = header.index("dloss")
    assert [r[col] for r in rows] == [f"{w:+.4f}" for w in weighted.ravel()]


def test_the_table_gives_the_share_of_restarts_on_the_majority_side_of_the_threshold(tiny):
    # Two restarts that both drop a head agree fully (k.agree 1.00), as two that both keep one do;
    # the share keeping it (0.00) would read as total disagreement.
    import xarray as xr

    model, cfg = tiny
    ds = xr.concat([gate_report(model, cfg, FAST)] * 2, "restart", data_vars="minimal")
    gate = np.full(ds.chg_role.shape, 0.9)  # (restart, layer, head)
    gate[:, 1, 0] = 0.1  # dropped by both
    gate[:, 1, 1] = [0.2, 0.8]  # dropped by one, kept by the other
    ds["contrast_gate"] = (("restart", "layer", "head"), gate)
    header, rows = report_table(ds)
    by_head = {(r[0], r[1]): r[header.index("k.agree")] for r in rows}
    assert by_head == {("0", "0"): "1.00", ("0", "1"): "1.00", ("1", "0"): "1.00", ("1", "1"): "0.50"}
    # the fit's own threshold decides the sides: at 0.85 both restarts drop L1H1
    ds.attrs["options"] = {**ds.attrs["options"], "threshold": 0.85}
    header, rows = report_table(ds)
    assert [r[header.index("k.agree")] for r in rows if (r[0], r[1]) == ("1", "1")] == ["1.00"]


def test_a_label_is_unsettled_where_any_restart_left_its_gate_moving(tiny):
    # One restart's G- gate at L1H0 moved 0.5 at the end while the other's stood still: that
    # restart's label, and so the majority, may still change.
    import xarray as xr

    model, cfg = tiny
    ds = xr.concat([gate_report(model, cfg, FAST)] * 2, "restart", data_vars="minimal").assign_coords(restart=[0, 1])
    ds["settle"] = ds.settle * 0.0
    ds["chg"] = ds.chg * 0.0 + 0.9  # every gate 0.4 from the threshold
    ds["settle"].loc[{"restart": 1, "stage": "minus", "layer": 1, "head": 0}] = 0.5
    [labels] = [x for x in report_lines(ds) if x.startswith("convergence of the labels")]
    assert labels.startswith("convergence of the labels: not settled at L1H0 (")


def test_the_contrastive_fit_says_how_settled_its_kept_heads_are(tiny):
    # contrast_settle was saved and never read: a contrastive gate at 0.404 that moved 0.204 over
    # the last tenth stood in the keep column with no word that it could still cross 0.5.
    import xarray as xr

    model, cfg = tiny
    ds = xr.concat([gate_report(model, cfg, FAST)] * 2, "restart", data_vars="minimal")
    gate = np.full((2, 2, 2), 0.9)  # (restart, layer, head): 0.4 from the threshold
    gate[0, 1, 0] = 0.404
    settle = np.zeros_like(gate)
    settle[0, 1, 0] = 0.204
    ds["contrast_gate"] = (("restart", "layer", "head"), gate)
    ds["contrast_settle"] = (("restart", "layer", "head"), settle)
    ds["contrast_loss"] = xr.DataArray(np.full((2, 2, 3), 2.0), dims=("restart", "side", "state"),
                                       coords={"side": ["retain", "forget"], "state": ["full", "gated", "circuit"]})
    ds.attrs.update(retain="offset_copy", forget="markov")
    ds.attrs["options"] = {**ds.attrs["options"], "steps": 200}
    lines = report_lines(ds)
    assert lines[-2:] == [
        "convergence of the contrastive fit: the largest change of any gate over its last 20 of 200 updates: 0.204",
        "convergence of the kept heads: not settled at L1H0 (a contrastive gate moved over its last tenth at least as "
        "far as it now sits from the 0.5 threshold); refit with more --steps"]
    ds["contrast_settle"] = ds.contrast_settle * 0.0 + 0.05  # every gate farther from 0.5 than it moved
    ds["contrast_gate"] = ds.contrast_gate.where(ds.contrast_gate > 0.5, 0.2)
    assert report_lines(ds)[-1] == ("convergence of the kept heads: settled (every contrastive gate sits farther from "
                                    "the 0.5 threshold than it moved over its last tenth)")
    gate = ds.contrast_gate.values.copy()
    gate[1, 0, 1] = np.nan
    ds["contrast_gate"] = (("restart", "layer", "head"), gate)
    assert report_lines(ds)[-2:] == [
        "convergence of the kept heads: undefined at L0H1 (a contrastive gate is not a number: the model's loss was "
        "not finite)",
        "convergence of the kept heads: settled at the other heads (every contrastive gate there sits farther from the "
        "0.5 threshold than it moved over its last tenth)"]
    assert not [x for x in report_lines(ds.drop_vars("contrast_settle"))  # a fit saved before it was recorded
                if x.startswith(("convergence of the contrastive", "convergence of the kept"))]


def test_a_gate_that_is_not_a_number_is_never_called_settled(tiny):
    # NaN gates (a model whose loss is not finite, fitted through the Python API) compared False
    # with their movement, so the report called every label settled.
    model, cfg = tiny
    ds = gate_report(model, cfg, FAST)
    ds["settle"] = ds.settle * 0.0
    ds["chg"] = ds.chg * 0.0 + 0.9  # every gate 0.4 from the threshold, none moving
    ds["chg"].loc[{"fit": "minus", "layer": 0, "head": 1}] = np.nan
    labels = [x for x in report_lines(ds) if x.startswith("convergence of the labels")]
    assert labels == ["convergence of the labels: undefined at L0H1 (a G+ or G- gate is not a number: the model's loss was not finite)",
                      "convergence of the labels: settled at the other heads (every G+ and G- gate there sits farther from the 0.5 "
                      "threshold than it moved over its last tenth)"]
    ds["chg"] = ds.chg.fillna(0.9)
    [labels] = [x for x in report_lines(ds) if x.startswith("convergence of the labels")]
    assert labels.startswith("convergence of the labels: settled (every G+ and G- gate sits farther")
    ds["chg"] = ds.chg * np.nan
    [labels] = [x for x in report_lines(ds) if x.startswith("convergence of the labels")]
    assert labels.startswith("convergence of the labels: undefined at L0H0, L0H1, L1H0, L1H1 (")


def test_report_says_rho_is_undefined_with_two_heads_and_why():
    # One head per layer, two layers: the report printed "Spearman rho(...) = 1.000" (or -1.000).
    cfg = from_dict({**TINY, "model": {**TINY["model"], "n_heads": 1}})
    ds = gate_report(build(cfg, torch.device("cpu")), cfg, FAST)
    [line] = [x for x in report_lines(ds) if x.startswith("Spearman rho")]
    assert line == "Spearman rho(G-, zero-ablation delta) = undefined (2 heads; a rank correlation needs 3 or more)"
    assert np.isnan(ds.attrs["rho"])


def test_report_does_not_call_the_labels_of_one_restart_stable(tiny):
    # With one restart the agreement is 1.00 by construction; it was printed as a measured stability.
    import xarray as xr

    model, cfg = tiny
    ds = gate_report(model, cfg, FAST)
    [line] = [x for x in report_lines(ds) if x.startswith("labels")]
    assert line == "labels: 1 restart, so their stability across restarts is not measured"
    [line] = [x for x in report_lines(xr.concat([ds, ds], "restart", data_vars="minimal")) if x.startswith("labels")]
    assert line == "labels: 2 restarts, mean agreement with the majority 1.00"


def test_report_with_no_lambda_zero_updates_calls_its_nll_the_unfitted_initial_gates(tiny):
    # --init-steps 0: the 'init' stage is the random draw, but its NLL was reported as "lambda=0".
    from dataclasses import replace

    model, cfg = tiny
    logits = torch.linspace(-2.0, 2.0, 4).view(1, 2, 2)
    ds = gate_report(model, cfg, replace(FAST, init_steps=0))
    np.testing.assert_allclose(fit_chg(model, cfg, replace(FAST, init_steps=0), init_logits=logits).chg_init[0],
                               logits[0].sigmoid().numpy(), rtol=1e-6)
    [line] = [x for x in report_lines(ds) if x.startswith("NLL")]
    assert f"unfitted initial gates {float(ds.nll.sel(stage='init').mean()):.4f}," in line and "lambda=0" not in line
    [line] = [x for x in report_lines(gate_report(model, cfg, FAST)) if x.startswith("NLL")]
    assert "lambda=0" in line and "unfitted" not in line


def test_gate_report_refuses_a_run_whose_forward_has_intervention_hooks():
    # Conditioned gates (and hard templates) act through hooks that a loaded checkpoint lacks:
    # the bare model is another network (measured: NLL 2.64 bare against 2.56 as trained).
    for intervene in ({"conditioned_gates": {}},
                      {"templates": {"hard": True, "heads": [{"layer": 0, "head": 0, "pattern": "uniform"}]}}):
        cfg = from_dict({**TINY, "intervene": intervene})
        with pytest.raises(ConfigError, match="forward pass"):
            gate_report(build(cfg, torch.device("cpu")), cfg, FAST)
    soft = from_dict({**TINY, "intervene": {"templates": {"heads": [{"layer": 0, "head": 0, "pattern": "uniform"}]}}})
    assert gate_report(build(soft, torch.device("cpu")), soft, FAST).sizes["restart"] == 1  # losses only: allowed


def test_report_says_where_the_restarts_started_g_plus_and_g_minus_from_one_point(tiny):
    # With clamp_start, a head whose lambda=0 logit ended past the clamp on one side in every
    # restart starts G+ and G- from that bound in each: the restarts then repeat one another
    # there, and "mean agreement 1.00" read as stability the restarts never tested.
    from dataclasses import replace

    import xarray as xr

    model, cfg = tiny
    ds = xr.concat([gate_report(model, cfg, FAST)] * 3, "restart", data_vars="minimal")
    logits = np.array([[[5.0, -6.0], [4.5, 0.3]], [[9.0, -4.2], [4.1, -0.1]], [[30.0, -5.0], [3.0, 1.0]]])
    ds["chg_init"] = (("restart", "layer", "head"), (1.0 / (1.0 + np.exp(-logits))).astype(np.float32))
    shared = [x for x in report_lines(ds) if x.startswith("labels: at")]
    assert shared == ["labels: at 2 of 4 heads (L0H0, L0H1) every restart's lambda=0 fit ended past the clamp "
                      "(|logit| >= 4) on one side, so G+ and G- started from one point in every restart there: "
                      "their restarts differ there only through the other heads' gates, so the agreement at those "
                      "heads tests less than G+ and G- fitted again from different starts"]
    # "the agreement at those heads is the lambda=0 fit's" was said of some heads too, where the
    # other heads' gates still moved a shared head's G- to a tie between restarts (measured)
    ds["chg_init"] = ds.chg_init.where(False, np.float32(0.99))  # logit 4.6 everywhere
    assert [x for x in report_lines(ds) if x.startswith("labels: at every head every restart's")] == [
        "labels: at every head every restart's lambda=0 fit ended past the clamp (|logit| >= 4) on one side, so G+ "
        "and G- started from one point in every restart there: the restarts then repeat one another, so their "
        "agreement is the lambda=0 fit's, not G+ and G- fitted again from different starts"]
    ds.attrs["options"] = {**ds.attrs["options"], "clamp": 5.0}
    assert not [x for x in report_lines(ds) if x.startswith("labels: at")]
    ds.attrs["options"] = {**ds.attrs["options"], "clamp": 4.0, "clamp_start": False}  # unclamped starts differ
    assert not [x for x in report_lines(ds) if x.startswith("labels: at")]
    one = gate_report(model, cfg, replace(FAST, restarts=1))
    one["chg_init"] = one.chg_init.where(False, np.float32(0.99))
    assert not [x for x in report_lines(one) if x.startswith("labels: at")]
