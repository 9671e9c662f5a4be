"""Known answers for causal head gating across dynamics.gates (the G+/G- fits, the contrastive
fit and circuit, pruning order, the report's table and settle checks): each pins a definition
that a mutant changed while the rest of the suite still passed (a mutation audit's). The fits are
checked against a plain reference fit written here (torch.optim.Adam on one gate set)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dynamics.config import from_dict
from dynamics.gates import GateOptions, fit_chg
from dynamics.tasks import make_batch
from dynamics.train import build
from tests.test_gates import one_thread  # noqa: F401 - the module-scoped autouse fixture

TINY = {
    "model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16},
    "task": {"name": "mixture", "components": ["offset_copy", "markov"], "delta": 2},
}


@pytest.fixture
def tiny():
    cfg = from_dict(TINY)
    torch.manual_seed(0)
    return build(cfg, torch.device("cpu")), cfg


def _reference_fit(model, cfg, logits0, lam, steps, opts):
    # The paper's fit written plainly: Adam (torch.optim.Adam, lr 1) on the logits of ONE gate set,
    # loss = NLL - lam * mean(clamp(logit, -4, 4)), gradient clipped to norm 1 with
    # torch.nn.utils.clip_grad_norm_, update s on eval batch s mod fit_batches.
    logits = logits0.detach().clone().requires_grad_(True)
    adam = torch.optim.Adam([logits], lr=opts.lr)
    for step in range(steps):
        tokens = torch.from_numpy(make_batch(cfg, "eval", step % opts.fit_batches, opts.batch_size).tokens)
        g = logits.sigmoid().expand(tokens.shape[0], *logits.shape[1:])
        out = model(tokens[:, :-1], head_gates=g)
        nll = F.cross_entropy(out.flatten(0, 1), tokens[:, 1:].flatten())
        loss = nll - lam * logits.clamp(-opts.clamp, opts.clamp).mean()
        adam.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([logits], opts.grad_clip)
        adam.step()
    return logits.detach()


def test_g_plus_and_g_minus_are_the_plain_fits_at_plus_and_minus_lambda(tiny):
    # Pins G- to exactly -lambda (a G- fitted at -2 lambda survived every other test: Adam is
    # scale-free, so only a head whose NLL pulls against the regulariser tells the two apart) and
    # G+ to +lambda, both started from the lambda = 0 fit clamped to [-4, 4]. lambda 0.5 makes the
    # regulariser comparable to the NLL gradient of this untrained model.
    model, cfg = tiny
    opts = GateOptions(steps=8, init_steps=4, restarts=1, batch_size=4, fit_batches=2, eval_batches=1, lam=0.5)
    init = torch.tensor([[[1.0, -0.5], [0.3, 2.0]]])
    ds = fit_chg(model, cfg, opts, init_logits=init)
    zero = _reference_fit(model, cfg, init, 0.0, opts.init_steps, opts)
    start = zero.clamp(-opts.clamp, opts.clamp)
    plus = _reference_fit(model, cfg, start, opts.lam, opts.steps, opts).sigmoid()[0]
    minus = _reference_fit(model, cfg, start, -opts.lam, opts.steps, opts).sigmoid()[0]
    np.testing.assert_allclose(ds.chg_init.values[0], zero.sigmoid()[0].numpy(), atol=2e-5)
    np.testing.assert_allclose(ds.chg.sel(fit="plus").values[0], plus.numpy(), atol=2e-5)
    np.testing.assert_allclose(ds.chg.sel(fit="minus").values[0], minus.numpy(), atol=2e-5)


def test_fit_labels_use_the_options_threshold(tiny):
    # chg_role must threshold at options.threshold, not the 0.5 default (a fit calling chg_roles
    # without it survived). lr 1e-9 leaves G+ = G- = the planted gates 0.6, 0.8, 0.3, 0.9: at 0.7
    # they are low, high, low, high on both sides -> interfering, facilitating, interfering, facilitating.
    model, cfg = tiny
    gates = torch.tensor([[[0.6, 0.8], [0.3, 0.9]]])
    opts = GateOptions(init_steps=0, steps=1, lr=1e-9, restarts=1, batch_size=4, fit_batches=1, eval_batches=1,
                       threshold=0.7)
    ds = fit_chg(model, cfg, opts, init_logits=torch.logit(gates))
    assert ds.chg_role.values[0].tolist() == [[2, 0], [2, 0]]
    assert ds.role.values.tolist() == [[2, 0], [2, 0]]


def test_contrastive_restarts_fitted_together_equal_each_fitted_alone(tiny):
    # Each gate set's retain and forget NLL must be its own rows: reading the (set, group) NLLs
    # group-major gave set 0 set 1's retain NLL as its forget NLL, which one restart alone cannot show.
    from dynamics.gates import fit_contrastive

    model, cfg = tiny
    init = torch.tensor([[[1.0, -0.5], [0.3, 2.0]], [[-1.5, 0.5], [2.5, -0.2]]])
    opts = GateOptions(steps=5, batch_size=4, fit_batches=2, eval_batches=1)
    both = fit_contrastive(model, cfg, "offset_copy", "markov", opts, init_logits=init)
    for i in range(2):
        alone = fit_contrastive(model, cfg, "offset_copy", "markov", opts, init_logits=init[i : i + 1])
        np.testing.assert_allclose(both.contrast_gate.values[i], alone.contrast_gate.values[0], atol=1e-5)


def test_pruning_order_breaks_g_minus_ties_by_g_plus_ascending():
    # Docstring: G- ascending, ties by G+ ascending (interfering, low G+, before irrelevant).
    # G- ties at 0.2 for heads 0 and 1 -> head 1 (G+ 0.1) first; head 2 (G- 0.9) last; head 3 (G- 0.05) first.
    from dynamics.gates.pruning import pruning_order

    plus = np.array([[0.9, 0.1], [0.5, 0.5]])
    minus = np.array([[0.2, 0.2], [0.9, 0.05]])
    assert pruning_order(plus, minus).tolist() == [3, 1, 0, 2]


def _held_out_nll(model, cfg, opts, component, gates):
    # Mean held-out NLL by a plain forward: eval-split batches HELDOUT_STEP .. + eval_batches - 1.
    from dynamics.gates.options import HELDOUT_STEP

    total = 0.0
    for i in range(opts.eval_batches):
        tokens = torch.from_numpy(make_batch(cfg, "eval", HELDOUT_STEP + i, opts.batch_size, component=component).tokens)
        with torch.no_grad():
            out = model(tokens[:, :-1], head_gates=gates.expand(tokens.shape[0], *gates.shape[-2:]))
        total += F.cross_entropy(out.flatten(0, 1), tokens[:, 1:].flatten()).item()
    return total / opts.eval_batches


def test_contrastive_circuit_is_the_heads_at_or_above_the_options_threshold(tiny):
    # The sub-circuit is gate >= options.threshold (docstring, README): at 0.8 the planted gates
    # 0.6, 0.9, 0.6, 0.9 keep heads (0, 1) and (1, 1) only; hard-coding 0.5 kept all four.
    # lr 1e-9 leaves the gates where they were planted.
    from dynamics.gates import fit_contrastive

    model, cfg = tiny
    gates = torch.tensor([[[0.6, 0.9], [0.6, 0.9]]])
    opts = GateOptions(steps=1, lr=1e-9, batch_size=4, fit_batches=1, eval_batches=1, threshold=0.8)
    ds = fit_contrastive(model, cfg, "offset_copy", "markov", opts, init_logits=torch.logit(gates))
    circuit = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])
    for side in ("offset_copy", "markov"):
        got = ds.contrast_loss.sel(side="retain" if side == "offset_copy" else "forget", state="circuit").item()
        assert got == pytest.approx(_held_out_nll(model, cfg, opts, side, circuit), rel=1e-5)


def test_contrastive_circuit_keeps_a_gate_exactly_at_the_threshold(tiny):
    # gate >= threshold is kept: logits 0 give gates of exactly 0.5 (lr 1e-9 cannot move them in
    # float32), so the circuit is the whole model and its loss the full model's; '>' dropped every head.
    from dynamics.gates import fit_contrastive

    model, cfg = tiny
    opts = GateOptions(steps=1, lr=1e-9, batch_size=4, fit_batches=1, eval_batches=1)
    ds = fit_contrastive(model, cfg, "offset_copy", "markov", opts, init_logits=torch.zeros(1, 2, 2))
    assert (ds.contrast_gate.values == 0.5).all()
    full = _held_out_nll(model, cfg, opts, "offset_copy", torch.ones(1, 2, 2))
    assert ds.contrast_loss.sel(side="retain", state="circuit").item() == pytest.approx(full, rel=1e-5)


def _report_ds(model, cfg):
    import xarray as xr

    from dynamics.gates import gate_report

    opts = GateOptions(steps=12, init_steps=3, restarts=1, batch_size=4, fit_batches=2, eval_batches=1)
    return xr.concat([gate_report(model, cfg, opts)] * 2, "restart", data_vars="minimal").assign_coords(restart=[0, 1])


def test_report_table_g_plus_column_is_the_plus_fit(tiny):
    # The table's G+ column must read fit="plus" and G- fit="minus"; swapped, a facilitating head's
    # row read like an inconsistent one and no test saw it.
    from dynamics.gates import report_table

    model, cfg = tiny
    ds = _report_ds(model, cfg)
    chg = np.empty(ds.chg.transpose("restart", "layer", "head", "fit").shape)
    chg[..., 0], chg[..., 1] = 0.9, 0.2  # plus, minus
    ds["chg"] = (("restart", "layer", "head", "fit"), chg)
    header, rows = report_table(ds)
    assert {(r[header.index("G+")], r[header.index("G-")]) for r in rows} == {("0.900", "0.200")}


def test_shared_starts_need_every_restart_past_the_clamp_on_the_same_side(tiny):
    # README: the note names heads whose lambda = 0 logit ended past the clamp "on one side in every
    # restart" (all start G+/G- from the same bound). Restart 0 at +5 and restart 1 at -5 start from
    # +4 and -4: different points, so no note; |logit| >= 4 in both flagged it.
    from dynamics.gates import report_lines

    model, cfg = tiny
    ds = _report_ds(model, cfg)
    logits = np.zeros((2, 2, 2))
    logits[0, 0, 0], logits[1, 0, 0] = 5.0, -5.0  # L0H0: past the clamp on opposite sides
    logits[:, 1, 1] = 5.0  # L1H1: past it on one side in both: shared
    ds["chg_init"] = (("restart", "layer", "head"), 1 / (1 + np.exp(-logits)))
    [line] = [x for x in report_lines(ds) if "ended past the clamp" in x]
    assert line.startswith("labels: at 1 of 4 heads (L1H1) every restart's lambda=0 fit")


def test_label_settle_compares_each_fit_with_its_own_stage(tiny):
    # G+ gates are judged by the plus stage's settle and G- by the minus stage's. Here G+ = 0.9
    # moved 0.45 in the plus stage (>= 0.4 from 0.5: unsettled) and G- = 0.01 did not move;
    # crossed over, G+ saw settle 0 and G- 0.45 < 0.49, and the line said settled.
    from dynamics.gates import report_lines

    model, cfg = tiny
    ds = _report_ds(model, cfg)
    chg = np.empty(ds.chg.transpose("restart", "layer", "head", "fit").shape)
    chg[..., 0], chg[..., 1] = 0.9, 0.01
    ds["chg"] = (("restart", "layer", "head", "fit"), chg)
    settle = np.zeros(ds.settle.transpose("restart", "stage", "layer", "head").shape)
    settle[:, 1, 1, 0] = 0.45  # stage "plus", L1H0
    ds["settle"] = (("restart", "stage", "layer", "head"), settle)
    [labels] = [x for x in report_lines(ds) if x.startswith("convergence of the labels")]
    assert labels.startswith("convergence of the labels: not settled at L1H0 (")


def test_a_smaller_clamp_option_bounds_both_the_start_and_the_regulariser(tiny):
    # options.clamp is c in loss = NLL - lambda * mean(clamp(logit, -c, c)) and the bound G+/G-
    # start from; a fit that used 4 for either (the paper's value) survived every test at the default.
    # The lambda = 0 logits here end near +-2, so c = 1.5 clamps the start and cuts the regulariser.
    model, cfg = tiny
    opts = GateOptions(steps=6, init_steps=3, restarts=1, batch_size=4, fit_batches=2, eval_batches=1, lam=0.5,
                       clamp=1.5)
    init = torch.tensor([[[2.0, -2.0], [1.0, 2.5]]])
    ds = fit_chg(model, cfg, opts, init_logits=init)
    zero = _reference_fit(model, cfg, init, 0.0, opts.init_steps, opts)
    assert (zero.abs() > 1.5).any()  # the clamp bites
    start = zero.clamp(-1.5, 1.5)
    plus = _reference_fit(model, cfg, start, opts.lam, opts.steps, opts).sigmoid()[0]
    minus = _reference_fit(model, cfg, start, -opts.lam, opts.steps, opts).sigmoid()[0]
    np.testing.assert_allclose(ds.chg.sel(fit="plus").values[0], plus.numpy(), atol=2e-5)
    np.testing.assert_allclose(ds.chg.sel(fit="minus").values[0], minus.numpy(), atol=2e-5)


def test_without_clamp_start_g_plus_starts_from_the_unclamped_logit(tiny):
    # clamp_start=False is the authors' code: G+ and G- start from the lambda = 0 logits as they are.
    # lr 1e-9 moves nothing, so a planted logit of 6 gives G+ = G- = sigmoid(6) = 0.99753, not sigmoid(4).
    model, cfg = tiny
    init = torch.tensor([[[6.0, 0.0], [-6.0, 1.0]]])
    opts = GateOptions(init_steps=0, steps=1, lr=1e-9, restarts=1, batch_size=4, fit_batches=1, eval_batches=1,
                       clamp_start=False)
    ds = fit_chg(model, cfg, opts, init_logits=init)
    expected = 1 / (1 + np.exp(-init[0].numpy()))
    for fit in ("plus", "minus"):
        np.testing.assert_allclose(ds.chg.sel(fit=fit).values[0], expected, atol=1e-6)


def test_chg_init_holds_the_lambda_zero_gates_before_the_start_clamp(tiny):
    # chg_init is the lambda = 0 stage's gates; a logit past the clamp is clamped only where G+ and
    # G- start. Stored clamped, a gate of sigmoid(6) = 0.99753 read as sigmoid(4) = 0.98201.
    model, cfg = tiny
    init = torch.tensor([[[6.0, 0.0], [-6.0, 1.0]]])
    opts = GateOptions(init_steps=0, steps=1, lr=1e-9, restarts=1, batch_size=4, fit_batches=1, eval_batches=1)
    ds = fit_chg(model, cfg, opts, init_logits=init)
    np.testing.assert_allclose(ds.chg_init.values[0], 1 / (1 + np.exp(-init[0].numpy())), atol=1e-6)
    np.testing.assert_allclose(ds.chg.sel(fit="plus").values[0, 0, 0], 1 / (1 + np.exp(-4.0)), atol=1e-6)


def test_initial_gates_are_drawn_between_init_low_and_init_high(tiny):
    # The seeded draw is U(init_low, init_high); with the defaults 0.01 / 0.99 an upper bound of
    # 1 - init_low is the same number, so only asymmetric bounds show it. No updates: chg_init is the draw.
    model, cfg = tiny
    opts = GateOptions(init_steps=0, steps=1, lr=1e-9, restarts=8, batch_size=4, fit_batches=1, eval_batches=1,
                       init_low=0.2, init_high=0.3)
    g = fit_chg(model, cfg, opts).chg_init.values
    assert g.min() >= 0.2 - 1e-6 and g.max() <= 0.3 + 1e-6


def test_contrastive_loss_default_max_diff_is_five_nats():
    # The public default (docstring example): forget 8 nats below retain is clamped at -5, so the
    # loss is 1 - 5 = -4 with lambda's term 0 at logits 0.
    from dynamics.gates.maths import contrastive_loss

    z = torch.zeros(1, 1, 2)
    assert contrastive_loss(torch.tensor([-1.0]), torch.tensor([-9.0]), z, 0.1).item() == pytest.approx(-4.0)


def test_contrastive_updates_cycle_through_the_fit_batches(tiny):
    # Update s uses retain and forget batch s mod fit_batches, as fit_chg's updates do: two updates
    # over 2 or 3 batches see batches 0 and 1; over 1 batch the second sees batch 0 again.
    from dynamics.gates import fit_contrastive

    model, cfg = tiny

    def gates(fit_batches: int) -> np.ndarray:
        opts = GateOptions(steps=2, restarts=1, batch_size=4, fit_batches=fit_batches, eval_batches=1)
        return fit_contrastive(model, cfg, "offset_copy", "markov", opts, init_logits=torch.zeros(1, 2, 2)).contrast_gate.values

    two = gates(2)
    np.testing.assert_array_equal(gates(3), two)
    assert np.abs(gates(1) - two).max() > 1e-4
