"""Twins (dynamics.sweep.twins): the recorded run that trains what a config trains under another
run id, each with its known answer. The refusals they lead to are tested where they are said:
tests/test_cli.py (dynamics run) and tests/test_sweep_outcomes.py (a sweep's new point)."""

from dynamics.config import from_dict
from dynamics.sweep.twins import twins_in_store
from tests.test_sweep import tiny


def test_a_recorded_run_of_the_same_training_under_another_id_is_its_twin_and_no_other_run_is():
    # d_model 16 with 2 heads: d_head 8 written out is the d_head 0 default (the known answer
    # behind it: test_points_whose_settings_resolve_alike_are_refused)
    default, written = from_dict(tiny()), from_dict(tiny(model={"d_head": 8}))
    assert default.run_id() != written.run_id()
    twin = twins_in_store([written], {default.run_id(): default.to_dict()})[written.run_id()]
    assert (twin.run_id, twin.settings) == (default.run_id(), {"model.d_head": (0, 8)})
    assert str(twin) == (f"run {default.run_id()} there trains the same data and model: its config differs only in "
                         "model.d_head = 0 against 8, which come to the same training (d_head 0 is d_model / n_heads)")
    seed_1, d_head_4 = from_dict(tiny(train={"seed": 1})), from_dict(tiny(model={"d_head": 4}))
    unreadable = {"model": {"n_layers": "two"}}
    recorded = {r.run_id(): r.to_dict() for r in (written, seed_1, d_head_4)} | {"r0": unreadable}
    twins = twins_in_store([written, default, seed_1, from_dict(tiny(train={"seed": 2}))], recorded)
    # its own id is no twin, nor are other trainings: only default has one
    assert {k: t.run_id for k, t in twins.items()} == {default.run_id(): written.run_id()}
    # a store holding both spellings already: each is the other's twin, never its own
    both = {default.run_id(): default.to_dict(), written.run_id(): written.to_dict()}
    assert {k: t.run_id for k, t in twins_in_store([written, default], both).items()} == {
        written.run_id(): default.run_id(), default.run_id(): written.run_id()}


def test_twin_guard_refuses_a_twin_made_since_the_first_check_and_the_writer_then_makes_nothing(tmp_path):
    # Checked only before training, two commands making one training written two ways at once
    # both trained it: the guard checks again under the store's lock, as the run's group is made.
    import numpy as np
    import pytest

    from dynamics import store
    from dynamics.sweep.twins import twin_guard

    default, written, seed_1 = (from_dict(tiny()), from_dict(tiny(model={"d_head": 8})),
                                from_dict(tiny(train={"seed": 1})))
    path = str(tmp_path / "s.zarr")
    spec = {"variables": {"gate": (("snapshot", "layer", "head"), (1, 2, 2), "float32")},
            "coords": {"step": ("snapshot", np.array([0]))}}
    store.RunWriter(path, default.run_id(), attrs={"config": default.to_dict()}, **spec).finalize()

    def refusal(twin):
        return RuntimeError(f"twin {twin.run_id}: {sorted(twin.settings)}")

    with pytest.raises(RuntimeError, match=rf"^twin {default.run_id()}: \['model.d_head'\]$"):
        twin_guard(path, written, refusal)()
    twin_guard(path, written, refusal, checked=[default.run_id()])()  # compared already: not read again
    twin_guard(path, default, refusal)()  # its own run is no twin
    seen = {}
    twin_guard(path, seed_1, refusal, seen=seen)()  # another training: no twin, and what it read is kept
    assert list(seen) == [default.run_id()] and seen[default.run_id()][1] == default
    with pytest.raises(RuntimeError, match="model.d_head"):
        twin_guard(path, written, refusal, seen=seen)()  # from what was seen
    # the writer calls it before it makes the group: refused, nothing written
    with pytest.raises(RuntimeError, match=f"twin {default.run_id()}"):
        store.RunWriter(path, written.run_id(), attrs={"config": written.to_dict()},
                        before_create=twin_guard(path, written, refusal), **spec)
    assert store.list_runs(path) == [default.run_id()]


def test_an_unfinished_run_at_a_points_values_under_another_id_is_named_and_left_as_it_was(tmp_path, capsys,
                                                                                             threaded_cluster):
    # A sweep interrupted under an older version, whose default of a setting changed since: its
    # runs have other ids, so the same sweep trained every point anew, saying nothing, and left
    # the old runs unfinished for good.
    import pytest

    from dynamics import store
    from dynamics.sweep import run_sweep
    from dynamics.sweep.grid import expand_grid
    from dynamics.train import train_run
    from tests.conftest import interrupt_at
    from tests.test_resume import tree_bytes

    path = str(tmp_path / "s.zarr")
    cfg = from_dict(tiny({"train.seed": [0, 1]}))
    first, second = expand_grid(cfg)
    old = from_dict({**first.cfg.to_dict(), "train": {**first.cfg.to_dict()["train"], "eval_batches": 2}})
    with pytest.raises(KeyboardInterrupt):
        train_run(old, path, "old", progress=interrupt_at(3))
    done = from_dict({**old.to_dict(), "train": {**old.to_dict()["train"], "seed": 1}})
    train_run(done, path, "done")  # finished: nothing to resume, so not named
    store.write_sweep_index(path, {"axes": ["train.seed"], "runs": {"old": {"train.seed": 0}, "gone": {"train.seed": 1},
                                                                     "elsewhere": {"train.seed": 5},
                                                                     # a point of an lr sweep into this store: its own
                                                                     "lr_sweep": {"train.seed": 0, "train.lr": 0.01},
                                                                     "done": {"train.seed": 1}}})
    before = tree_bytes(str(tmp_path / "s.zarr" / "runs" / "old"))
    run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert capsys.readouterr().err.count(
        f"dynamics: note: 2 unfinished run(s) of {path}'s sweep index sit at this grid's points under other run ids, "
        "recorded with other settings (run old: train.eval_batches: recorded 2, here 1): this sweep does not resume "
        "them, and trains its points under their own ids; a --set of those settings resumes them instead\n") == 1
    assert store.run_attrs(path, "old")["status"] == "interrupted"
    assert tree_bytes(str(tmp_path / "s.zarr" / "runs" / "old")) == before
    # once the points are finished, or where no entry sits at a point, nothing is said
    run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert "unfinished run(s)" not in capsys.readouterr().err
