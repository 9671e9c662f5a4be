"""What enters a run id, and what a rerun under one id may skip: configs that train different
arrays under one id (a rerun skips the run it should train, or reports another's), the rules
that keep a sweep's points apart, and the config checks those rely on."""

import re
import shutil

import pytest

from dynamics import store
from dynamics.config import ConfigError, RunConfig, from_dict, load_config, with_values
from dynamics.train import train_run
from tests.conftest import TINY

SMALL = {"model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_mlp": 32, "vocab_size": 16, "context": 16},
         "task": {"min_period": 2, "max_period": 6},
         "train": {"steps": 4, "warmup_steps": 2, "batch_size": 4},
         "record": {"dense_until": 2, "every": 3, "n_probe": 2, "eval_batch_size": 4}}


def small(**sections) -> dict:
    raw = {k: dict(v) for k, v in SMALL.items()}
    for section, table in sections.items():
        raw.setdefault(section, {}).update(table)
    return raw


def test_a_finished_student_of_another_teacher_is_refused_not_skipped(tmp_path):
    # The same student config (teacher named by path, run omitted) names another teacher once the
    # teacher store is remade: same run id, so the rerun said "already completed" of a run
    # distilled from a teacher that is no longer the one the config names.
    teacher, out = tmp_path / "t.zarr", str(tmp_path / "s.zarr")
    first = train_run(from_dict(small()), str(teacher)).run_id
    student = from_dict(small(intervene={"distill": {"teacher": str(teacher)}}))
    assert train_run(student, out).status == "completed"
    assert train_run(student, out).skipped  # the same teacher: skipped, as before
    shutil.rmtree(teacher)
    second = train_run(from_dict(small(train={"seed": 5})), str(teacher)).run_id
    assert second != first
    with pytest.raises(store.StoreError, match=f"distilled from teacher run {first}.*names run {second}"):
        train_run(student, out)
    # The sweep launcher skips finished points itself, never reaching train_run: the same refusal
    # there, before any point trains (it said "1 already finished, not retrained").
    from dynamics.sweep.launcher import run_sweep

    with pytest.raises(store.StoreError, match=f"sweep point .*distilled from teacher run {first}.*names run {second}"):
        run_sweep(student, out)


def test_a_refusal_names_the_settings_that_differ_an_empty_table_among_them():
    from dynamics.identity import identity_difference

    base = {"train": {"lr": 0.1, "steps": 5, "device": "cpu"}}
    assert identity_difference(base, {"train": {"lr": 0.2, "steps": 5, "device": "cuda"}}) == \
        "train.lr: recorded 0.1, here 0.2"  # where it runs is no difference
    # a store from before [intervene]: an empty table against none read as "a different config ()"
    assert identity_difference(base, {**base, "intervene": {}}) == "intervene: recorded none, here {}"
    many = {"train": {k: 1 for k in "abcde"}}
    assert identity_difference(many, {"train": {k: 2 for k in "abcde"}}) == (
        "train.a: recorded 1, here 2; train.b: recorded 1, here 2; train.c: recorded 1, here 2; 2 more")


@pytest.mark.parametrize("key", ["model", "task", "train", "record"])
def test_every_setting_but_device_and_threads_enters_the_run_id(key):
    # Each field set to another valid value changes the id: a dropped key would train two
    # configs under one id. Device and threads are the exceptions (where, not what).
    from dataclasses import fields

    from dynamics.config import SECTIONS

    others = {int: lambda v: v + 1, float: lambda v: v / 2 if v else 0.5, bool: lambda v: not v,
              str: lambda v: v + "x", tuple: lambda v: ("induction",)}
    base = from_dict({}).to_dict()
    for f in fields(SECTIONS[key]):
        default = base[key][f.name]
        changed = {s: dict(t) for s, t in base.items() if s != "sweep"}
        changed[key][f.name] = others[type(default) if not isinstance(default, list) else tuple](
            tuple(default) if isinstance(default, list) else default)
        same = f"{key}.{f.name}" in ("train.device", "train.threads")
        # not validated: only the hash of the dict is under test here
        cfg = RunConfig(**{s: SECTIONS[s](**{k: tuple(v) if isinstance(v, list) else v for k, v in t.items()})
                           for s, t in changed.items() if s in SECTIONS})
        assert (cfg.run_id() == from_dict({}).run_id()) == same, f"{key}.{f.name}"


