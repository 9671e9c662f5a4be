"""Causal head gating, contrastive CHG and ablations (dynamics.gates).

Unit tests use a tiny untrained model; the validation tests train one small mixture model
once (module fixture) and check CHG against single-head ablation, as Nam et al. 2025
(arXiv 2505.13737) validate it.
"""

import shutil
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import xarray as xr

from dynamics import cli, store
from dynamics.config import ConfigError, from_dict
from dynamics.gates import (
    CHG_ROLES,
    FACILITATING,
    HELDOUT_STEP,
    INCONSISTENT,
    INTERFERING,
    IRRELEVANT,
    UNFITTED,
    GateOptions,
    ablation_losses,
    chg_loss,
    chg_roles,
    chg_snapshot,
    component_weights,
    contrastive_loss,
    fit_chg,
    fit_contrastive,
    gate_report,
    head_ablation,
    head_importance,
    label_agreement,
    parse_contrast,
    pruning_curves,
    rank_agreement,
    report_lines,
    report_table,
    set_ablation,
    tied_majority,
)
from dynamics.limits import MAX_STEPS
from dynamics.tasks import make_batch
from dynamics.train import build, load_run_model, train_run
from tests.conftest import interrupt_at

TINY = {
    "model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16},
    "task": {"name": "mixture", "components": ["offset_copy", "markov"], "delta": 2},
}
FAST = GateOptions(steps=12, init_steps=3, restarts=1, batch_size=4, fit_batches=2, eval_batches=1)


def _hand_nll(model, cfg, steps, batch_size, gates=None, component=None) -> float:
    # Mean next-token NLL over eval-split batches, by a plain forward: what the fits' attrs should equal.
    total = 0.0
    for step in steps:
        tokens = torch.from_numpy(make_batch(cfg, "eval", step, batch_size, component=component).tokens)
        g = None if gates is None else gates.expand(tokens.shape[0], *gates.shape[-2:])
        with torch.no_grad():
            logits = model(tokens[:, :-1], head_gates=g)
        total += F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).item()
    return total / len(steps)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny matmuls: a second intra-op thread only adds contention on the shared cores.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny():
    cfg = from_dict(TINY)
    return build(cfg, torch.device("cpu")), cfg


# ----------------------------------------------------------------------------- conventions


def test_chg_loss_is_nll_minus_lambda_times_mean_clamped_logit():
    logits = torch.tensor([[[-9.0, 0.0], [2.0, 9.0]]], requires_grad=True)  # clamp -> -4, 0, 2, 4: mean 0.5
    nll = torch.tensor([1.0])
    assert chg_loss(nll, logits, 0.1).item() == pytest.approx(0.95)
    assert chg_loss(nll, logits, -0.1).item() == pytest.approx(1.05)
    (grad,) = torch.autograd.grad(chg_loss(nll, logits, 0.1).sum(), [logits])
    # Descent raises logits inside the clamp for lambda > 0 (toward open); none outside.
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.025, -0.025, 0.0])


def test_contrastive_loss_stops_gradient_through_retain_and_clamps_forget():
    lr, lf = torch.tensor([-1.0], requires_grad=True), torch.tensor([-2.0], requires_grad=True)
    z = torch.zeros(1, 1, 1)
    loss = contrastive_loss(lr, lf, z, lam=0.0, max_diff=5.0)
    assert loss.item() == pytest.approx(1.0 + (-2.0 + 1.0))
    g_r, g_f = torch.autograd.grad(loss.sum(), [lr, lf])
    assert g_r.item() == -1.0 and g_f.item() == 1.0  # stopgrad: retain gets only -logp_r's gradient
    far = torch.tensor([-9.0], requires_grad=True)  # 8 nats below retain: past max_diff
    loss = contrastive_loss(lr, far, z, lam=0.0, max_diff=5.0)
    assert loss.item() == pytest.approx(1.0 - 5.0)
    assert torch.autograd.grad(loss.sum(), [far])[0].item() == 0.0


def test_contrastive_regulariser_is_the_mean_of_the_clamped_logits():
    # clamp(logit, -4, 4) of -9, 0, 2, 5 is -4, 0, 2, 4: mean 0.5 (unclamped the mean is -0.5).
    logits = torch.tensor([[[-9.0, 0.0], [2.0, 5.0]]], requires_grad=True)
    lr, lf = torch.tensor([-1.0]), torch.tensor([-2.0])  # -(-1) + (-2 + 1) = 0 before the regulariser
    assert contrastive_loss(lr, lf, logits, lam=0.1).item() == pytest.approx(-0.05)
    (grad,) = torch.autograd.grad(contrastive_loss(lr, lf, logits, lam=0.1).sum(), [logits])
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.025, -0.025, 0.0])  # none outside the clamp


