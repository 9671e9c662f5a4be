"""Interventions: templates pin heads, distillation pulls a student to its teacher, gates condition on input.

The runs are tiny (2 layers, width 32, 50 steps on a Markov chain) and shared by module-scoped
fixtures: a templated run that doubles as the distillation teacher, the same config with
weight 0 (free training, same records), a distilled and a free student with more heads than
the teacher, and a run with conditioned gates.
"""

import copy
import io
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from dynamics import interventions, store
from dynamics.analysis import slash_score
from dynamics.cli import main
from dynamics.config import ConfigError, from_dict, load_config, with_values
from dynamics.interventions import distill
from dynamics.model import Transformer
from dynamics.tasks import make_batch
from dynamics.train import build as build_model
from dynamics.train import make_optimizer, train_run

BASE = {
    "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16},
    "task": {"name": "markov"},
    "train": {"steps": 50, "batch_size": 16, "lr": 3e-3, "warmup_steps": 5, "eval_batches": 1},
    "record": {"dense_until": 0, "every": 25, "n_probe": 4, "eval_batch_size": 8, "head_weights": "off"},
}
PINNED = [{"layer": 0, "head": 0, "pattern": "previous_token"}, {"layer": 1, "head": 1, "pattern": "first_token"}]


def config(intervene=None, **sections):
    raw = copy.deepcopy(BASE)
    for section, changes in sections.items():
        raw[section].update(changes)
    if intervene is not None:
        raw["intervene"] = intervene
    return from_dict(raw)


def train(path, cfg):
    result = train_run(cfg, str(path))
    assert result.status == "completed"
    return store.open_run(str(path), result.run_id)


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher") / "teacher.zarr"
    return str(path), train(path, config({"templates": {"weight": 3.0, "heads": PINNED}}))


@pytest.fixture(scope="module")
def free(tmp_path_factory):
    path = tmp_path_factory.mktemp("free") / "free.zarr"
    return train(path, config({"templates": {"weight": 0.0, "heads": PINNED}}))


@pytest.fixture(scope="module")
def students(templated, tmp_path_factory):
    """Distilled and free students (4 heads, another seed) of the 2-head teacher."""
    path = tmp_path_factory.mktemp("students") / "students.zarr"
    out = {}
    for name, weight in (("distilled", 1.0), ("free", 0.0)):
        cfg = config({"distill": {"teacher": templated[0], "attention_weight": weight}},
                     model={"n_heads": 4}, train={"seed": 1})
        out[name] = train(path, cfg)
    return out


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    path = tmp_path_factory.mktemp("gated") / "gated.zarr"
    return train(path, config({"conditioned_gates": {"init": 0.0}}))


def _train_step(cfg, model, iv, opt, s):
    """Training step s's forward and backward under the interventions, as train.py does (no update)."""
    tokens = torch.from_numpy(make_batch(cfg, "train", s, 8).tokens)  # (B, T+1)
    opt.zero_grad(set_to_none=True)
    with model.hooks(iv.fwd_hooks()):
        logits = model(tokens[:, :-1])  # (B, T, V)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    (loss + iv.loss(s, tokens, logits)).backward()


# ----------------------------------------------------------------------------- pure pieces


@pytest.mark.parametrize("kind", interventions.PATTERNS)
def test_templates_are_causal_distributions(kind):
    t = interventions.template_pattern(kind, 12, delta=3, width=4)
    np.testing.assert_allclose(t.sum(1), 1.0)
    assert np.all(np.triu(t, 1) == 0) and np.all(t >= 0)


def test_template_arguments_a_config_would_refuse_are_refused():
    # width 0 gave NaN rows (documented: every row sums to 1), delta 0 a self pattern, -1 an IndexError
    for kind, kw, message in (("local", {"width": 0}, "width must be >= 1"), ("offset", {"delta": 0}, "delta must be >= 1"),
                              ("offset", {"delta": -1}, "delta must be >= 1"), ("uniform", {}, "n must be >= 1")):
        with pytest.raises(ValueError, match=message):
            interventions.template_pattern(kind, 0 if kind == "uniform" else 6, **kw)
    assert interventions.template_pattern("offset", 2, delta=3)[:, 0].tolist() == [1.0, 1.0]  # n <= delta: token 0


def test_templates_score_as_their_role_in_the_analysers():
    n = 12
    attn = np.stack([interventions.template_pattern("offset", n, delta=3),
                     interventions.template_pattern("previous_token", n)])[None, None]  # (1, 1, 2, T, T)
    da = xr.DataArray(attn[:, :, :, None], dims=("snapshot", "layer", "head", "probe", "query", "key"))
    scores = slash_score(da, max_offset=4).isel(snapshot=0, layer=0)  # (head, offset)
    assert scores.sel(head=0, offset=3).item() == pytest.approx(1.0)
    assert scores.sel(head=1, offset=1).item() == pytest.approx(1.0)
    local = interventions.template_pattern("local", n, width=3)
    np.testing.assert_allclose(local[5, 3:6], 1 / 3)
    np.testing.assert_allclose(interventions.template_pattern("uniform", n)[3, :4], 1 / 4)


def test_kl_rows_matches_torch_distributions_and_ignores_masked_keys():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(5, 6, generator=g)
    p[:, -2:] = 0  # zero-probability target keys
    p = p / p.sum(-1, keepdim=True)
    scores = torch.randn(5, 6, generator=g, requires_grad=True)
    masked = scores.masked_fill(torch.arange(6) == 5, float("-inf"))  # a causally masked key
    log_q = masked.log_softmax(-1)
    ours = interventions.kl_rows(p, log_q)
    ref = torch.distributions.kl_divergence(torch.distributions.Categorical(probs=p),
                                            torch.distributions.Categorical(logits=log_q))
    torch.testing.assert_close(ours, ref)
    ours.sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert interventions.kl_rows(p, p.clamp_min(1e-30).log()).abs().max() < 1e-6


