"""The grid (dynamics.sweep.grid): expand_grid's points, their run ids and its refusals, each with its known message."""

import json

import pytest

from dynamics.config import ConfigError, from_dict, load_config, with_values
from dynamics.limits import MAX_POINTS
from dynamics.sweep.grid import expand_grid
from tests.test_sweep import ROOT, tiny


def test_a_grid_of_exactly_max_points_is_let_through_to_its_points_checks():
    # The bound is "more than MAX_POINTS": a grid of exactly that many goes on to have its points
    # checked, and its first point (3 heads do not divide d_model 64) is the error, found at once.
    with pytest.raises(ConfigError, match=r"^sweep point model.n_heads=3, train.seed=0: model.n_heads: 3 does not "
                                          r"divide model.d_model 64"):
        expand_grid(from_dict({"sweep": {"model.n_heads": [3], "train.seed": list(range(MAX_POINTS))}}))


def test_points_alike_but_for_an_unread_key_name_only_that_key():
    # crossed with a seed axis: the pair shares its seed, and naming train.seed as a difference
    # too would send the user to an axis that is not the problem
    with pytest.raises(ConfigError, match=r"^sweep points task.delta=2, train.seed=0 and task.delta=3, train.seed=0 "
                                          r"train the same data and model: they differ only in task.delta, which "
                                          r"induction does not read$"):
        expand_grid(from_dict({"sweep": {"task.delta": [2, 3], "train.seed": [0, 1]}}))


def test_points_alike_but_for_an_unread_task_key_and_an_unread_setting_name_both_readers():
    # zipped: the pair differs in task.delta (induction does not read it) and in model.d_mlp (an
    # attention-only model does not): naming induction alone left d_mlp unexplained
    raw = {"model": {"attn_only": True},
           "sweep": {"task.delta": [2, 3], "model.d_mlp": [64, 128], "zip": [["task.delta", "model.d_mlp"]]}}
    with pytest.raises(ConfigError, match=r"they differ only in task.delta, model.d_mlp, which an attention-only "
                                          r"model \(model.attn_only = true\) does not read, nor induction$"):
        expand_grid(from_dict(raw))


def test_full_grid_crosses_axes_in_order():
    cfg = from_dict(tiny({"model.init_scale": [0.5, 1.0, 2.0], "train.seed": [0, 1]}))
    points = expand_grid(cfg)
    assert [tuple(p.values.values()) for p in points] == [
        (0.5, 0), (0.5, 1), (1.0, 0), (1.0, 1), (2.0, 0), (2.0, 1)]
    for p in points:
        assert list(p.values) == ["model.init_scale", "train.seed"]
        assert p.cfg.model.init_scale == p.values["model.init_scale"]
        assert p.cfg.train.seed == p.values["train.seed"]
        assert p.cfg.sweep.axes == {}
        assert p.run_id == p.cfg.run_id() == with_values(cfg, p.values).run_id()
    assert len({p.run_id for p in points}) == 6
    assert [p.run_id for p in expand_grid(cfg)] == [p.run_id for p in points]  # stable


def test_a_setting_a_point_does_not_read_is_left_out_of_its_run_id():
    # pos = "learned" does not read rope_base: swept again under --set model.rope_base=100 the
    # learned point got another run id, trained bitwise alike, and status read rope_base as mattering.
    plain = expand_grid(from_dict(tiny({"model.pos": ["rope", "learned"]})))
    based = expand_grid(from_dict(tiny({"model.pos": ["rope", "learned"]}, model={"rope_base": 100.0})))
    assert plain[0].run_id != based[0].run_id and based[0].cfg.model.rope_base == 100.0  # rope reads it
    assert plain[1].run_id == based[1].run_id and based[1].cfg.model.rope_base == 10000.0
    assert based[1].cfg == plain[1].cfg


def test_a_point_records_its_values_as_its_config_holds_them():
    # init_scale written 1 is 1.0 in the run's config and id; recorded as written, a sweep of
    # [1, 2] and one of [1.0, 2.0] into one store read as four points, "1" and "1.0", in status,
    # the report and predict's groups.
    ints = expand_grid(from_dict(tiny({"model.init_scale": [1, 2]})))
    floats = expand_grid(from_dict(tiny({"model.init_scale": [1.0, 2.0]})))
    assert [p.run_id for p in ints] == [p.run_id for p in floats]
    for p, q in zip(ints, floats, strict=True):
        assert p.values == q.values and type(p.values["model.init_scale"]) is float