def test_component_weights_are_the_mixture_weights_normalised():
    # The report's weighted ablation delta and head importance are these convex combinations.
    base = {"model": {**TINY["model"], "context": 32}}
    mix = from_dict({**base, "task": {"name": "mixture", "components": ["offset_copy", "markov"], "weights": [3, 1]}})
    assert component_weights(mix).tolist() == [0.75, 0.25]
    equal = from_dict({**base, "task": {"name": "mixture", "components": ["offset_copy", "markov", "induction"]}})
    assert component_weights(equal).tolist() == pytest.approx([1 / 3] * 3)
    assert component_weights(from_dict({**base, "task": {"name": "markov"}})).tolist() == [1.0]


def test_rank_agreement_says_which_side_is_constant():
    # rho is NaN either way; the report prints the reason, so each side must name itself.
    from dynamics.gates.maths import rank_agreement_undefined

    varied, flat = np.array([0.1, 0.5, 0.9]), np.array([0.2, 0.2, 0.2])
    assert rank_agreement_undefined(varied, flat) == "the ablation delta is the same for every head"
    assert rank_agreement_undefined(flat, varied) == "G- is the same for every head"
    assert rank_agreement_undefined(varied, np.array([0.1, np.nan, 0.3])) == (
        "G- or the ablation delta is not finite for some head")
    assert rank_agreement_undefined(varied, varied) is None


def test_positive_lambda_opens_and_negative_lambda_shuts_a_head_that_does_not_matter(tiny):
    model, cfg = tiny
    with torch.no_grad():
        model.blocks[1].attn.W_O[1].zero_()  # head (1, 1) writes nothing: the NLL ignores its gate
    ds = fit_chg(model, cfg, FAST)
    plus, minus = ds.chg.sel(restart=0, layer=1, head=1).values
    assert plus > 0.95 and minus < 0.05
    assert ds.chg_role.sel(restart=0, layer=1, head=1).item() == IRRELEVANT
    assert np.isfinite(ds.nll.values).all()


def test_a_head_the_model_needs_is_facilitating_and_one_that_hurts_is_interfering():
    # One layer, two heads: head 0 is trained to copy (removing it costs nats); head 1 is head 0
    # with W_O = -0.7 W_O[0], so it cancels most of head 0 and removing it lowers the loss.
    # The regulariser is a mean over L * H = 2 heads, so at the default lambda it moves one
    # head's loss by up to 0.1 * 8 / 2 = 0.4 nats and outweighs both; lambda 0.005 keeps it
    # below what either head does to the NLL, and the labels are then the paper's.
    cfg = from_dict({"model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16,
                               "context": 8}, "task": {"name": "offset_copy", "delta": 2}})
    torch.manual_seed(0)
    model = build(cfg, torch.device("cpu"))
    params = model.optim_parameters()
    for step in range(80):  # sign descent: no optimiser to construct (torch.optim imports for seconds)
        tokens = torch.from_numpy(make_batch(cfg, "train", step, 16).tokens)
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        with torch.no_grad():
            for p, g in zip(params, torch.autograd.grad(loss, params), strict=True):
                p -= 0.01 * g.sign()
    attn = model.blocks[0].attn
    with torch.no_grad():
        for w in (attn.W_Q, attn.W_K, attn.W_V):
            w[1] = w[0]
        attn.W_O[1] = -0.7 * attn.W_O[0]
    opts = GateOptions(steps=60, init_steps=10, restarts=2, batch_size=8, fit_batches=2, eval_batches=1, lam=0.005)
    delta = head_ablation(model, cfg, "zero", opts).values[0, :, 0]
    assert delta[0] > 1.0 and delta[1] < -0.05  # the known answer: needed, and harmful
    ds = fit_chg(model, cfg, opts)
    assert ds.role.values[0].tolist() == [FACILITATING, INTERFERING]
    assert ds.agreement.values.min() == 1.0
    plus, minus = ds.chg.mean("restart").values[0].T  # (H,) each
    assert plus[0] > 0.95 and minus[0] > 0.7  # kept open even when pushed shut
    assert plus[1] < 0.4 and minus[1] < 0.05  # shut even when pushed open


def test_taxonomy_from_planted_gates():
    plus = np.array([0.9, 0.9, 0.1, 0.1, np.nan, 0.5])
    minus = np.array([0.9, 0.1, 0.1, 0.9, 0.9, 0.49])
    roles = chg_roles(plus, minus)
    assert roles.dtype == np.int8
    assert roles.tolist() == [FACILITATING, IRRELEVANT, INTERFERING, INCONSISTENT, UNFITTED, IRRELEVANT]
    assert [CHG_ROLES[r] for r in roles[:5]] == ["facilitating", "irrelevant", "interfering", "inconsistent", "unfitted"]
    assert chg_roles(np.array([0.7]), np.array([0.7]), threshold=0.8).tolist() == [INTERFERING]


