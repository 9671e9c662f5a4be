"""Known answers for the intervention definitions tests/test_interventions.py left open.

Each test failed under a mutation that left that file passing (a helper audit's): the cosine
schedule's shape, the logits term off the schedule, the default ramp and stage lengths, the
recorded weight a step late, the layer map's rounding, the learned-position context check, the
per-head ``hard`` override, the conditioned gates' variance term and LayerNorms, and the EMA's
two weights swapped (the existing test's decay of 0.5 is symmetric in them).
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dynamics import interventions, store
from dynamics.config import ConfigError
from dynamics.interventions import distill
from dynamics.model import Transformer
from dynamics.tasks import make_batch
from dynamics.train import build, make_optimizer
from tests.test_interventions import PINNED, _train_step, config, train

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> str:
    """A completed run to distil from: test_interventions' two-head templated teacher."""
    path = tmp_path_factory.mktemp("teacher") / "teacher.zarr"
    train(path, config({"templates": {"weight": 3.0, "heads": PINNED}}))
    return str(path)


def test_cosine_decay_is_half_at_the_midpoint_and_a_cosine_between():
    f = interventions.schedule_factor
    assert f("cosine_decay", 5, 10) == pytest.approx(0.5)
    assert f("cosine_decay", 2, 10) == pytest.approx(0.5 * (1 + np.cos(np.pi * 0.2)))


def test_a_warmup_without_ramp_steps_ramps_over_the_whole_run(teacher):
    c = config({"templates": {"heads": PINNED, "schedule": "warmup"}})  # train.steps = 50
    assert interventions.build(c, Transformer(c.model), CPU).parts[0].weight(25) == pytest.approx(0.5)
    c = config({"distill": {"teacher": teacher, "schedule": "warmup"}})
    assert interventions.build(c, Transformer(c.model), CPU).parts[0].head_weights(25).max() == pytest.approx(0.5)


def test_shallow_first_stages_default_to_the_steps_over_the_layers_distilled(teacher):
    c = config({"distill": {"teacher": teacher, "order": "shallow_first"}})
    d = interventions.build(c, Transformer(c.model), CPU).parts[0]
    assert d.head_weights(15)[1].max() == 0 and d.head_weights(16)[1].min() == 1  # 50 // 3 = 16


def test_the_logits_term_is_t_squared_kl_at_the_schedules_weight(teacher):
    # warmup over 10 steps, step 5: weight 2 x 0.5; temperature 2: tau^2 = 4
    c = config({"distill": {"teacher": teacher, "attention_weight": 0.0, "logits_weight": 2.0, "temperature": 2.0,
                            "schedule": "warmup", "ramp_steps": 10}})
    model = build(c, CPU)
    iv = interventions.build(c, model, CPU)
    tokens = torch.from_numpy(make_batch(c, "train", 0, 4).tokens)  # (B, T+1)
    with model.hooks(iv.fwd_hooks()):
        logits = model(tokens[:, :-1])  # (B, T, V)
    with torch.no_grad():
        teacher = iv.parts[0].teacher(tokens[:, :-1])  # (B, T, V)
    kl = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=teacher / 2),
                                           torch.distributions.Categorical(logits=logits / 2)).mean()
    torch.testing.assert_close(iv.loss(5, tokens, logits), 2.0 * 0.5 * 4.0 * kl)


def test_the_recorded_distill_weight_is_the_weight_of_the_step_just_trained(teacher):
    c = config({"distill": {"teacher": teacher, "schedule": "warmup", "ramp_steps": 10}})
    model = build(c, CPU)
    iv = interventions.build(c, model, CPU)
    _train_step(c, model, iv, make_optimizer(c, model, iv.parameters()), 4)
    probe = make_batch(c, "probe", 0, 2).tokens[:, :-1]
    assert iv.snapshot(model, probe)["distill_weight"].max() == pytest.approx(0.4)


def test_four_student_layers_map_depth_proportionally_onto_two(teacher):
    c = config({"distill": {"teacher": teacher}}, model={"n_layers": 4, "n_heads": 1})
    _, pairs = distill.resolve(interventions.parse(c).distill, c)
    assert [p[2] for p in pairs] == [0, 0, 1, 1]  # round(l / 3): 0, 0.33, 0.67, 1


def test_a_learned_position_teacher_of_a_shorter_context_is_refused(tmp_path):
    path = tmp_path / "t.zarr"
    train(path, config(model={"pos": "learned"}, train={"steps": 2}))
    with pytest.raises(ConfigError, match="learned positions"):
        interventions.check(config({"distill": {"teacher": str(path)}}, model={"context": 32}))