def test_zip_pairs_axes_and_crosses_the_rest():
    cfg = from_dict(tiny({"model.n_heads": [1, 2], "train.seed": [0, 1, 2], "model.init_scale": [0.5, 1.0, 2.0],
                          "zip": [["train.seed", "model.init_scale"]]}))
    points = expand_grid(cfg)
    assert len(points) == 6
    pairs = {(p.values["train.seed"], p.values["model.init_scale"]) for p in points}
    assert pairs == {(0, 0.5), (1, 1.0), (2, 2.0)}
    assert [p.values["model.n_heads"] for p in points] == [1, 1, 1, 2, 2, 2]
    assert len({p.run_id for p in points}) == 6


def test_run_id_is_the_resolved_config_id():
    """The same point reached with --set on a config without a sweep table is the same run."""
    cfg = from_dict(tiny({"train.seed": [3, 4], "task.min_period": [2, 3]}))
    point = expand_grid(cfg)[-1]
    single = from_dict(tiny(train={"seed": 4}, task={"min_period": 3}))
    assert point.run_id == single.run_id()
    assert point.label == "train.seed=4, task.min_period=3"


def test_no_axes_is_the_base_point():
    cfg = from_dict(tiny())
    [point] = expand_grid(cfg)
    assert point.values == {} and point.run_id == cfg.run_id() and point.label == "base"


def test_list_valued_axis_round_trips():
    cfg = from_dict(tiny({"task.components": [["induction", "markov"], ["markov"]]}, task={"name": "mixture", "components": ["induction"]}))
    points = expand_grid(cfg)
    assert [p.values["task.components"] for p in points] == [["induction", "markov"], ["markov"]]
    assert points[0].cfg.task.components == ("induction", "markov")
    json.dumps([p.values for p in points])


def test_invalid_point_is_named():
    cfg = from_dict(tiny({"model.n_heads": [2, 3], "train.seed": [0]}))
    with pytest.raises(ConfigError, match=r"^sweep point model.n_heads=3, train.seed=0: model.n_heads: 3 does not divide"):
        expand_grid(cfg)


def test_a_point_whose_corpus_split_has_no_windows_is_named():
    cfg = from_dict(tiny({"task.holdout": [0.1, 1e-9]}, task={"name": "corpus"}, model={"vocab_size": 256}))
    with pytest.raises(ConfigError, match=r"^sweep point task.holdout=1e-09: task.holdout: 1e-09 leaves no held-out"):
        expand_grid(cfg)


def test_points_that_are_the_same_run_are_refused():
    for axis in ({"train.device": ["cpu", "cuda"]}, {"train.seed": [0, 1, 0]}):
        with pytest.raises(ConfigError, match="are the same experiment .* a value repeats, or they differ only in"):
            expand_grid(from_dict(tiny(axis)))


def test_an_axis_over_a_task_key_the_task_does_not_read_is_refused():
    # task.delta under induction: two runs of bitwise the same data and model under two run ids,
    # read as "delta has no effect"
    with pytest.raises(ConfigError, match=r"^sweep points task.delta=2 and task.delta=3 train the same data and "
                                          r"model: they differ only in task.delta, which induction does not read$"):
        expand_grid(from_dict(tiny({"task.delta": [2, 3]})))
    crossed = tiny({"task.name": ["offset_copy", "induction"], "task.p": [0.5, 0.9]})
    with pytest.raises(ConfigError, match=r'task.name="induction", task.p=0.5 and task.name="induction", task.p=0.9'):
        expand_grid(from_dict(crossed))
    # read by a component of the mixture, or zipped with the task that reads it: every point differs
    mixture = tiny({"task.delta": [2, 3]}, task={"name": "mixture", "components": ["induction", "offset_copy"]})
    assert len(expand_grid(from_dict(mixture))) == 2
    crossed["sweep"]["zip"] = [["task.name", "task.p"]]
    assert len(expand_grid(from_dict(crossed))) == 2
    # set in the base config, read by no point: every run id changes, and no run trains with it
    with pytest.raises(ConfigError, match=r"^task.delta = 5: no point of the sweep trains a task that reads it "
                                          r"\(only offset_copy does\)"):
        expand_grid(from_dict(tiny({"train.seed": [0, 1]}, task={"name": "induction", "delta": 5})))
    assert len(expand_grid(from_dict(tiny({"task.name": ["induction", "offset_copy"]}, task={"delta": 5})))) == 2