def test_schedules_start_and_end_where_documented():
    f = interventions.schedule_factor
    assert [f("constant", s, 10) for s in (0, 10)] == [1.0, 1.0]
    assert [f("warmup", s, 10) for s in (0, 5, 20)] == [0.0, 0.5, 1.0]
    assert [f("linear_decay", s, 10) for s in (0, 5, 20)] == [1.0, 0.5, 0.0]
    assert f("cosine_decay", 0, 10) == 1.0 and f("cosine_decay", 10, 10) == pytest.approx(0.0)


def test_no_intervene_table_builds_nothing():
    cfg = config()
    assert interventions.build(cfg, Transformer(cfg.model), torch.device("cpu")) is None


# ----------------------------------------------------------------------------- templates


def test_templated_heads_converge_to_their_templates(templated, free):
    _, ds = templated
    kl, kl_free = ds["template_kl"].values, free["template_kl"].values  # (S, L, H)
    for layer, head in ((0, 0), (1, 1)):
        assert kl[-1, layer, head] < 0.2 * kl[0, layer, head]
        assert kl[-1, layer, head] < 0.1 * kl_free[-1, layer, head]
    assert np.isnan(kl[:, 0, 1]).all()  # unpinned heads have no template
    assert ds["template_weight"].values.tolist() == [3.0] * ds.sizes["snapshot"]
    assert free["template_weight"].values.max() == 0.0
    # the recorded attention reads as the pinned role to the same analysers a free run gets
    def previous_token(run):
        scores = slash_score(run["attention"].isel(snapshot=[-1]).astype("float32"), max_offset=1)
        return scores.isel(snapshot=0).sel(layer=0, head=0, offset=1).compute().item()

    assert previous_token(ds) > 0.5 > previous_token(free)  # 0.5: RoleThresholds.previous_token


def test_soft_template_loss_is_the_scheduled_weight_times_the_mean_kl_over_pinned_heads():
    # w(step) * mean over pinned heads of KL(template || attention), per query, averaged over
    # batch and queries; warm-up of 10 steps at step 5 halves the weight (and is what is recorded).
    pinned = [{"layer": 0, "head": 1, "pattern": "offset", "delta": 2}, {"layer": 1, "head": 0, "pattern": "local", "width": 2}]
    cfg = config({"templates": {"weight": 2.0, "schedule": "warmup", "ramp_steps": 10, "heads": pinned}},
                 model={"d_model": 16, "context": 8})
    model = build_model(cfg, torch.device("cpu"))
    iv = interventions.build(cfg, model, torch.device("cpu"))
    tokens = torch.from_numpy(make_batch(cfg, "train", 0, 4).tokens)  # (B, T+1)
    with model.hooks(iv.fwd_hooks()):
        logits = model(tokens[:, :-1])
    loss = iv.loss(5, tokens, logits)
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    _, cache = model.run_with_cache(tokens[:, :-1], names)
    kl = []
    for (layer, head), (kind, kw) in zip(((0, 1), (1, 0)), (("offset", {"delta": 2}), ("local", {"width": 2})), strict=True):
        tmpl = torch.tensor(interventions.template_pattern(kind, 8, **kw), dtype=torch.float32).expand(4, 8, 8)
        kl.append(torch.distributions.kl_divergence(torch.distributions.Categorical(probs=tmpl),
                                                    torch.distributions.Categorical(probs=cache[names[layer]][:, head])).mean())
    torch.testing.assert_close(loss, 2.0 * 0.5 * torch.stack(kl).mean())
    blocks = iv.snapshot(model, make_batch(cfg, "eval", 0, 3).tokens[:, :-1])
    assert blocks["template_weight"] == 1.0
    assert np.isnan(blocks["template_kl"][[0, 1], [0, 1]]).all() and np.isfinite(blocks["template_kl"][[0, 1], [1, 0]]).all()


def test_hard_mode_returns_exactly_the_template():
    pinned = [{"layer": 1, "head": 0, "pattern": "offset", "delta": 2}, {"layer": 0, "head": 1, "pattern": "uniform"}]
    cfg = config({"templates": {"hard": True, "heads": pinned}})
    model = build_model(cfg, torch.device("cpu"))
    iv = interventions.build(cfg, model, torch.device("cpu"))
    tokens = torch.from_numpy(make_batch(cfg, "train", 0, 4).tokens)  # (B, T+1)
    seen, free = {}, {}

    def keep(into):
        def fn(pattern, name):
            into[name] = pattern.detach().clone()
        return fn

    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    with model.hooks(iv.fwd_hooks()), model.hooks([(n, keep(seen)) for n in names]):
        logits = model(tokens[:, :-1])
    iv.loss(0, tokens, logits).backward()
    with torch.no_grad(), model.hooks([(n, keep(free)) for n in names]):
        model(tokens[:, :-1])
    T = cfg.model.context
    offset = torch.tensor(interventions.template_pattern("offset", T, delta=2), dtype=torch.float32)
    uniform = torch.tensor(interventions.template_pattern("uniform", T), dtype=torch.float32)
    assert torch.equal(seen["blocks.1.attn.hook_pattern"][:, 0], offset.expand(4, T, T))
    assert torch.equal(seen["blocks.0.attn.hook_pattern"][:, 1], uniform.expand(4, T, T))
    # the other head of layer 0 is untouched; layer 1's free head sees clamped layer-0 output
    torch.testing.assert_close(seen["blocks.0.attn.hook_pattern"][:, 0], free["blocks.0.attn.hook_pattern"][:, 0])
    assert all(torch.isfinite(p.grad).all() for p in model.optim_parameters() if p.grad is not None)
    # recording hooks for the recorder clamp too, without capturing
    with torch.no_grad(), model.hooks(iv.eval_hooks()), model.hooks([(names[1], keep(free))]):
        model(tokens[:, :-1])
    assert torch.equal(free[names[1]][:, 0], offset.expand(4, T, T))


