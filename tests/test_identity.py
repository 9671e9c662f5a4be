"""What enters a run id, and what a rerun under one id may skip: configs that train different
arrays under one id (a rerun skips the run it should train, or reports another's), the rules
that keep a sweep's points apart, and the config checks those rely on."""

import shutil

import pytest

from dynamics import store
from dynamics.config import ConfigError, from_dict, load_config
from dynamics.train import train_run

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
        from dynamics.config import RunConfig
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