def test_a_heads_own_hard_false_overrides_the_tables_hard_true():
    c = config({"templates": {"hard": True, "heads": [{"layer": 0, "head": 0, "pattern": "uniform", "hard": False},
                                                      {"layer": 0, "head": 1, "pattern": "uniform"}]}})
    model = build(c, CPU)
    iv = interventions.build(c, model, CPU)
    tokens = torch.from_numpy(make_batch(c, "train", 0, 2).tokens[:, :-1])  # (B, T)
    seen = {}
    with torch.no_grad(), model.hooks(iv.eval_hooks()), \
            model.hooks([("blocks.0.attn.hook_pattern", lambda t, name: seen.setdefault(name, t.clone()))]):
        model(tokens)
    pattern = seen["blocks.0.attn.hook_pattern"]  # (B, H, T, T)
    uniform = torch.tensor(interventions.template_pattern("uniform", 16), dtype=torch.float32).expand(2, 16, 16)
    assert torch.equal(pattern[:, 1], uniform)  # hard: the template is the pattern
    assert not torch.equal(pattern[:, 0], uniform)  # soft: its own, pulled towards it by the loss


def test_the_gate_ema_keeps_decay_of_the_old_and_one_minus_decay_of_the_new():
    decay = 0.8  # 0.5, the other test's, reads the same with the two weights swapped
    c = config({"conditioned_gates": {"conditioned": False, "init": 0.0, "ema_decay": decay}},
               train={"lr": 0.1, "warmup_steps": 0})
    model = build(c, CPU)
    iv = interventions.build(c, model, CPU)
    opt = make_optimizer(c, model, iv.parameters())
    gates = iv.parts[0]
    for s in range(3):
        _train_step(c, model, iv, opt, s)
        own = torch.sigmoid(gates.b.detach()).clone()  # the gate this step trained with
        before = gates.ema.clone()
        opt.step()
    _train_step(c, model, iv, opt, 3)
    assert not torch.allclose(own, before)
    torch.testing.assert_close(gates.ema, decay * before + (1 - decay) * own)


def test_conditioned_gates_and_their_variance_term_by_hand():
    # gate = sigmoid(W . [LN(prefix mean of z); LN(prefix mean of the residual)] + b); the loss adds
    # w x the mean over heads of the population variance over the batch of each row's mean gate
    c = config({"conditioned_gates": {"layers": [1], "variance_weight": 0.7, "init": 0.3}})
    model = build(c, CPU)
    iv = interventions.build(c, model, CPU)
    gates = iv.parts[0]
    with torch.no_grad():
        gates.W.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    tokens = torch.from_numpy(make_batch(c, "train", 0, 5).tokens)  # (B, T+1)
    x = tokens[:, :-1]
    _, cache = model.run_with_cache(x, ["blocks.1.hook_resid_pre", "blocks.1.attn.hook_z"])
    z, resid = cache["blocks.1.attn.hook_z"], cache["blocks.1.hook_resid_pre"]  # (B, T, H, dh), (B, T, D)
    n = torch.arange(1, 17.0).view(1, -1, 1, 1)  # positions seen so far, 1..T
    features = torch.cat([F.layer_norm(z.cumsum(1) / n, (z.shape[-1],)),
                          F.layer_norm(resid.cumsum(1) / n[..., 0], (resid.shape[-1],))[:, :, None].expand(-1, -1, 2, -1)],
                         -1)  # (B, T, H, dh + D)
    mean_gate = torch.sigmoid((features * gates.W[0].detach()).sum(-1) + 0.3).mean(1)  # (B, H)
    with model.hooks(iv.fwd_hooks()):
        logits = model(x)
    torch.testing.assert_close(iv.loss(0, tokens, logits), 0.7 * mean_gate.var(0, unbiased=False).mean())
    recorded = iv.snapshot(model, x.numpy())["conditioned_gate"][1]
    np.testing.assert_allclose(recorded, mean_gate.T.detach().numpy(), atol=1e-6)


# A second helper audit's mutation run left these alive: a ramp of -1 accepted, a table-wide
# hard = true not counted as changing the forward pass, ema_mix weighting the raw gate instead
# of the EMA, and the EMA starting at 0.5 instead of sigmoid(init) (the same at init 0, which
# every earlier EMA test used).


@pytest.mark.parametrize("section, extra", [("templates", {"heads": PINNED}), ("distill", {"teacher": "x.zarr"})])
def test_a_ramp_of_minus_one_is_refused(section, extra):
    # -1 is truthy, so "0 means train.steps" did not catch it: the ramp became max(-1, 1) = 1 step
    with pytest.raises(ConfigError, match=f"intervene.{section}.ramp_steps: must be >= 0, got -1"):
        interventions.parse(config({section: {**extra, "ramp_steps": -1}}))