# ----------------------------------------------------------------------------- distillation


def test_distilled_student_attention_moves_toward_the_teacher(students):
    kl = students["distilled"]["distill_kl"].values  # (S, L, H): student has 4 heads, teacher 2
    kl_free = students["free"]["distill_kl"].values
    mapped = (slice(None), slice(0, 2))
    assert np.nanmean(kl[-1][mapped]) < 0.5 * np.nanmean(kl[0][mapped])
    assert np.nanmean(kl[-1][mapped]) < 0.5 * np.nanmean(kl_free[-1][mapped])
    assert np.isnan(kl[:, :, 2:]).all()  # extra student heads are free
    source = students["distilled"]["distill_source"].values[-1]
    assert source.tolist() == [[0, 1, -1, -1], [2, 3, -1, -1]]  # layer-to-layer, head h <- h
    assert students["distilled"]["distill_weight"].values[-1, :, :2].min() == 1.0
    assert students["free"]["distill_weight"].values.max() == 0.0
    assert np.isfinite(students["distilled"]["distill_logits_kl"].values).all()


def test_run_attrs_hold_the_resolved_interventions(templated, students, gated):
    # config holds the [intervene] table as written: no defaults, no teacher run when it was left out
    attrs = store.run_attrs(templated[0], store.list_runs(templated[0])[0])
    assert attrs["config"]["intervene"]["templates"] == {"weight": 3.0, "heads": PINNED}
    got = attrs["interventions"]["templates"]
    assert (got["schedule"], got["ramp_steps"], got["hard"]) == ("constant", 50, False)
    assert [h["hard"] for h in got["heads"]] == [False, False]
    distilled = students["distilled"].attrs["interventions"]["distill"]
    assert distilled["teacher_run"] == attrs["run_id"] and distilled["teacher_step"] == 50
    assert distilled["pairs"] == [[0, 0, 0, 0], [0, 1, 0, 1], [1, 0, 1, 0], [1, 1, 1, 1]]
    assert distilled["run"] == "" and distilled["attention_weight"] == 1.0
    assert gated.attrs["interventions"]["conditioned_gates"] == {
        "layers": [0, 1], "pool": "causal", "conditioned": True, "init": 0.0, "variance_weight": 0.0,
        "ema_decay": 0.99, "ema_mix": 0.0}
    # the report's attention caption reads this attribute to name the heads the run did not learn freely
    from dynamics.report.attention import _intervention_note

    assert ("Trained with interventions: templates pull L0H0 previous_token, L1H1 first_token (weight 3, constant)."
            in _intervention_note(attrs["interventions"]))
    assert (f"attention of L0H0, L0H1, L1H0, L1H1 distilled from run {attrs['run_id']}."
            in _intervention_note(students["distilled"].attrs["interventions"]))
    assert "conditioned gates scale the heads of layer(s) 0, 1." in _intervention_note(gated.attrs["interventions"])
    assert _intervention_note(None) == ""
    # a run shortened below its curriculum: layer 1's stage (step 150) never came in 100 steps, and
    # it was named as distilled; a logits-only student was said to have "those heads" shaped
    staged = distilled | {"order": "shallow_first", "stage_steps": 150}
    assert (f"attention of L0H0, L0H1 distilled from run {attrs['run_id']} (L1H0 (from step 150), L1H1 (from step "
            f"150) never, its stage starting after the run's 100 steps). Those heads' maps and roles are shaped by "
            f"the intervention, not learned freely") in _intervention_note({"distill": staged}, steps=100)
    assert "attention of L0H0, L0H1, L1H0, L1H1 distilled" in _intervention_note({"distill": staged}, steps=200)
    # what the run recorded decides where it has it: a schedule decayed to 0, or a divergence, before layer 1's stage
    recorded = np.zeros((3, 2, 2), np.float32)
    recorded[:2, 0] = 1.0
    assert (f"attention of L0H0, L0H1 distilled from run {attrs['run_id']} (L1H0 (from step 150), L1H1 (from step "
            f"150) never, its weight 0 at every recorded snapshot)") in _intervention_note(
        {"distill": staged}, steps=200, weights=recorded)
    logits = distilled | {"attention_weight": 0.0, "logits_weight": 1.0}
    assert _intervention_note({"distill": logits}) == (
        f" Trained with interventions: logits distilled from run {attrs['run_id']}. Every head's map and role may be "
        f"shaped by the teacher's logits, not learned freely (run attribute `interventions`).")
    both = distilled | {"logits_weight": 1.0}
    assert (". Those heads' maps and roles are shaped by the intervention, and every head's may be by the teacher's "
            "logits, not learned freely") in _intervention_note({"distill": both})
    unpulled = {"templates": got | {"weight": 0.0}}  # a weight-0 control point: nothing pulls
    assert _intervention_note(unpulled) == ""
    clamped = {"templates": got | {"weight": 0.0, "heads": [h | {"hard": True} for h in got["heads"]]}}
    assert "L0H0 previous_token (clamped: hard)" in _intervention_note(clamped)
    # at weight 0 a soft head beside a hard one trains freely: it was named as pulled too
    one_hard = {"templates": got | {"weight": 0.0, "heads": [got["heads"][0] | {"hard": True}, got["heads"][1]]}}
    assert "templates pull L0H0 previous_token (clamped: hard). Those heads'" in _intervention_note(one_hard)


def test_layer_map_is_depth_proportional(templated):
    cfg = config({"distill": {"teacher": templated[0]}}, model={"n_layers": 3, "n_heads": 1})
    _, pairs = distill.resolve(interventions.parse(cfg).distill, cfg)
    assert pairs == [(0, 0, 0, 0), (1, 0, 0, 0), (2, 0, 1, 0)]