def test_sweep_point_ids_are_the_ids_of_the_same_configs_run_alone(tmp_path):
    from dynamics.sweep.grid import expand_grid

    p = tmp_path / "c.toml"
    p.write_text('[model]\nrope_base = 100.0\n[sweep]\n"model.pos" = ["rope", "learned"]\n"train.seed" = [0, 1]\n')
    points = expand_grid(load_config(p))
    assert [pt.values for pt in points] == [{"model.pos": pos, "train.seed": s}
                                            for pos in ("rope", "learned") for s in (0, 1)]
    alone = {(pos, s): load_config(p, [f"model.pos={pos}", f"train.seed={s}"]
                                   + (["model.rope_base=10000.0"] if pos == "learned" else [])).run_id()
             for pos in ("rope", "learned") for s in (0, 1)}
    assert [pt.run_id for pt in points] == [alone[pt.values["model.pos"], pt.values["train.seed"]] for pt in points]
    assert len({pt.run_id for pt in points}) == 4


@pytest.mark.parametrize("raw, key", [
    ({"sweep": {"train.seed": [0, 0]}}, "the same experiment"),
    ({"sweep": {"model.init_scale": [1, 1.0]}}, "the same experiment"),
    ({"sweep": {"train.threads": [1, 2]}}, "the same experiment"),
    ({"sweep": {"model.gate_l1": [0.5, 0.7]}}, "model.gate_l1"),
    ({"sweep": {"task.delta": [2, 3]}}, "task.delta"),
])
def test_sweep_points_training_one_run_are_refused(raw, key):
    from dynamics.sweep.grid import expand_grid

    with pytest.raises(ConfigError, match=key):
        expand_grid(from_dict(raw))


# The config checks a run id relies on: a value a check let through trains a config that no
# other command can read back, or one that means something else than it says.


def test_run_ids_of_recorded_configs_do_not_move():
    # Every recorded run is found again by its id: a change to how ids are computed (key order,
    # a key dropped or added) orphans them all. The default config, and one with every section
    # and an [intervene] table written in another key order than the sorted one.
    assert from_dict({}).run_id() == "r739b96cb1e"
    raw = small(intervene={"templates": {"weight": 0.5, "heads": [{"pattern": "previous_token", "layer": 0, "head": 1}]}})
    assert from_dict(raw).run_id() == "ra9d3a55072"


@pytest.mark.parametrize("key, value", [("model.n_layers", True), ("train.seed", False), ("record.every", True)])
def test_a_bool_is_no_integer(key, value):
    # TOML true is Python's True, an int: n_layers = true trained one layer under an id of its own
    section, leaf = key.split(".")
    with pytest.raises(ConfigError, match=f"{key}: expected an integer, got {value}"):
        from_dict({section: {leaf: value}})


def test_an_axis_spelled_twice_inside_one_sweep_table_is_refused():
    # "templates.weight" and a templates table's weight, both in [sweep.intervene]: one list
    # silently replaced the other
    raw = {"sweep": {"intervene": {"templates.weight": [0.0, 1.0], "templates": {"weight": [2.0]}}}}
    with pytest.raises(ConfigError, match=r"sweep.intervene.templates.weight: given twice"):
        from_dict(raw)


@pytest.mark.parametrize("raw, refused", [
    ({"train": {"min_lr_frac": 1.0}}, None),  # no decay: a constant rate after warm-up
    ({"train": {"min_lr_frac": 1.0000001}}, "train.min_lr_frac: must be in"),
    ({"train": {"beta1": 1.0}}, "train.beta1/beta2"),
    ({"model": {"gate_init": -100.0, "gates": "learned"}}, None),
    ({"model": {"gate_init": 100.5, "gates": "learned"}}, "model.gate_init: must be within"),
    ({"model": {"rope_base": 1.0}}, "model.rope_base: must be > 1"),
    ({"model": {"d_head": -2, "pos": "learned"}}, "model.d_head: must be >= 0"),
    ({"task": {"name": "markov", "markov_branching": 64}}, None),  # vocab_size 64: every id a successor
    ({"task": {"name": "markov", "markov_branching": 65}}, "task.markov_branching: must be in"),
    ({"task": {"name": "markov", "markov_order": 15}, "model": {"context": 16}}, None),
    ({"task": {"name": "markov", "markov_order": 16}, "model": {"context": 16}}, "model.context: 16 is too short"),
    ({"task": {"name": "offset_copy", "delta": 7}, "model": {"context": 16}}, None),
    ({"task": {"name": "offset_copy", "delta": 8}, "model": {"context": 16}}, "model.context: 16 is too short"),
    ({"task": {"name": "corpus", "holdout": 0.0}, "model": {"vocab_size": 256}}, "task.holdout: must be in"),
    ({"task": {"name": "offset_copy"}, "model": {"vocab_size": 4}}, None),
    ({"task": {"name": "offset_copy"}, "model": {"vocab_size": 3}}, "model.vocab_size: must be >= 4"),
    ({"task": {"name": "mixture", "components": ["induction", "induction"]}}, "task.components: duplicate"),
])
def test_bounds_hold_at_their_edges(raw, refused):
    if refused is None:
        from_dict(raw)
    else:
        with pytest.raises(ConfigError, match=re.escape(refused)):
            from_dict(raw)