def test_a_table_wide_hard_true_changes_the_forward_pass_unless_each_head_says_false():
    # what decides whether a teacher's checkpoint alone reproduces its attention
    uniform = {"layer": 0, "head": 0, "pattern": "uniform"}
    changes = interventions.common.forward_changes
    assert changes({"templates": {"hard": True, "heads": [uniform]}}) == ["hard templates"]
    assert changes({"templates": {"hard": True, "heads": [{**uniform, "hard": False}]}}) == []
    assert changes({"templates": {"heads": [uniform]}}) == []


def test_the_applied_gate_is_one_minus_ema_mix_of_its_own_plus_ema_mix_of_the_ema():
    # static gates at init 0: own gate sigmoid(0) = 0.5; EMA set to 0.1; ema_mix 0.2 (0.5 would
    # read the same with the two weights swapped): 0.8 x 0.5 + 0.2 x 0.1 = 0.42 on every head
    c = config({"conditioned_gates": {"conditioned": False, "init": 0.0, "ema_mix": 0.2}})
    model = build(c, CPU)
    iv = interventions.build(c, model, CPU)
    iv.parts[0].ema = torch.full((2, 2), 0.1)
    x = torch.from_numpy(make_batch(c, "probe", 0, 3).tokens[:, :-1])  # (B, T)
    np.testing.assert_allclose(iv.snapshot(model, x.numpy())["conditioned_gate"], 0.42, rtol=1e-6)
    with torch.no_grad(), model.hooks(iv.eval_hooks()):
        gated = model(x)
    with torch.no_grad():  # the model's own external gates multiply z the same way
        torch.testing.assert_close(gated, model(x, head_gates=torch.full((2, 2), 0.42)))


def test_the_gate_ema_starts_at_sigmoid_of_init():
    c = config({"conditioned_gates": {"init": 2.0}})
    model = build(c, CPU)
    iv = interventions.build(c, model, CPU)
    probe = make_batch(c, "probe", 0, 2).tokens[:, :-1]
    ema = iv.snapshot(model, probe)["conditioned_gate_ema"]  # no update yet
    np.testing.assert_allclose(ema, np.full((2, 2), 1 / (1 + np.exp(-2.0))), rtol=1e-6)  # 0.8808


@pytest.fixture(scope="module")
def two_sinks(tmp_path_factory) -> str:
    """A teacher whose two layer-1 heads were both pulled to first_token: two heads labelled sink."""
    path = tmp_path_factory.mktemp("two_sinks") / "teacher.zarr"
    pinned = [{"layer": 1, "head": h, "pattern": "first_token"} for h in (0, 1)]
    train(path, config({"templates": {"weight": 3.0, "heads": pinned}}))
    return str(path)


def test_a_role_maps_to_the_teachers_highest_scoring_head_with_that_label(two_sinks):
    # test_interventions' role map had one candidate per role, so "lowest score" passed too. Here
    # both layer-1 heads are sinks; the sink score is alpha_0, the mean over probes and queries of
    # the attention on key 0, read by hand from the teacher's last recorded attention.
    from dynamics import store

    ds = store.open_run(two_sinks, store.list_runs(two_sinks)[0])
    alpha_0 = ds["attention"].values[-1, 1, :, :, :, 0].astype(np.float64).mean((1, 2))  # (H,): layer 1
    assert alpha_0.min() > 0.3 and alpha_0[0] != alpha_0[1]  # both sinks, and one is the stronger
    c = config({"distill": {"teacher": two_sinks, "map": "heads", "heads": [{"layer": 0, "head": 0, "role": "sink"}]}})
    _, pairs = distill.resolve(interventions.parse(c).distill, c)
    assert pairs == [(0, 0, 1, int(alpha_0.argmax()))]


def test_a_learned_position_teacher_of_the_students_context_is_accepted(tmp_path):
    # positions 0..15 are all the student's batches use: a teacher with context 16 has each of
    # them (only a shorter one is refused, as in the test above)
    path = tmp_path / "t.zarr"
    train(path, config(model={"pos": "learned"}, train={"steps": 2}))  # context 16
    for context in (16, 8):
        interventions.check(config({"distill": {"teacher": str(path)}}, model={"context": context}))


def test_true_is_not_an_integer_option():
    # bool is an int subclass in Python: `layer = true` would have pinned layer 1
    heads = [{"layer": True, "head": 0, "pattern": "uniform"}]
    with pytest.raises(ConfigError, match=r"intervene.templates.heads\[0\].layer: expected an integer, got True"):
        interventions.parse(config({"templates": {"heads": heads}}))