def test_role_map_uses_the_teachers_final_roles(templated):
    heads = [{"layer": 1, "head": 0, "role": "previous_token"}, {"layer": 0, "head": 1, "role": "sink"}]
    cfg = config({"distill": {"teacher": templated[0], "map": "heads", "heads": heads}})
    _, pairs = distill.resolve(interventions.parse(cfg).distill, cfg)
    assert pairs == [(1, 0, 0, 0), (0, 1, 1, 1)]  # the teacher's pinned previous-token and sink heads
    bad = config({"distill": {"teacher": templated[0], "map": "heads", "heads": [{"layer": 0, "head": 0,
                                                                                  "role": "induction"}]}})
    with pytest.raises(ConfigError, match=r"intervene\.distill\.heads\[0\]\.role"):
        interventions.check(bad)


def test_role_map_refuses_a_teacher_whose_recorded_arrays_are_damaged(templated, tmp_path):
    # Roles are read from the teacher's stored attention and probe tokens, which were not checked:
    # lost probe tokens read as 0 labelled every head induction and the student distilled from the
    # wrong head, exit 0; a flipped bit in the last attention chunk was a codec traceback.
    import shutil

    teacher = tmp_path / "teacher.zarr"
    shutil.copytree(templated[0], teacher)
    run_id = store.list_runs(teacher)[0]
    heads = [{"layer": 1, "head": 0, "role": "previous_token"}]
    cfg = config({"distill": {"teacher": str(teacher), "map": "heads", "heads": heads}})
    assert distill.resolve(interventions.parse(cfg).distill, cfg)[1] == [(1, 0, 0, 0)]  # whole: as above
    tokens = teacher / "runs" / run_id / "probe_tokens"
    shutil.move(tokens / "c", tmp_path / "tokens")
    with pytest.raises(ConfigError, match=rf"^intervene\.distill\.teacher: .*teacher\.zarr: run {run_id}: array probe_tokens: its chunk "):
        interventions.check(cfg)
    shutil.move(tmp_path / "tokens", tokens / "c")
    last = sorted((teacher / "runs" / run_id / "attention" / "c").iterdir(), key=lambda p: int(p.name))[-1]
    chunk = next(p for p in sorted(last.rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x20
    chunk.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=rf"^intervene\.distill\.teacher: .*teacher\.zarr: run {run_id}: array attention at snapshot .* "
                                          r"cannot be decoded .*CRC32C checksum does not match"):
        interventions.check(cfg)


def test_shallow_first_switches_layers_on_in_order(templated):
    cfg = config({"distill": {"teacher": templated[0], "order": "shallow_first", "stage_steps": 30}})
    d = interventions.build(cfg, Transformer(cfg.model), torch.device("cpu")).parts[0]
    assert d.head_weights(0).tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert d.head_weights(30).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    cfg = config({"distill": {"teacher": templated[0], "order": "deep_first", "stage_steps": 30}})
    d = interventions.build(cfg, Transformer(cfg.model), torch.device("cpu")).parts[0]
    assert d.head_weights(0).tolist() == [[0.0, 0.0], [1.0, 1.0]]


def test_attention_distillation_is_the_weighted_kl_of_each_pair_over_all_pairs(templated):
    # Crossed pairs (student L0H1 <- teacher L1H0, student L1H1 <- teacher L0H0), deep_first:
    # layer 1 is on from step 0, layer 0 from stage_steps on; an off pair still counts in |pairs|.
    heads = [{"layer": 0, "head": 1, "teacher_layer": 1, "teacher_head": 0},
             {"layer": 1, "head": 1, "teacher_layer": 0, "teacher_head": 0}]
    cfg = config({"distill": {"teacher": templated[0], "map": "heads", "heads": heads, "attention_weight": 3.0,
                              "order": "deep_first", "stage_steps": 2}})
    model = build_model(cfg, torch.device("cpu"))
    iv = interventions.build(cfg, model, torch.device("cpu"))
    tokens = torch.from_numpy(make_batch(cfg, "train", 0, 4).tokens)  # (B, T+1)
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    _, student = model.run_with_cache(tokens[:, :-1], names)
    _, teacher = iv.parts[0].teacher.run_with_cache(tokens[:, :-1], names)
    cat = torch.distributions.Categorical
    kl_0 = torch.distributions.kl_divergence(cat(probs=teacher[names[1]][:, 0]), cat(probs=student[names[0]][:, 1])).mean()
    kl_1 = torch.distributions.kl_divergence(cat(probs=teacher[names[0]][:, 0]), cat(probs=student[names[1]][:, 1])).mean()
    for step, want in ((1, 3.0 * kl_1 / 2), (2, 3.0 * (kl_0 + kl_1) / 2)):
        with model.hooks(iv.fwd_hooks()):
            logits = model(tokens[:, :-1])
        torch.testing.assert_close(iv.loss(step, tokens, logits), want)
    blocks = iv.snapshot(model, make_batch(cfg, "eval", 0, 3).tokens[:, :-1])
    assert blocks["distill_source"].tolist() == [[-1, 2], [-1, 0]]  # teacher_layer * 2 + teacher_head
    assert blocks["distill_weight"].tolist() == [[0.0, 3.0], [0.0, 3.0]]


def test_logits_only_distillation_is_the_tempered_kl(templated):
    cfg = config({"distill": {"teacher": templated[0], "attention_weight": 0.0, "logits_weight": 2.0,
                              "temperature": 2.0}})
    model = build_model(cfg, torch.device("cpu"))
    iv = interventions.build(cfg, model, torch.device("cpu"))
    tokens = torch.from_numpy(make_batch(cfg, "train", 3, 4).tokens)  # (B, T+1)
    with model.hooks(iv.fwd_hooks()):
        logits = model(tokens[:, :-1])  # (B, T, V)
    loss = iv.loss(3, tokens, logits)
    with torch.no_grad():
        t_logits = iv.parts[0].teacher(tokens[:, :-1])
    ref = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=t_logits / 2),
                                            torch.distributions.Categorical(logits=logits / 2)).mean()
    torch.testing.assert_close(loss, 2.0 * 4.0 * ref)
    loss.backward()
    assert model.W_U.grad.abs().sum() > 0