def test_mixture_weights_that_draw_the_same_rows_are_one_point():
    from dynamics.sweep.grid import expand_grid

    raw = {"task": {"name": "mixture", "components": ["induction", "markov"]}, "sweep": {"task.weights": [[], [1, 1]]}}
    with pytest.raises(ConfigError, match="train the same data and model"):
        expand_grid(from_dict(raw))


def test_a_grid_one_past_max_points_is_refused():
    from dynamics.limits import MAX_POINTS
    from dynamics.sweep.grid import expand_grid

    with pytest.raises(ConfigError, match=f"sweep: {MAX_POINTS + 1:,} points"):
        expand_grid(from_dict({"sweep": {"train.seed": list(range(MAX_POINTS + 1))}}))


def test_a_pooled_runs_data_hash_names_its_seed():
    # every seed draws its own pool: one hash for two seeds said they trained on the same rows
    from dynamics.tasks import data_hash

    pooled = [data_hash(from_dict({"task": {"pool_size": 8}, "train": {"seed": s}})) for s in (0, 1)]
    assert pooled[0] != pooled[1]
    assert data_hash(from_dict({"train": {"seed": 0}})) == data_hash(from_dict({"train": {"seed": 1}}))


def test_a_seed_group_does_not_depend_on_the_order_of_keys():
    # stored configs keep the key order they were written in (an [intervene] table's, say): two
    # seeds of one config must share the group whatever that order
    from dynamics.identity import seed_group

    a = {"train": {"seed": 0, "lr": 0.1}, "intervene": {"a": 1, "b": 2}}
    b = {"intervene": {"b": 2, "a": 1}, "train": {"lr": 0.1, "seed": 1}}
    assert seed_group(a) == seed_group(b)
    assert seed_group(a) != seed_group({**b, "intervene": {"b": 2, "a": 3}})


def test_chg_steps_is_unread_only_where_no_chg_is_fitted():
    from dynamics.identity import unread_settings

    assert unread_settings(from_dict({"record": {"chg_steps": 5}}).to_dict()) == {"record.chg_steps": 5}
    assert unread_settings(from_dict({"record": {"chg_every": 2, "chg_steps": 5}}).to_dict()) == {}


def test_a_run_id_given_twice_with_another_seed_is_refused(tmp_path):
    # --run-id names the run, so a second seed under it would have been a resume of the first,
    # mixing two seeds' training in one run
    p = tmp_path / "tiny.toml"
    p.write_text(TINY.format(steps=10, every=5))
    cfg = load_config(p)
    path = str(tmp_path / "s.zarr")
    train_run(cfg, path, run_id="mine")
    with pytest.raises(store.StoreError, match="recorded with a different config"):
        train_run(with_values(cfg, {"train.seed": cfg.train.seed + 1}), path, run_id="mine")

# Known answers that mutants of this module passed (a mutation audit's): each pins a number, an
# order or a wording the other tests let move.


def test_differing_settings_come_sorted_whatever_order_the_configs_list_them():
    # `sorted({...})` -> first-seen order survived: the table's setting columns moved with the configs' key order
    from dynamics.identity import differing_settings

    assert differing_settings([{"train.lr": 0.1, "model.d_model": 16, "task.name": "x"},
                               {"train.lr": 0.2, "model.d_model": 32, "task.name": "x"}]) == ["model.d_model", "train.lr"]


def test_a_section_value_with_its_keys_in_another_order_is_not_a_difference():
    # json.dumps(sort_keys=True) -> repr survived: an [intervene] table read back with its keys in
    # another order (TOML, JSON attrs) made a column of two equal values
    from dynamics.identity import differing_settings

    assert differing_settings([{"intervene.templates": {"a": 1, "b": [2, 3]}, "train.seed": 0},
                               {"intervene.templates": {"b": [2, 3], "a": 1}, "train.seed": 1}]) == ["train.seed"]


