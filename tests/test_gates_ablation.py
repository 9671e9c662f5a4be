"""`gates.ablation`: zero and mean ablation of single heads and of sets, and gradient head importance.

Mean ablation (a head's z replaced by its mean over the reference rows at each position) has known
answers of its own: on a head with W_O = 0, where mean and zero ablation agree, mean ablation as zero
ablation, or a mean over positions too, passed (a helper audit's mutations).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dynamics.config import from_dict
from dynamics.gates import (
    HELDOUT_STEP,
    GateOptions,
    ablation_losses,
    component_weights,
    head_ablation,
    head_importance,
    set_ablation,
)
from dynamics.gates._engine import _batches
from dynamics.train import build
from tests.test_gates import TINY, one_thread, tiny_model  # noqa: F401 - fixtures: one_thread (autouse), tiny

OPTS = GateOptions(batch_size=4, eval_batches=2)


def test_mean_ablating_a_head_whose_z_ignores_the_input_changes_nothing():
    cfg = from_dict(TINY)
    torch.manual_seed(0)
    model = build(cfg, torch.device("cpu"))
    with torch.no_grad():  # layer 0's LayerNorm outputs its bias whatever the input: its z is a constant
        model.blocks[0].ln1.weight.zero_()
        model.blocks[0].ln1.bias.normal_()
    mean = head_ablation(model, cfg, "mean", OPTS).sel(layer=0).values  # (head, component)
    zero = head_ablation(model, cfg, "zero", OPTS).sel(layer=0).values
    assert np.abs(mean).max() < 1e-5  # its mean is itself
    assert np.abs(zero).min() > 1e-3  # while removing what it writes costs something


def test_mean_ablation_substitutes_the_mean_z_at_each_position():
    cfg = from_dict(TINY)
    torch.manual_seed(1)
    model = build(cfg, torch.device("cpu"))
    layer, head = 1, 0
    name = f"blocks.{layer}.attn.hook_z"
    data = [_batches(cfg, HELDOUT_STEP, OPTS.eval_batches, OPTS.batch_size, "cpu", c)  # (n, B, T + 1) each
            for c in cfg.task.component_names]
    rows = torch.cat(data).flatten(0, 1)  # (rows, T + 1): every component's reference rows
    with torch.no_grad():
        _, cache = model.run_with_cache(rows[:, :-1], [name])
    mean_z = cache[name].mean(0)  # (T, H, dh): a mean per position, not over positions

    def substitute(z, _name):  # z: (B, T, H, dh)
        z = z.clone()
        z[:, :, head] = mean_z[:, head]
        return z

    def nll(batch):
        with torch.no_grad(), model.hooks([(name, substitute)]):
            logits = model(batch[:, :-1])  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()

    mask = np.zeros((1, 2, 2), dtype=bool)
    mask[0, layer, head] = True
    got = ablation_losses(model, cfg, mask, "mean", OPTS).values[0]  # (component,)
    want = [np.mean([nll(b) for b in d]) for d in data]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_set_ablation_is_each_sets_loss_minus_the_intact_models():
    # delta of a set is NLL(without its heads) - NLL(every head), per component; measured from the
    # first set instead, a first set that removes anything made every delta wrong.
    cfg = from_dict(TINY)
    torch.manual_seed(2)
    model = build(cfg, torch.device("cpu"))
    sets = np.zeros((2, 2, 2), dtype=bool)  # (set, layer, head)
    sets[0, 0, 0] = True  # one head
    sets[1] = True  # every head

    def nll(batches, keep):
        out = []
        for b in batches:
            with torch.no_grad():
                logits = model(b[:, :-1], head_gates=keep.expand(b.shape[0], 2, 2))
            out.append(F.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten()).item())
        return np.mean(out)

    got = set_ablation(model, cfg, sets, "zero", OPTS).values  # (set, component)
    for c, name in enumerate(cfg.task.component_names):
        data = _batches(cfg, HELDOUT_STEP, OPTS.eval_batches, OPTS.batch_size, "cpu", name)
        full = nll(data, torch.ones(1, 2, 2))
        for s in range(2):
            want = nll(data, torch.from_numpy(~sets[s]).float()[None]) - full
            assert got[s, c] == pytest.approx(want, rel=1e-4, abs=1e-6)


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


def _mixture_model():
    # an induction-markov mixture (weights 0.8, 0.2) and its two components on their own
    small = {"n_layers": 2, "d_model": 32, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16}
    periods = {"min_period": 2, "max_period": 6}
    mix = from_dict({"model": small, "task": {"name": "mixture", "components": ["induction", "markov"],
                                              "weights": [0.8, 0.2], **periods}})
    single = {"induction": from_dict({"model": small, "task": {"name": "induction", **periods}}),
              "markov": from_dict({"model": small, "task": {"name": "markov"}})}
    torch.manual_seed(0)
    return build(mix, torch.device("cpu")).eval(), mix, single


def test_head_importance_of_a_mixture_is_the_weighted_sum_of_its_components():
    # "per component, then mixture-weighted": equal weights passed every other test
    model, mix, single = _mixture_model()
    opts = GateOptions(eval_batches=1, batch_size=8)
    raw = np.array(head_importance(model, mix, opts).attrs["raw"])
    per = {n: np.array(head_importance(model, c, opts).attrs["raw"]) for n, c in single.items()}
    assert not np.allclose(per["induction"], per["markov"], rtol=1e-3)  # the weighting matters here
    np.testing.assert_allclose(raw, 0.8 * per["induction"] + 0.2 * per["markov"], rtol=1e-4, atol=1e-7)


def test_a_pruning_curves_loss_is_the_mixture_weighted_nll():
    from dynamics.gates import pruning_curves

    model, mix, _ = _mixture_model()
    opts = GateOptions(eval_batches=1, batch_size=8)
    g = np.array([[0.1, 0.9], [0.5, 0.3]])
    ds = pruning_curves(model, mix, g, g, g, n_random=1, options=opts)
    per = ablation_losses(model, mix, np.zeros((2, 2), bool), options=opts).values[0]  # (component,)
    assert abs(per[0] - per[1]) > 1e-3
    for order in ds.order.values:
        assert float(ds.loss.sel(order=order, removed=0)) == pytest.approx(0.8 * per[0] + 0.2 * per[1], rel=1e-5)