def test_teacher_problems_are_config_errors(templated, tmp_path):
    path = templated[0]
    run_id = store.list_runs(path)[0]
    cases = [
        ({"teacher": str(tmp_path / "nope.zarr")}, {}, "intervene.distill.teacher"),
        ({"teacher": path, "run": "rmissing"}, {}, "intervene.distill.run"),
        ({"teacher": path}, {"vocab_size": 24}, "intervene.distill.teacher"),
        ({"teacher": path, "map": "heads", "heads": [{"layer": 0, "head": 0, "teacher_layer": 2, "teacher_head": 0}]},
         {}, r"intervene\.distill\.heads\[0\]\.teacher_layer"),
    ]
    for table, model, key in cases:
        with pytest.raises(ConfigError, match=key):
            interventions.check(config({"distill": table}, model=model))
    # of 9 runs, 8 were named as if they were all
    from tests.test_store import write_run

    store.init_store(tmp_path / "nine.zarr")
    for i in range(9):
        write_run(tmp_path / "nine.zarr", f"r{i}", attrs={"status": "completed"})
    with pytest.raises(ConfigError, match=r"holds 9 runs; name one \(r0, r1, r2, r3, r4, r5, r6, r7, and 1 more\)$"):
        interventions.check(config({"distill": {"teacher": str(tmp_path / "nine.zarr")}}))
    with pytest.raises(ConfigError, match=r"no run 'rnope' in .*nine.zarr \(runs: r0, .*, r7, and 1 more\)$"):
        interventions.check(config({"distill": {"teacher": str(tmp_path / "nine.zarr"), "run": "rnope"}}))
    # an empty store said "holds 0 runs; name one ()"
    store.init_store(tmp_path / "empty.zarr")
    with pytest.raises(ConfigError, match=r"^intervene.distill.teacher: teacher store .*empty.zarr holds no runs$"):
        interventions.check(config({"distill": {"teacher": str(tmp_path / "empty.zarr")}}))
    # a teacher URL whose server refuses the connection said "not a dynamics store" (port 1: nothing listens)
    with pytest.raises(ConfigError, match=r"^intervene.distill.teacher: ftp://127.0.0.1:1/t.zarr: cannot be reached: "):
        interventions.check(config({"distill": {"teacher": "ftp://127.0.0.1:1/t.zarr"}}))
    both = config({"distill": {"teacher": path}, "templates": {"heads": PINNED}})
    with pytest.raises(ConfigError, match="intervene.distill: head"):
        interventions.check(both)
    cfg = config({"distill": {"teacher": path, "run": run_id}})
    iv = interventions.build(cfg, Transformer(cfg.model), torch.device("cpu"))
    iv.load_state_dict(iv.state_dict())
    with pytest.raises(ConfigError, match="intervene.distill.teacher"):
        iv.load_state_dict({"distill": {"teacher_run": run_id, "teacher_step": 1}})


def test_a_teacher_problem_met_at_the_start_is_a_refusal_that_writes_nothing(templated, tmp_path):
    # train_run made the store and a run marked failed, with a traceback, for a teacher that was
    # gone (from Python) or whose checkpoint was damaged; and a resume refused for a remade teacher
    # rewrote the interrupted student as failed.
    import shutil

    from tests.conftest import interrupt_at

    teacher = tmp_path / "teacher.zarr"
    shutil.copytree(templated[0], teacher)
    cfg = config({"distill": {"teacher": str(teacher)}}, train={"seed": 1})
    with pytest.raises(ConfigError, match=r"^intervene.distill.teacher: teacher store .*nope.zarr not found$"):
        train_run(config({"distill": {"teacher": str(tmp_path / "nope.zarr")}}), str(tmp_path / "a.zarr"))
    [ckpt] = teacher.glob("checkpoints/*/ckpt.pt")
    whole = ckpt.read_bytes()
    ckpt.write_bytes(whole[:3000])
    with pytest.raises(ConfigError, match=r"^intervene.distill.teacher: run \w+'s checkpoint in .* is damaged \(3,000 bytes"):
        train_run(cfg, str(tmp_path / "b.zarr"))
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "b.zarr").exists()
    ckpt.write_bytes(whole)

    path = tmp_path / "s.zarr"
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, str(path), progress=interrupt_at(30))
    shutil.rmtree(teacher)  # remade: another run of the same config but its seed
    train(teacher, config({"templates": {"weight": 3.0, "heads": PINNED}}, train={"seed": 2}))
    runs = {p: p.read_bytes() for p in sorted((path / "runs").rglob("*")) if p.is_file()}
    with pytest.raises(ConfigError, match="refusing to resume with another teacher"):
        train_run(cfg, str(path))
    assert {p: p.read_bytes() for p in sorted((path / "runs").rglob("*")) if p.is_file()} == runs
    assert store.run_attrs(str(path), cfg.run_id())["status"] == "interrupted"