def test_who_does_not_read_a_setting_agrees_in_number_and_spells_the_condition_as_toml_would():
    # the verb's number (do/does) and the condition's JSON spelling ("fixed", true) were pinned by no test
    from dynamics.identity import not_read_by

    assert not_read_by("model.gate_init", {"model": {"gates": "fixed"}}) == \
        'fixed gates (model.gates = "fixed") do not read'
    assert not_read_by("model.d_mlp", {"model": {"attn_only": True}}) == \
        "an attention-only model (model.attn_only = true) does not read"


def test_the_condition_a_config_leaves_out_is_read_at_its_default():
    # `_get` without the config class's default survived: a stored config of an older dynamics,
    # without model.gates, was said to run under "model.gates = null"
    from dynamics.identity import not_read_by, unread_settings

    assert not_read_by("model.gate_init", {"model": {}}) == 'fixed gates (model.gates = "fixed") do not read'
    # record.chg_every left out: 0 by default, so chg_steps set away from its default goes unread
    assert unread_settings({"record": {"chg_steps": 50}}) == {"record.chg_steps": 50}


def test_the_unread_setting_problem_names_the_first_unread_setting():
    # `next(iter(...))` -> the last survived: two unread gate settings named the later one
    from dynamics.identity import unread_setting_problem

    line = unread_setting_problem({"model": {"gates": "fixed", "gate_init": 1.0, "gate_l1": 0.5}})
    assert line.startswith('model.gate_init = 1.0: fixed gates (model.gates = "fixed") do not read it, so the run')
    assert line.endswith('drop the setting, or set model.gates = "learned"')


def test_a_setting_a_run_does_not_read_is_no_difference_even_copied():
    # UNREAD is told by type: a copy (deepcopy, pickle) of it is another object, and an identity
    # test would count it as a value, "none" against 12
    import copy
    import pickle

    from dynamics.identity import UNREAD, differing_settings, read_settings, setting_text

    markov = read_settings(from_dict({"task": {"name": "markov"}}).to_dict())
    induction = read_settings(from_dict({"task": {"max_period": 12}}).to_dict())
    for other in (markov, copy.deepcopy(markov), pickle.loads(pickle.dumps(markov))):
        assert differing_settings([induction, other]) == ["task.name"]
    assert markov["task.max_period"] is UNREAD and setting_text(markov, "task.max_period") == "none"
    assert setting_text(induction, "task.max_period") == "12" and setting_text(induction, "intervene.x") == "none"
    # a mixture reads the keys of each of its components
    mixture = read_settings(from_dict({"task": {"name": "mixture", "components": ["induction", "markov"]}}).to_dict())
    assert not isinstance(mixture["task.max_period"], type(UNREAD)) and mixture["task.delta"] is UNREAD
    # its components and weights are read by a mixture alone: an induction run's [] and () were
    # shown as values beside the mixture's (a cross-command audit)
    assert mixture["task.components"] == ["induction", "markov"] and mixture["task.weights"] == []
    assert induction["task.components"] is UNREAD and induction["task.weights"] is UNREAD
    assert {"task.components", "task.weights"}.isdisjoint(differing_settings([induction, mixture]))


def test_predicts_config_labels_say_none_for_a_setting_a_run_lacks_or_does_not_read():
    # `predict --group config`: two configs at one swept point, told apart by their settings;
    # a run without the [intervene] section read "None" there, Python's word, not status's "none"
    from dynamics.predict.load import _told_apart
    from dynamics.predict.options import Run

    gated = {**from_dict({}).to_dict(), "intervene": {"scale": 0.5}}  # a stored config's [intervene] table
    plain = from_dict({"model": {"attn_only": True}}).to_dict()
    runs = [Run("ra", None, 0, "init_scale=1"), Run("rb", None, 0, "init_scale=1")]
    got = {r.run_id: r.config for r in _told_apart(runs, {"ra": gated, "rb": plain})}
    assert got == {"ra": "init_scale=1, intervene.scale=0.5, model.attn_only=False",
                   "rb": "init_scale=1, intervene.scale=none, model.attn_only=True"}
    # a list and a name as status prints them: ['induction', 'markov'] (Python's) was the label
    # here, and cross-seed consistency's groups quoted the name ("markov") where status did not
    from dynamics.identity import read_settings, setting_text

    mixed = from_dict({"task": {"name": "mixture", "components": ["induction", "markov"]}}).to_dict()
    other = from_dict({"task": {"name": "mixture", "components": ["induction", "offset_copy"]}}).to_dict()
    got = {r.run_id: r.config for r in _told_apart(runs, {"ra": mixed, "rb": other})}
    assert got["ra"].startswith('init_scale=1, task.components=["induction","markov"]')
    assert setting_text(read_settings(mixed), "task.name") == "mixture"