def test_label_agreement_is_the_majority_share():
    roles = np.array([[0, 1, -1], [0, 2, -1], [0, 2, -1], [1, 2, -1]])  # 4 restarts x 3 heads
    majority, agreement = label_agreement(roles)
    assert majority.tolist() == [0, 2, -1]
    assert agreement[:2].tolist() == pytest.approx([0.75, 0.75]) and np.isnan(agreement[2])
    # a share of the restarts that fitted the head: an unfitted one (-1) does not vote
    majority, agreement = label_agreement(np.array([[0], [0], [-1], [1]]))
    assert majority.tolist() == [0] and agreement.tolist() == pytest.approx([2 / 3])


def test_a_tie_is_where_two_roles_share_the_top_count():
    roles = np.array([[0, 1, 2, -1], [1, 1, 2, -1], [2, 0, 3, -1], [3, 0, 3, -1]])  # 4 restarts x 4 heads
    assert tied_majority(roles).tolist() == [True, True, True, False]  # 1-1-1-1, 2-2, 2-2; none fitted
    assert tied_majority(roles[:3]).tolist() == [True, False, False, False]  # 1-1-1; 2-1; 2-1


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
    assert [by_head[("0", "1")][col["label"]], by_head[("0", "0")][col["label"]]] == ["facilitating*", "facilitating"]
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


def test_rank_agreement_is_undefined_below_three_heads_and_where_a_side_is_constant():
    # Two heads rank (1, 2) on both sides: rho was +-1 whatever the fits, printed as 1.000.
    assert np.isnan(rank_agreement(np.array([0.1, 0.9]), np.array([0.2, 0.3])))
    assert np.isnan(rank_agreement(np.array([0.5, 0.5, 0.5]), np.array([0.1, 0.2, 0.3])))
    assert rank_agreement(np.array([0.1, 0.5, 0.9]), np.array([0.2, 0.3, 0.1])) == pytest.approx(-0.5)
    # ranks, not values: one outlying delta leaves the order, and rho, at 1 (Pearson's r: 0.80)
    assert rank_agreement(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, 3.0, 100.0])) == pytest.approx(1.0)


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


def test_optimise_returns_each_gates_change_over_the_last_tenth_of_updates():
    # A constant gradient of -1 makes each bias-corrected Adam update exactly +lr (clipping off),
    # so after 20 updates every logit is 20 lr and moved 2 lr over the last tenth (2 updates).
    from dataclasses import replace

    from dynamics.gates._engine import _optimise

    opts = replace(FAST, lr=0.1, grad_clip=0.0)
    logits, settle = _optimise(torch.zeros(3, 2, 2), 20, opts, lambda lg, step: -lg.flatten(1).sum(1))
    np.testing.assert_allclose(logits.numpy(), 2.0, rtol=1e-5)
    expected = torch.sigmoid(torch.tensor(2.0)) - torch.sigmoid(torch.tensor(1.8))
    np.testing.assert_allclose(settle.numpy(), expected.item(), rtol=1e-4)
    _, none = _optimise(torch.zeros(3, 2, 2), 0, opts, lambda lg, step: -lg.flatten(1).sum(1))
    assert none.shape == (3, 2, 2) and not none.any()  # no updates: nothing moved


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


def test_batched_restarts_equal_sequential_fits_from_the_same_init(tiny):
    model, cfg = tiny
    init = torch.randn(3, 2, 2, generator=torch.Generator().manual_seed(0)) * 2
    opts = GateOptions(steps=6, init_steps=4, batch_size=4, fit_batches=2, eval_batches=1)
    batched = fit_chg(model, cfg, opts, init_logits=init)
    assert batched.sizes["restart"] == 3
    for i in range(3):
        alone = fit_chg(model, cfg, opts, init_logits=init[i : i + 1])
        for name in ("chg", "chg_init", "nll"):
            np.testing.assert_allclose(batched[name].values[i], alone[name].values[0], atol=1e-5, rtol=1e-4)