def test_a_student_into_its_teachers_store_must_name_the_teacher_run(templated, tmp_path):
    # Its own run group would make the store hold two runs: every later start (rerun, resume, the
    # sweep's next point) was refused for not naming the teacher, and the sweep's workers failed.
    from dynamics.sweep import run_sweep

    path = templated[0]
    teacher_id = store.list_runs(path)[0]
    cfg = config({"distill": {"teacher": path}})
    # the teacher given as a file:// URL to the same folder was taken for another store
    url = config({"distill": {"teacher": "file://" + path}})
    with pytest.raises(ConfigError, match="intervene.distill.run: required"):
        interventions.check_output(url, path)
    for out in (path, path + "/"):
        with pytest.raises(ConfigError, match=f"intervene.distill.run: required .* name the teacher run "
                                              f"\\(run = '{teacher_id}'\\)"):
            train_run(cfg, out)
    swept = with_values(cfg, {"sweep.train.seed": [1, 2]})
    with pytest.raises(ConfigError, match="intervene.distill.run: required"):
        run_sweep(swept, path, workers=1)
    assert store.list_runs(path) == [teacher_id]
    interventions.check_output(cfg, str(tmp_path / "elsewhere.zarr"))  # another store: no run needed
    interventions.check_output(config({"distill": {"teacher": path, "run": teacher_id}}), path)


def test_a_teacher_with_default_conditioned_gates_is_refused(tmp_path):
    # An empty [intervene.conditioned_gates] table (every option at its default) still gates the
    # teacher's heads; its checkpoint alone is another network.
    path = tmp_path / "gated_teacher.zarr"
    train(path, config({"conditioned_gates": {}}, train={"steps": 2}))
    with pytest.raises(ConfigError, match="change its forward pass"):
        interventions.check(config({"distill": {"teacher": str(path)}}))
    assert interventions.common.forward_changes({"conditioned_gates": {}}) == ["conditioned gates"]
    assert interventions.common.forward_changes({"templates": {"heads": PINNED}, "distill": {}}) == []


# ----------------------------------------------------------------------------- conditioned gates


def test_conditioned_gates_vary_across_probes_and_are_recorded(gated):
    g = gated["conditioned_gate"]
    assert g.dims == ("snapshot", "layer", "head", "probe")
    assert g.shape == (gated.sizes["snapshot"], 2, 2, 4)
    final = g.isel(snapshot=-1).values
    assert np.all((final > 0) & (final < 1))
    assert final.std(-1).mean() > 5e-3  # input-conditioned: probes get different gates
    assert np.allclose(g.isel(snapshot=0).values, 0.5)  # W starts at 0: a static gate sigmoid(init)
    assert gated["conditioned_gate_ema"].dims == ("snapshot", "layer", "head")


def test_a_lost_chunk_of_an_interventions_array_is_named(templated, students, gated, tmp_path, tmp_path_factory):
    # check_recorded looked only at attention, gradients, gate, eval loss and weights: a lost
    # template_kl, conditioned_gate or distill_source chunk read as NaN (distill_source as -1,
    # "no teacher head") in analyse, report and predict, without a word.
    import shutil

    made = tmp_path_factory.getbasetemp()
    for ds, where, name in ((templated[1], "teacher[0-9]*/teacher.zarr", "template_kl"),
                            (students["distilled"], "students[0-9]*/students.zarr", "distill_source"),
                            (gated, "gated[0-9]*/gated.zarr", "conditioned_gate")):
        run_id = ds.attrs["run_id"]
        [made_at] = made.glob(where)
        path = tmp_path / f"{name}.zarr"
        shutil.copytree(made_at, path)
        store.check_recorded(path, run_id)
        chunks = sorted(p for p in (path / "runs" / run_id / name / "c").rglob("*") if p.is_file())
        assert len(chunks) == ds.sizes["snapshot"]  # one a snapshot, whatever its values
        chunks[1].unlink()
        with pytest.raises(store.StoreError, match=rf"run {run_id}: array {name} at snapshot 1 \(step 25\): its chunk "):
            store.check_recorded(path, run_id)


@pytest.mark.parametrize("pool", ["causal", "mean"])
def test_causal_gates_never_see_later_tokens(pool):
    cfg = config({"conditioned_gates": {"pool": pool}})
    model = build_model(cfg, torch.device("cpu"))
    iv = interventions.build(cfg, model, torch.device("cpu"))
    with torch.no_grad():
        iv.parts[0].W.normal_(0, 1.0, generator=torch.Generator().manual_seed(0))
    a = torch.from_numpy(make_batch(cfg, "train", 0, 1).tokens[:, :-1])  # (1, T)
    b = a.clone()
    b[0, -1] = (a[0, -1] + 1) % cfg.model.vocab_size  # change only the last token
    with torch.no_grad(), model.hooks(iv.eval_hooks()):
        la, lb = model(a), model(b)  # (1, T, V)
    same = torch.equal(la[:, :-1], lb[:, :-1])
    assert same if pool == "causal" else not same  # mean pooling leaks, as documented


def test_chg_recorded_in_training_is_fitted_to_the_gated_network(tmp_path):
    # Layer 1's static gates sit at sigmoid(-8) ~ 3e-4: in the trained network those heads do
    # nothing, so CHG must call them irrelevant (G+ open, G- shut). Fitted to the bare weights,
    # as it was before the hooks wrapped the fit, they read as interfering (G+ 0.35, G- 5e-5).
    from dynamics.gates import IRRELEVANT

    cfg = config({"conditioned_gates": {"conditioned": False, "layers": [1], "init": -8.0}},
                 record={"chg_every": 2, "chg_steps": 100})  # fits at steps 0 and 50 (the last), not 25 too
    ds = train(tmp_path / "g.zarr", cfg)
    assert ds.chg.notnull().any(["layer", "head", "fit"]).values.tolist() == [True, False, True]
    assert (ds.chg_role.values[-1, 1] == IRRELEVANT).all()
    assert (ds.chg.values[-1, 1, :, 0] > 0.99).all() and (ds.chg.values[-1, 1, :, 1] < 0.01).all()


def test_static_gate_baseline_has_no_input_weights():
    cfg = config({"conditioned_gates": {"conditioned": False, "layers": [1]}})
    iv = interventions.build(cfg, Transformer(cfg.model), torch.device("cpu"))
    assert [tuple(p.shape) for p in iv.parameters()] == [(1, 2)]