@pytest.mark.parametrize("table, message", [
    # D5: a role with only teacher_layer given is both ways of naming a source (`or`, not `and`)
    ({"map": "heads", "heads": [{"layer": 0, "head": 0, "role": "sink", "teacher_layer": 1}]},
     r"^intervene\.distill\.heads\[0\]: give either role or teacher_layer/teacher_head, not both$"),
    # D6: teacher_layer without teacher_head names no head (refused here, not as head -1 later)
    ({"map": "heads", "heads": [{"layer": 0, "head": 0, "teacher_layer": 1}]},
     r"^intervene\.distill\.heads\[0\]: needs teacher_layer and teacher_head, or role$"),
    # D7: "none" is in ROLES but labels a head with no role: no head to copy
    ({"map": "heads", "heads": [{"layer": 0, "head": 0, "role": "none"}]},
     r"^intervene\.distill\.heads\[0\]\.role: unknown role 'none' \(previous_token \| .* \| diffuse\)$"),
    # D8: layer n_layers does not exist (0-based): `<=` let it through to a hook that never fires
    ({"layers": [2]}, r"^intervene\.distill\.layers\[0\]: layer 2 does not exist \(model\.n_layers = 2\)$"),
    # D9: a layer named twice would count its pairs twice in |pairs|
    ({"layers": [0, 0]}, r"^intervene\.distill\.layers: duplicate layer$"),
])
def test_distill_head_and_layer_options_are_refused_at_parse(table, message):
    with pytest.raises(ConfigError, match=message):
        interventions.parse(config({"distill": {"teacher": "x.zarr", **table}}))


def _copy(teacher, tmp_path):
    shutil.copytree(teacher, tmp_path / "t.zarr")
    return tmp_path / "t.zarr", store.list_runs(tmp_path / "t.zarr")[0]


def test_a_diverged_teacher_is_refused(teacher, tmp_path):
    # distill._teacher: only a completed teacher is distilled from; a diverged one's checkpoint
    # holds weights from before its divergence, not a trained model (mutant D35 took any finished run)
    path, run_id = _copy(teacher, tmp_path)
    store.update_run_attrs(path, run_id, status="diverged", diverged_step=2)
    with pytest.raises(ConfigError, match=rf"^intervene\.distill\.teacher: teacher run {run_id} is diverged, not completed$"):
        interventions.check(config({"distill": {"teacher": str(path)}}))


def test_a_teacher_without_a_checkpoint_is_a_config_error_before_training(teacher, tmp_path):
    # distill._teacher: load_checkpoint reads a missing checkpoint as None, without a word; without
    # has_checkpoint's test (mutant D43) the check passed and the student failed later, in
    # load_run_model, as a StoreError after its store was made
    path, run_id = _copy(teacher, tmp_path)
    os.remove(path / "checkpoints" / run_id / "ckpt.pt")
    with pytest.raises(ConfigError, match=rf"^intervene\.distill\.teacher: teacher run {run_id} in .*t\.zarr has no "
                                          r"checkpoint to load$"):
        interventions.check(config({"distill": {"teacher": str(path)}}))


def test_layer_map_distils_only_the_layers_named(teacher):
    # distill._pairs: `layers` restricts map = "layer" to those student layers (mutant D36 ignored
    # it and distilled every layer)
    c = config({"distill": {"teacher": teacher, "layers": [1]}})
    _, pairs = distill.resolve(interventions.parse(c).distill, c)
    assert pairs == [(1, 0, 1, 0), (1, 1, 1, 1)]


def test_the_recorded_ramp_and_stage_are_the_ones_used_not_the_zeros_written(teacher):
    # Distill.describe (the run's `interventions` attr, which the report reads for "from step N"):
    # ramp_steps 0 and stage_steps 0 mean train.steps and train.steps // (layers + 1); recording the
    # 0s as written (mutants D40, D41) said every layer was on from step 0 and no ramp
    c = config({"distill": {"teacher": teacher, "order": "shallow_first", "schedule": "warmup"}})  # train.steps 50
    described = interventions.build(c, Transformer(c.model), CPU).parts[0].describe()
    assert described["ramp_steps"] == 50
    assert described["stage_steps"] == 50 // 3  # two layers distilled


def test_together_switches_every_distilled_head_on_from_step_0(teacher):
    # Distill.head_weights: order "together" stages nothing (mutant D45 staged it like shallow_first,
    # layer 1 off until train.steps // 3)
    c = config({"distill": {"teacher": teacher}})  # order = "together"
    d = interventions.build(c, Transformer(c.model), CPU).parts[0]
    assert d.head_weights(0).tolist() == [[1.0, 1.0], [1.0, 1.0]]