def test_learned_gate_keys_under_fixed_gates_are_refused_as_unread():
    # gate_init and gate_l1 are read by learned gates alone: under fixed gates an axis over them
    # trained one run several times under several run ids
    with pytest.raises(ConfigError, match=r"differ only in model.gate_l1, which fixed gates \(model.gates = "
                                          r"\"fixed\"\) do not read$"):
        expand_grid(from_dict(tiny({"model.gate_l1": [0.01, 0.1]})))
    with pytest.raises(ConfigError, match=r"^model.gate_init = 5.0: no point of the sweep reads it \(fixed gates "
                                          r"\(model.gates = \"fixed\"\) do not read it\), so every run .* or sweep "
                                          r"model.gates$"):
        expand_grid(from_dict(tiny({"train.seed": [0, 1]}, model={"gate_init": 5.0})))
    assert len(expand_grid(from_dict(tiny({"model.gate_l1": [0.01, 0.1]}, model={"gates": "learned"})))) == 2
    crossed = tiny({"model.gates": ["fixed", "learned"]}, model={"gate_init": 5.0})  # read by the learned point
    assert len(expand_grid(from_dict(crossed))) == 2


def test_settings_read_only_under_a_condition_are_refused_where_no_point_reads_them():
    # TINY is attention-only: an axis over d_mlp trained one run twice, reading as "d_mlp has no effect"
    with pytest.raises(ConfigError, match=r"differ only in model.d_mlp, which an attention-only model "
                                          r"\(model.attn_only = true\) does not read$"):
        expand_grid(from_dict(tiny({"model.d_mlp": [64, 128]})))
    assert len(expand_grid(from_dict(tiny({"model.d_mlp": [64, 128]}, model={"attn_only": False})))) == 2
    sgd = {"optimizer": "sgd"}
    with pytest.raises(ConfigError, match=r"differ only in train.beta2, which SGD \(train.optimizer = \"sgd\"\)"):
        expand_grid(from_dict(tiny({"train.beta2": [0.9, 0.99]}, train=sgd)))
    with pytest.raises(ConfigError, match=r"^record.chg_steps = 5: no point of the sweep reads it .* or sweep "
                                          r"record.chg_every$"):
        expand_grid(from_dict(tiny({"train.seed": [0, 1]}, record={"chg_steps": 5})))
    # read by one point: both train differently
    crossed = tiny({"model.pos": ["rope", "learned"]}, model={"rope_base": 500.0})
    assert len(expand_grid(from_dict(crossed))) == 2
    # two kinds at once are both named
    both = tiny({"model.d_mlp": [64, 128], "model.gate_l1": [0.01, 0.5], "zip": [["model.d_mlp", "model.gate_l1"]]})
    with pytest.raises(ConfigError, match=r"which an attention-only model \(model.attn_only = true\) does not read, "
                                          r"nor which fixed gates \(model.gates = \"fixed\"\) do not read$"):
        expand_grid(from_dict(both))


def test_points_whose_tasks_come_to_the_same_data_are_refused():
    import numpy as np

    from dynamics.tasks import make_batch

    # equal weights, however written, draw the same rows; a mixture of one component makes the
    # very batches of that task: each pair trained bitwise the same run under two run ids
    mix = {"name": "mixture", "components": ["induction", "markov"]}
    with pytest.raises(ConfigError, match=r"^sweep points task.weights=\[\] and task.weights=\[1, 1\] train the "
                                          r"same data and model: they differ only in task.weights, which come to "
                                          r"the same training \(mixture weights count as the probabilities"):
        expand_grid(from_dict(tiny({"task.weights": [[], [1, 1], [2, 2]]}, task=mix)))
    assert len(expand_grid(from_dict(tiny({"task.weights": [[1, 2], [2, 1], [2, 4.5]]}, task=mix)))) == 3
    one = tiny({"task.name": ["induction", "mixture"], "task.components": [[], ["induction"]],
                "zip": [["task.name", "task.components"]]})
    with pytest.raises(ConfigError, match=r"differ only in task.name, task.components, which come to the same training \(mixture"):
        expand_grid(from_dict(one))
    plain = from_dict(tiny())
    alone = from_dict(tiny(task={"name": "mixture", "components": ["induction"]}))
    for split in ("train", "eval", "probe"):  # the known answer the refusal rests on
        a, b = make_batch(plain, split, 3, 8), make_batch(alone, split, 3, 8)
        np.testing.assert_array_equal(a.tokens, b.tokens)