# ----------------------------------------------------------------------------- options and state


@pytest.mark.parametrize("table, key", [
    ({"bogus": {}}, "intervene: unknown section 'bogus'"),
    ({"templates": {"heads": PINNED, "wieght": 1.0}}, "intervene.templates.wieght"),
    ({"templates": {}}, "intervene.templates.heads"),
    ({"templates": {"heads": [{"layer": 2, "head": 0, "pattern": "uniform"}]}}, r"heads\[0\]\.layer"),
    ({"templates": {"heads": [{"layer": 0, "head": 7, "pattern": "uniform"}]}}, r"heads\[0\]\.head"),
    ({"templates": {"heads": [{"layer": 0, "head": 0, "pattern": "diagonal"}]}}, r"heads\[0\]\.pattern"),
    ({"templates": {"heads": [{"layer": 0, "head": 0, "pattern": "offset", "delta": 16}]}}, r"heads\[0\]\.delta"),
    # past the context (16) the band is every causal key, as at 16: another run id, the same training
    ({"templates": {"heads": [{"layer": 0, "head": 0, "pattern": "local", "width": 17}]}},
     r"heads\[0\]\.width: must be in \[1, model.context = 16\], got 17"),
    ({"templates": {"heads": PINNED + PINNED[:1]}}, r"heads\[2\]"),
    ({"templates": {"heads": PINNED, "weight": "lots"}}, "intervene.templates.weight"),
    ({"templates": {"heads": PINNED, "weight": -1.0}}, "intervene.templates.weight"),
    ({"templates": {"heads": PINNED, "schedule": "cyclic"}}, "intervene.templates.schedule"),
    ({"distill": {}}, "intervene.distill.teacher"),
    ({"distill": {"teacher": "x.zarr", "map": "nearest"}}, "intervene.distill.map"),
    ({"distill": {"teacher": "x.zarr", "map": "heads", "heads": [{"layer": 0, "head": 0, "role": "oracle"}]}},
     r"intervene\.distill\.heads\[0\]\.role"),
    ({"distill": {"teacher": "x.zarr", "map": "heads", "heads": [{"layer": 0, "head": 0}]}},
     r"intervene\.distill\.heads\[0\]"),
    ({"distill": {"teacher": "x.zarr", "temperature": 0.0}}, "intervene.distill.temperature"),
    # tau^2 overflowed a Python float after the store was made; 1e20 and 1e-300 recorded a run diverged at step 0
    ({"distill": {"teacher": "x.zarr", "temperature": 1e300}}, "intervene.distill.temperature: must be within"),
    ({"distill": {"teacher": "x.zarr", "temperature": 1e-300}}, r"intervene.distill.temperature: must be in \[5.42e-20,"),
    ({"distill": {"teacher": "x.zarr", "temperature": 1e20}}, r"intervene.distill.temperature: must be in .*, 1.84e\+19\]"),
    # past float32 every option's tensor is inf: recorded diverged at step 0
    ({"templates": {"heads": PINNED, "weight": 1e39}}, r"intervene.templates.weight: must be within \+-3.403e\+38"),
    ({"distill": {"teacher": "x.zarr", "attention_weight": 1e300}}, "intervene.distill.attention_weight: must be within"),
    ({"conditioned_gates": {"variance_weight": -1e300}}, "intervene.conditioned_gates.variance_weight: must be within"),
    ({"distill": {"teacher": "x.zarr", "order": "random"}}, "intervene.distill.order"),
    ({"conditioned_gates": {"layers": [3]}}, r"intervene\.conditioned_gates\.layers\[0\]"),
    ({"conditioned_gates": {"pool": "max"}}, "intervene.conditioned_gates.pool"),
    ({"conditioned_gates": {"ema_decay": 1.0}}, "intervene.conditioned_gates.ema_decay"),
    ({"conditioned_gates": {"ema_mix": 2.0}}, "intervene.conditioned_gates.ema_mix"),
    ({"conditioned_gates": {"ema_mix": 1.0}}, "intervene.conditioned_gates.ema_mix"),  # nothing would train
    ({"conditioned_gates": {"init": 1e39}}, "intervene.conditioned_gates.init"),  # overflowed float32 mid-run
    # TOML integers are unbounded: an OverflowError traceback from math.isfinite, and a width
    # numpy could not hold, after the store was made
    ({"templates": {"heads": PINNED, "weight": 10**400}},
     "intervene.templates.weight: expected a finite number, got an integer beyond the float range"),
    ({"templates": {"heads": [{"layer": 0, "head": 0, "pattern": "local", "width": 10**20}]}},
     r"heads\[0\]\.width: expected an integer within \+-2\*\*63, got 100000000000000000000"),
])
def test_bad_options_name_the_key(table, key):
    with pytest.raises(ConfigError, match=key):
        interventions.parse(config(table))


def test_bad_template_exits_2_from_the_cli(tiny_config, tmp_path, capsys):
    path = tiny_config(extra='\n[intervene.templates]\nheads = [{ layer = 0, head = 9, pattern = "uniform" }]\n')
    assert main(["run", path, "--out", str(tmp_path / "s.zarr")]) == 2
    assert "intervene.templates.heads[0].head" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["templates", "conditioned_gates", "distill"])
def test_shipped_experiment_configs_parse(name):
    opts = interventions.parse(load_config(Path(__file__).parents[1] / "experiments" / f"{name}.toml"))
    assert getattr(opts, "distill" if name == "distill" else name.removesuffix("_free")) is not None