def test_chg_snapshot_is_deterministic_and_leaves_training_state_alone(tiny):
    model, cfg = tiny
    tokens = torch.randint(0, 16, (4, 17), generator=torch.Generator().manual_seed(1))
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    weights = [p.detach().clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    opts = GateOptions(restarts=1, init_steps=2, batch_size=4, fit_batches=1, eval_batches=1)
    with torch.no_grad():  # the recorder's context
        chg, role = chg_snapshot(model, cfg, steps=3, options=opts)
    assert chg.shape == (2, 2, 2) and chg.dtype == np.float32 and role.shape == (2, 2) and role.dtype == np.int8
    assert np.isfinite(chg).all() and set(role.ravel()) <= {0, 1, 2, 3}
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
    assert torch.equal(torch.get_rng_state(), rng)
    again, role_again = chg_snapshot(model, cfg, steps=3, options=opts)
    np.testing.assert_array_equal(chg, again)
    np.testing.assert_array_equal(role, role_again)


def test_chg_snapshot_of_several_restarts_is_their_mean_and_majority(tiny):
    from dataclasses import replace

    model, cfg = tiny
    opts = GateOptions(restarts=3, init_steps=2, steps=3, batch_size=4, fit_batches=1, eval_batches=1)
    chg, role = chg_snapshot(model, cfg, steps=3, options=opts)
    fits = fit_chg(model, cfg, replace(opts, steps=3))
    assert fits.sizes["restart"] == 3 and np.ptp(fits.chg.values, axis=0).max() > 0  # restarts that differ
    np.testing.assert_allclose(chg, fits.chg.mean("restart").transpose("layer", "head", "fit").values, rtol=1e-6)
    np.testing.assert_array_equal(role, label_agreement(fits.chg_role.values)[0])


def test_ablating_a_head_whose_W_O_is_zero_changes_nothing(tiny):
    model, cfg = tiny
    with torch.no_grad():
        model.blocks[0].attn.W_O[1].zero_()
    opts = GateOptions(batch_size=4, eval_batches=2)
    for method in ("zero", "mean"):
        delta = head_ablation(model, cfg, method, opts)
        assert delta.dims == ("layer", "head", "component")
        assert list(delta.component.values) == ["offset_copy", "markov"]
        assert np.abs(delta.sel(layer=0, head=1).values).max() < 1e-6, method
        assert np.abs(delta.values).max() > 1e-4, method  # the other heads do something
    sets = np.zeros((2, 2, 2), dtype=bool)
    sets[1, 0, 1] = True
    assert np.abs(set_ablation(model, cfg, sets, "mean", opts).values).max() < 1e-6


def test_head_importance_is_the_per_sequence_absolute_gate_gradient_normalised_within_each_layer(tiny):
    # The guide's I_h = E_x |dL(x)/dxi_h| / l2 norm within the layer. The pruning curves'
    # "importance" order was the single-head ablation delta instead.
    from dynamics.gates._engine import _batches

    model, cfg = tiny
    with torch.no_grad():
        model.blocks[0].attn.W_O[1].zero_()  # writes nothing: no gradient reaches its gate
    opts = GateOptions(batch_size=3, eval_batches=2)
    imp = head_importance(model, cfg, opts)
    assert imp.dims == ("layer", "head")
    raw = np.zeros((2, 2))
    for name, weight in zip(cfg.task.component_names, component_weights(cfg), strict=True):
        rows = _batches(cfg, HELDOUT_STEP, 2, 3, "cpu", name).flatten(0, 1)  # (6, T + 1)
        for row in rows:  # one sequence at a time: the expectation over x of |dL(x)/dxi|
            xi = torch.ones(2, 2, requires_grad=True)
            loss = F.cross_entropy(model(row[None, :-1], head_gates=xi)[0], row[1:])
            raw += weight * torch.autograd.grad(loss, [xi])[0].abs().numpy() / len(rows)
    np.testing.assert_allclose(imp.attrs["raw"], raw, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(imp.values, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-4, atol=1e-7)
    assert imp.values[0, 1] == 0 and imp.values[0, 0] == pytest.approx(1.0)
    assert all(p.grad is None for p in model.parameters())  # the model stays untouched


def test_contrastive_losses_are_held_out_nll_full_gated_and_thresholded(tiny):
    # Updates of lr 1e-9 leave the gates at sigmoid(+-2) = 0.88 / 0.12: "gated" is the held-out
    # NLL with those gates, "circuit" the NLL with them binarised at the 0.5 threshold (1 / 0),
    # "full" with every gate 1; all three on held-out batches from HELDOUT_STEP.
    model, cfg = tiny
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_O.mul_(20.0)  # heads that matter, so the three states differ clearly
    init = torch.tensor([[[2.0, -2.0], [-2.0, 2.0]]])  # (restart, layer, head)
    opts = GateOptions(steps=1, lr=1e-9, restarts=1, batch_size=4, fit_batches=1, eval_batches=2)
    ds = fit_contrastive(model, cfg, "offset_copy", "markov", opts, init_logits=init)
    held = [HELDOUT_STEP, HELDOUT_STEP + 1]
    for side, name in (("retain", "offset_copy"), ("forget", "markov")):
        loss = ds.contrast_loss.sel(restart=0, side=side)
        want = {"full": _hand_nll(model, cfg, held, 4, component=name),
                "gated": _hand_nll(model, cfg, held, 4, init.sigmoid(), component=name),
                "circuit": _hand_nll(model, cfg, held, 4, (init > 0).float(), component=name)}
        assert min(abs(want["full"] - want["gated"]), abs(want["gated"] - want["circuit"])) > 1e-2
        assert {s: loss.sel(state=s).item() for s in want} == pytest.approx(want, rel=1e-5)


def test_contrastive_fit_stops_pushing_forget_past_max_diff(tiny):
    # Adam's first update moves each logit by lr * sign(gradient). Where the forget NLL already
    # exceeds the retain NLL by more than max_diff, the forget term is clamped and only
    # -logp_retain and the regulariser pull: the update follows the retain gradient alone.
    model, cfg = tiny
    init = torch.tensor([[[0.5, -0.5], [1.0, 0.0]]])  # (restart, layer, head)
    batches = {n: torch.from_numpy(make_batch(cfg, "eval", 0, 4, component=n).tokens) for n in ("offset_copy", "markov")}

    def nll_and_grad(name):
        x = init.clone().requires_grad_(True)
        b = batches[name]
        logits = model(b[:, :-1], head_gates=x.sigmoid().expand(b.shape[0], 2, 2))
        loss = F.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten())
        return loss.item(), torch.autograd.grad(loss, [x])[0]

    (nll_a, grad_a), (nll_b, grad_b) = nll_and_grad("offset_copy"), nll_and_grad("markov")
    # retain the component the initial gates already fit better, so the forget term starts clamped
    (retain, g_r, nll_r), (forget, g_f, nll_f) = sorted(
        [("offset_copy", grad_a, nll_a), ("markov", grad_b, nll_b)], key=lambda x: x[2])
    max_diff, lam = 1e-4, 0.1
    assert nll_f - nll_r > max_diff
    g = g_r - lam / 4  # d(-lambda * mean(logit)) / d logit, all inside the clamp
    assert ((g - g_f).sign() != g.sign()).any()  # the unclamped forget term would turn some update
    opts = GateOptions(steps=1, lr=0.1, restarts=1, batch_size=4, fit_batches=1, eval_batches=1, lam=lam,
                       max_diff=max_diff)
    ds = fit_contrastive(model, cfg, retain, forget, opts, init_logits=init)
    want = torch.sigmoid(init - 0.1 * g.sign())
    np.testing.assert_allclose(ds.contrast_gate.values, want.numpy(), rtol=1e-5)


def test_parse_contrast_names_the_bad_component():
    cfg = from_dict(TINY)
    assert parse_contrast("retain=markov, forget=offset_copy", cfg) == ("markov", "offset_copy")
    with pytest.raises(ConfigError, match="induction"):
        parse_contrast("retain=induction,forget=markov", cfg)
    for bad in ("retain=markov", "keep=markov,forget=offset_copy", "retain=markov,forget=markov"):
        with pytest.raises(ConfigError):
            parse_contrast(bad, cfg)
    with pytest.raises(ConfigError, match="gates.steps"):
        GateOptions(steps=0)


def test_options_of_the_wrong_type_are_named():
    # steps=2.5 was accepted and failed inside the fit; steps="5" with a bare TypeError
    for key, bad, kind in (("steps", 2.5, "an integer"), ("steps", "5", "an integer"), ("restarts", 2.0, "an integer"),
                           ("seed", 1.5, "an integer"), ("lam", "0.1", "a number"), ("clamp_start", 1, "true or false")):
        with pytest.raises(ConfigError, match=f"^gates.{key}: expected {kind}, got {bad!r}$"):
            GateOptions(**{key: bad})
    assert GateOptions(steps=np.int64(3), lam=np.float32(0.5), init_steps=None).steps == 3


def test_fits_refuse_a_model_of_another_config_and_a_float64_default(tiny):
    # The model's own data would have been another task's: plausible numbers, or an IndexError
    # deep in the embedding; under a float64 default, a dtype mismatch inside the forward.
    from dataclasses import replace

    model, cfg = tiny
    other = replace(cfg, model=replace(cfg.model, vocab_size=32))
    for call in (lambda: fit_chg(model, other, FAST), lambda: head_importance(model, other, FAST),
                 lambda: ablation_losses(model, other, np.zeros((2, 2), bool), options=FAST),
                 lambda: fit_contrastive(model, other, "markov", "offset_copy", FAST)):
        with pytest.raises(ConfigError, match=r"the model was built from another config than cfg.model "
                                              r"\(vocab_size 16 in the model, 32 in cfg\)"):
            call()
    with pytest.raises(ConfigError, match="retain and forget are both 'markov'"):
        fit_contrastive(model, cfg, "markov", "markov", FAST)
    with pytest.raises(ConfigError, match="gates.steps: must be positive, got 0"):
        chg_snapshot(model, cfg, steps=0)  # read as "the default", 200 updates
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(RuntimeError, match="torch's default dtype is torch.float64"):
            head_importance(model, cfg, FAST)
    finally:
        torch.set_default_dtype(torch.float32)


def test_fits_run_under_a_callers_inference_mode(tiny):
    # "element 0 of tensors does not require grad": torch.enable_grad does not leave inference_mode
    model, cfg = tiny
    want = head_importance(model, cfg, FAST)
    want_chg = fit_chg(model, cfg, FAST)
    with torch.inference_mode():
        got = head_importance(model, cfg, FAST)
        got_chg = fit_chg(model, cfg, FAST)
    xr.testing.assert_identical(got, want)
    xr.testing.assert_identical(got_chg, want_chg)


def test_an_absurd_restart_count_is_refused_before_the_fit():
    # Restarts are one batch: --restarts 1000000 asked for 32 GB at the first forward, a traceback
    assert GateOptions(restarts=256).restarts == 256
    with pytest.raises(ConfigError) as e:
        GateOptions(restarts=10**6)
    assert str(e.value) == "gates.restarts: must be at most 256 (fitted as one batch), got 1000000"


def test_counts_past_the_step_limit_and_a_lambda_float32_cannot_hold_are_refused():
    # --steps 10**13 ran until killed; --lam 1e39 raised a traceback from torch.full after the first stage
    for key in ("steps", "init_steps"):
        assert getattr(GateOptions(**{key: MAX_STEPS}), key) == MAX_STEPS
        with pytest.raises(ConfigError, match=f"^gates.{key}: must be .*{MAX_STEPS:,}"):
            GateOptions(**{key: MAX_STEPS + 1})
    assert GateOptions(lam=3.4e38).lam == 3.4e38
    with pytest.raises(ConfigError, match=r"^gates.lam: must be at most 3.403e\+38 \(float32\), got 1e\+39$"):
        GateOptions(lam=1e39)


# ----------------------------------------------------------------------------- a trained model

TRAINED = {
    "model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_mlp": 64, "vocab_size": 32, "context": 32},
    "task": {"name": "mixture", "components": ["offset_copy", "markov"], "delta": 2, "p": 0.9},
    "train": {"steps": 250, "lr": 1e-2, "batch_size": 32, "warmup_steps": 20, "eval_batches": 1},
    "record": {"dense_until": 0, "every": 1000, "n_probe": 1, "head_weights": "off", "eval_batch_size": 16},
}
REPORT = GateOptions(steps=120, init_steps=10, restarts=2, batch_size=16, fit_batches=4, eval_batches=2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    path = str(tmp_path_factory.mktemp("gates") / "s.zarr")
    result = train_run(from_dict(TRAINED), path)
    assert result.status == "completed"
    model, cfg, _ = load_run_model(path, result.run_id)
    return path, result.run_id, model, cfg


@pytest.fixture(scope="module")
def report(trained):
    _, _, model, cfg = trained
    return gate_report(model, cfg, REPORT)


def test_chg_agrees_with_single_head_ablation(trained, report):
    _, _, model, cfg = trained
    minus = report.chg.sel(fit="minus").mean("restart").values
    plus = report.chg.sel(fit="plus").mean("restart").values
    delta = (report.delta_loss.values * component_weights(cfg)).sum(-1)  # (L, H)
    rho = report.attrs["rho"]
    print(f"\nG-:\n{minus.round(3)}\nablation delta:\n{delta.round(3)}\nSpearman rho = {rho:.3f}")
    assert rho >= 0.7
    # The robust part of the agreement: every head G- shuts costs less to ablate than any it keeps.
    shut = minus < 0.05
    assert shut.any() and (~shut).any()
    assert delta[shut].max() < delta[~shut].min()

    curves = pruning_curves(model, cfg, plus, minus, delta, n_random=6, options=REPORT)
    loss = curves.loss
    print("pruning loss (chg, importance, ablation, random):\n", loss.values.round(3))
    inner = slice(1, -1)  # all heads kept / all removed are the same model in every order
    assert (loss.sel(order="chg")[inner] < loss.sel(order="random")[inner]).all()
    np.testing.assert_allclose(loss.values[:, 0], loss.values[0, 0], rtol=1e-6)
    np.testing.assert_allclose(loss.values[:, -1], loss.values[0, -1], rtol=1e-6)
    order = np.argsort(head_importance(model, cfg, REPORT).values.ravel(), kind="stable")
    assert curves.order_heads.sel(order="importance").values.tolist() == order.tolist()
    assert curves.order_heads.sel(order="ablation").values.tolist() == np.argsort(delta.ravel(), kind="stable").tolist()
    with pytest.raises(ConfigError, match="n_random"):
        pruning_curves(model, cfg, plus, minus, delta, n_random=0, options=REPORT)
    # Labelled input is read by its dims: transposed, the same orders; a per-component delta is refused.
    named = xr.DataArray(minus, dims=("layer", "head")).transpose("head", "layer")
    again = pruning_curves(model, cfg, plus, named, delta, n_random=1, options=REPORT)
    assert again.order_heads.sel(order="chg").values.tolist() == curves.order_heads.sel(order="chg").values.tolist()
    with pytest.raises(ValueError, match="delta must be one value per head"):
        pruning_curves(model, cfg, plus, minus, report.delta_loss.values, n_random=1, options=REPORT)


def test_report_names_the_heads_whose_labels_a_fit_left_unsettled(report):
    # A fit stopped while its gates still moved gave labels with no sign they were provisional.
    from dynamics.gates.maths import unsettled

    assert unsettled(np.array([0.55, 0.9, 0.5]), np.array([0.1, 0.1, 0.0]), 0.5).tolist() == [True, False, True]
    ds = report  # the trained model's fit, shared with the tests around it
    assert ds.settle.dims == ("restart", "stage", "layer", "head")
    [fits] = [x for x in report_lines(ds) if x.startswith("convergence of the fits")]
    moved = ds.settle.max(("restart", "layer", "head"))
    assert f"{float(moved.sel(stage='minus')):.3f} (G-, last 12 of 120 updates)" in fits
    assert "(lambda=0, last 1 of 10 updates)" in fits
    calm = ds.copy(deep=True)
    calm["settle"] = calm.settle * 0.0
    calm["chg"] = calm.chg * 0.0 + 0.9  # every gate 0.4 from the threshold, and none moved
    assert [x for x in report_lines(calm) if x.startswith("convergence of the labels")] == [
        "convergence of the labels: settled (every G+ and G- gate sits farther from the 0.5 threshold than it "
        "moved over its last tenth)"]
    calm["settle"].loc[{"stage": "minus", "layer": 1, "head": 0}] = 0.5  # one G- gate moved 0.5 at the end
    [labels] = [x for x in report_lines(calm) if x.startswith("convergence of the labels")]
    assert labels.startswith("convergence of the labels: not settled at L1H0 (")
    calm["settle"].loc[{"stage": "minus"}] = 0.0
    calm["settle"].loc[{"stage": "init"}] = 0.5  # the lambda = 0 stage labels nothing
    [labels] = [x for x in report_lines(calm) if x.startswith("convergence of the labels")]
    assert labels.startswith("convergence of the labels: settled")


def test_contrastive_fit_keeps_retain_and_raises_forget(trained):
    _, _, model, cfg = trained
    opts = GateOptions(steps=60, restarts=1, batch_size=16, fit_batches=4, eval_batches=2)
    ds = fit_contrastive(model, cfg, "offset_copy", "markov", opts)
    loss = ds.contrast_loss.sel(restart=0)
    full_r, gated_r = loss.sel(side="retain", state="full").item(), loss.sel(side="retain", state="gated").item()
    full_f, gated_f = loss.sel(side="forget", state="full").item(), loss.sel(side="forget", state="gated").item()
    print(f"\nretain offset_copy {full_r:.3f} -> {gated_r:.3f}; forget markov {full_f:.3f} -> {gated_f:.3f}")
    print("gates:", ds.contrast_gate.values.round(3).tolist())
    assert gated_r < full_r + 0.1
    assert gated_f > full_f + 0.3


def test_cli_gates_prints_a_table_and_saves_the_fit(trained, capsys):
    path, run_id, _, _ = trained
    assert cli.main(["gates", path, "--steps", "4", "--init-steps", "2", "--restarts", "1"]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    # Progress on stderr, each stage from its start to its end: the table alone is on stdout.
    err = captured.err.splitlines()
    for stage, total, unit in (("lambda=0", 2, "updates"), ("G+/G-", 4, "updates"), ("ablation", 1, "passes")):
        assert f"[gates {run_id}] {stage}: 0/{total} {unit}" in err and f"[gates {run_id}] {stage}: {total}/{total} {unit}" in err
    header = out[1].split()
    assert header[:5] == ["layer", "head", "G+", "G-", "label"] and "dloss" in header
    rows = [line.split() for line in out[2:10]]
    assert [(r[0], r[1]) for r in rows] == [(str(layer), str(head)) for layer in range(2) for head in range(4)]
    assert all(r[4] in CHG_ROLES for r in rows)
    saved = store.open_derived(path, f"gates.{run_id}")
    assert saved is not None and saved.chg.dims == ("restart", "layer", "head", "fit")
    assert saved.attrs["step"] == store.run_attrs(path, run_id)["checkpoint_step"]  # where the report puts it


def test_cli_gates_unknown_component_exits_2(trained, capsys):
    path, _, _, _ = trained
    code = cli.main(["gates", path, "--contrast", "retain=induction,forget=offset_copy", "--no-save"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "induction" in err[0]


def test_cli_gates_run_without_checkpoint_exits_2(trained, tmp_path, capsys):
    path, run_id, _, _ = trained
    copy = tmp_path / "copy.zarr"
    shutil.copytree(path, copy)
    shutil.rmtree(copy / "checkpoints")
    code = cli.main(["gates", str(copy), "--run", run_id, "--no-save"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "checkpoint" in err[0]


def test_cli_gates_refuses_a_model_whose_loss_is_not_finite(tmp_path, capsys, one_thread):
    # init_scale 1e30: finite float32 weights whose forward pass overflows, so the run diverges at
    # step 0; every gate and NLL fitted to it would be NaN, and was saved as a result.
    raw = {**TRAINED, "model": {**TRAINED["model"], "init_scale": 1e30}, "train": {**TRAINED["train"], "steps": 5}}
    path = str(tmp_path / "d.zarr")
    result = train_run(from_dict(raw), path)
    assert result.status == "diverged"
    code = cli.main(["gates", path, "--steps", "2", "--init-steps", "1", "--restarts", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert f"run {result.run_id} (diverged) at its checkpoint step 0 gives a loss of nan" in err[0]
    assert store.open_derived(path, f"gates.{result.run_id}") is None


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


def test_chg_recorded_on_a_diverging_run_is_unfitted_without_warnings(tmp_path, one_thread):
    # The run diverges at step 0 and its snapshot fits CHG to a NaN model: the record says
    # unfitted (NaN gates, role -1) and the run is 'diverged'. numpy's empty-slice warning on the
    # all-NaN agreement made it 'failed' wherever warnings are errors (as in the CLI tests).
    raw = {**TRAINED, "model": {**TRAINED["model"], "init_scale": 1e30}, "train": {**TRAINED["train"], "steps": 5},
           "record": {**TRAINED["record"], "chg_every": 1, "chg_steps": 2}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = train_run(from_dict(raw), str(tmp_path / "d.zarr"))
    assert result.status == "diverged"
    ds = store.open_run(str(tmp_path / "d.zarr"))
    assert np.isnan(ds.chg.values[0]).all() and (ds.chg_role.values[0] == UNFITTED).all()


def test_cli_gates_on_an_unfinished_run_says_so_on_stderr(tmp_path, capsys, one_thread):
    # The table alone is on stdout; the note that the fit is of a checkpoint, not a finished model, is not.
    raw = {**TRAINED, "train": {**TRAINED["train"], "steps": 40}, "record": {**TRAINED["record"], "every": 10}}
    path = str(tmp_path / "u.zarr")

    with pytest.raises(KeyboardInterrupt):
        train_run(from_dict(raw), path, progress=interrupt_at(25))
    assert cli.main(["gates", path, "--steps", "2", "--init-steps", "1", "--restarts", "1", "--no-save"]) == 0
    captured = capsys.readouterr()
    assert "is interrupted; these gates are fitted to its checkpoint at step 30 of 40" in captured.err
    assert "note:" not in captured.out


def test_cli_gates_says_when_this_machine_makes_other_data_than_the_run_trained_on(trained, capsys):
    # On the corpus task another machine's standard library is other data: the fit uses this one's.
    path, run_id, _, _ = trained
    recorded = store.run_attrs(path, run_id)["data_hash"]
    store.update_run_attrs(path, run_id, data_hash="0" * 64)
    try:
        assert cli.main(["gates", path, "--steps", "2", "--init-steps", "1", "--restarts", "1", "--no-save"]) == 0
    finally:
        store.update_run_attrs(path, run_id, data_hash=recorded)
    err = capsys.readouterr().err
    assert "this machine makes other data" in err and "000000000000 recorded" in err
    assert cli.main(["gates", path, "--steps", "2", "--init-steps", "1", "--restarts", "1", "--no-save"]) == 0
    assert "other data" not in capsys.readouterr().err