@pytest.mark.parametrize("axis, same, other, why", [
    ("model.d_head", [0, 8], [8, 4], r"d_head 0 is d_model / n_heads"),
    ("record.head_weights", ["auto", "on"], ["on", "off"], r'head_weights "auto" is "on" up to d_model 256'),
    ("record.every", [13, 20], [6, 5], r"record.every and record.dense_until count as the snapshot steps they give"),
    ("record.dense_until", [4, 7], [4, 8], r"record.every and record.dense_until count as the snapshot steps"),
    # CHG fitted at snapshots 0 and 5 for both (record.chg_fitted: the known answer below), 0, 4, 5 for 4
    ("record.chg_every", [5, 9], [4, 5], r"a chg_every at or past the last snapshot's index fits CHG at the first"),
])
def test_points_whose_settings_resolve_alike_are_refused(axis, same, other, why):
    # Each pair recorded bitwise the same arrays under two run ids (d_model 16, 2 heads; 12 steps,
    # snapshots 0, 1, 2, 4, 6 and 12 at dense_until 4 and every 6, none of every 13 or 20)
    label = axis.split(".")[-1]
    with pytest.raises(ConfigError, match=rf"^sweep points {axis}=.* train the same data and model: they differ only "
                                          rf"in {axis}, which come to the same training \(.*{why}"):
        expand_grid(from_dict(tiny({axis: same})))
    assert len(expand_grid(from_dict(tiny({axis: other})))) == 2, label


def test_chg_every_past_the_last_snapshot_fits_what_the_last_snapshots_index_fits():
    from dynamics.budget import snapshot_steps
    from dynamics.record import chg_fitted

    steps = snapshot_steps(12, 4, 6)
    assert steps.tolist() == [0, 1, 2, 4, 6, 12]
    fitted = {k: chg_fitted(from_dict(tiny(record={"chg_every": k})), steps).nonzero()[0].tolist()
              for k in (4, 5, 9, 10**6)}
    assert fitted == {4: [0, 4, 5], 5: [0, 5], 9: [0, 5], 10**6: [0, 5]}


def test_min_lr_frac_points_alike_when_no_update_reaches_the_decay_are_refused():
    from dynamics.train import lr_at

    # the known answer: warm-up over the first 11 of 12 updates, the 12th at lr itself
    a, b = (from_dict(tiny(train={"warmup_steps": 11, "min_lr_frac": f})) for f in (0.1, 0.5))
    assert [lr_at(a, s) for s in range(12)] == [lr_at(b, s) for s in range(12)]
    with pytest.raises(ConfigError, match=r"differ only in train.min_lr_frac, which come to the same training \(the "
                                          r"cosine decay to min_lr_frac starts after the last update"):
        expand_grid(from_dict(tiny({"train.min_lr_frac": [0.1, 0.5]}, train={"warmup_steps": 11})))
    assert len(expand_grid(from_dict(tiny({"train.min_lr_frac": [0.1, 0.5]}, train={"warmup_steps": 10})))) == 2


def test_mixture_weights_alike_but_for_ints_and_floats_name_the_axis():
    # [1, 3] == [1.0, 3.0] in Python: "they differ only in , which ..." named nothing
    mix = {"name": "mixture", "components": ["induction", "markov"]}
    with pytest.raises(ConfigError, match=r"they differ only in task.weights, which come to the same training"):
        expand_grid(from_dict(tiny({"task.weights": [[1, 3], [1.0, 3.0]]}, task=mix)))


def test_each_point_intervention_is_checked_before_any_work():
    raw = tiny({"train.seed": [0, 1]})
    raw["intervene"] = {"templates": {"heads": [{"layer": 5, "head": 0, "pattern": "uniform"}]}}
    with pytest.raises(ConfigError, match=r"^sweep point train.seed=0: .*layer 5"):
        expand_grid(from_dict(raw))


def test_experiment_configs_are_valid_sweeps():
    for name in ("quickstart", "init_scale", "learning_rate", "head_count", "positional"):
        cfg = load_config(ROOT / "experiments" / f"{name}.toml")
        points = expand_grid(cfg)
        assert len(cfg.sweep.axes["train.seed"]) >= 3, name
        assert len(points) >= 8, name
    quick = load_config(ROOT / "experiments" / "quickstart.toml")
    assert len(quick.sweep.axes) >= 2
    assert load_config(ROOT / "experiments" / "init_scale.toml").sweep.axes["model.init_scale"] == (
        0.25, 0.5, 1.0, 2.0, 4.0)
    heads = load_config(ROOT / "experiments" / "head_count.toml")
    assert heads.model.d_model == 64 and heads.sweep.axes["model.n_heads"] == (2, 4, 8, 16)
    assert load_config(ROOT / "experiments" / "positional.toml").sweep.axes["model.pos"] == ("rope", "learned", "none")