def test_state_dict_round_trip_resumes_exactly():
    """Checkpoint mid-run the way train.py does, restore into fresh objects, redo the steps: same result."""
    cfg = config({"conditioned_gates": {"ema_mix": 0.5, "ema_decay": 0.5, "init": 0.0},
                  "templates": {"heads": PINNED, "schedule": "warmup"}})
    device = torch.device("cpu")

    def fresh():
        model = build_model(cfg, device)
        iv = interventions.build(cfg, model, device)
        return model, iv, make_optimizer(cfg, model, iv.parameters())

    def step(model, iv, opt, s, probe):
        _train_step(cfg, model, iv, opt, s)
        blocks = iv.snapshot(model, probe)
        blob = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "iv": iv.state_dict()}, blob)
        opt.step()
        return blocks, blob.getvalue()

    probe = make_batch(cfg, "probe", 0, 4).tokens[:, :-1]
    model, iv, opt = fresh()
    ckpt = None
    for s in range(5):
        blocks, blob = step(model, iv, opt, s, probe)
        ckpt = blob if s == 2 else ckpt
    model2, iv2, opt2 = fresh()
    state = torch.load(io.BytesIO(ckpt), weights_only=False)
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["opt"])
    iv2.load_state_dict(state["iv"])
    for s in range(2, 5):  # a resume re-runs the checkpointed step
        blocks2, _ = step(model2, iv2, opt2, s, probe)
    for name in blocks:
        np.testing.assert_array_equal(blocks[name], blocks2[name], err_msg=name)
    for a, b in zip(iv.parameters(), iv2.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(iv.parts[1].ema, iv2.parts[1].ema)
    with pytest.raises(ConfigError, match="intervene"):
        iv2.load_state_dict({"templates": {}})


def test_gate_ema_tracks_the_heads_own_gate_and_snapshot_s_has_seen_s_updates():
    """m_{s+1} = d m_s + (1 - d) mean gbar_s with gbar the raw gate; snapshot s records m_s, the EMA step s applied."""
    d, a = 0.5, 0.5
    cfg = config({"conditioned_gates": {"conditioned": False, "init": 0.0, "ema_decay": d, "ema_mix": a}},
                 train={"lr": 0.1, "warmup_steps": 0})
    device = torch.device("cpu")
    model = build_model(cfg, device)
    iv = interventions.build(cfg, model, device)
    opt = make_optimizer(cfg, model, iv.parameters())
    probe = make_batch(cfg, "probe", 0, 4).tokens[:, :-1]
    emas, own = [], []
    for s in range(4):
        _train_step(cfg, model, iv, opt, s)
        blocks = iv.snapshot(model, probe)
        g = torch.sigmoid(iv.parts[0].b.detach()).numpy()  # (L, H): W = 0, so every input's own gate
        emas.append(blocks["conditioned_gate_ema"])
        own.append(g)
        # the probes got the gate this step's training forward applied
        np.testing.assert_allclose(blocks["conditioned_gate"], ((1 - a) * g + a * emas[-1])[..., None].repeat(4, -1),
                                   rtol=1e-6)
        opt.step()
    np.testing.assert_array_equal(emas[0], np.full((2, 2), 0.5, dtype=np.float32))  # sigmoid(init): no update yet
    assert not np.allclose(own[1], own[0])  # b moved, so the two definitions differ
    for s in range(3):
        np.testing.assert_allclose(emas[s + 1], d * emas[s] + (1 - d) * own[s], rtol=1e-6)


def test_template_kl_is_recorded_for_a_hard_head_beside_a_soft_one():
    # template_kl of a hard head is the attention it would have had (README): scored beside a soft
    # head of its layer too, not NaN there
    from dynamics.interventions import kl_rows, templates

    cfg = from_dict({"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16}, "task": {"name": "markov"}})
    opts = templates.parse(cfg, {"heads": [{"layer": 0, "head": 0, "pattern": "previous_token", "hard": True},
                                           {"layer": 0, "head": 1, "pattern": "uniform"}]})
    t = templates.Templates(opts, cfg, torch.device("cpu"))
    T = 8
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 2, T, T, generator=g).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    out = t.blocks(torch.zeros(3, T, dtype=torch.long), torch.zeros(3, T, 16), {0: scores})
    kl = out["template_kl"]
    for h, kind in ((0, "previous_token"), (1, "uniform")):
        tmpl = torch.tensor(templates.template_pattern(kind, T), dtype=torch.float32)
        expect = kl_rows(tmpl, scores[:, h].log_softmax(-1)).mean().item()
        assert kl[0, h] == pytest.approx(expect, rel=1e-5)
    assert np.isnan(kl[1]).all()


def test_a_head_both_pinned_and_distilled_is_refused_by_its_student_index(tmp_path):
    # a student head pinned and distilled has two targets, whatever its teacher head's index: a
    # check against the teacher's indices let (0, 1) from teacher (1, 0) through
    from dynamics import interventions
    from dynamics.train import train_run

    base = {"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16}, "task": {"name": "markov"},
            "train": {"steps": 4, "batch_size": 4, "lr": 3e-3, "warmup_steps": 1, "eval_batches": 1},
            "record": {"dense_until": 0, "every": 2, "n_probe": 2, "eval_batch_size": 4, "head_weights": "off"}}
    path = str(tmp_path / "teacher.zarr")
    assert train_run(from_dict(base), path).status == "completed"
    conflict = {**base, "intervene": {
        "templates": {"heads": [{"layer": 0, "head": 1, "pattern": "uniform"}]},
        "distill": {"teacher": path, "map": "heads", "heads": [{"layer": 0, "head": 1, "teacher_layer": 1, "teacher_head": 0}]}}}
    with pytest.raises(ConfigError, match="also pinned"):
        interventions.check(from_dict(conflict))
    fine = {**base, "intervene": {
        "templates": {"heads": [{"layer": 1, "head": 0, "pattern": "uniform"}]},
        "distill": {"teacher": path, "map": "heads", "heads": [{"layer": 0, "head": 1, "teacher_layer": 1, "teacher_head": 0}]}}}
    interventions.check(from_dict(fine))  # a teacher head's index may equal a pinned student head's
