"""Known answers for dynamics.train, written against mutants of it that the rest of the suite let
through: the schedules at the step counts where an off-by-one shows, and what a resume counts."""

import pytest

from dynamics.config import from_dict
from dynamics.train import gates_held, lr_at


def _cfg(**train):
    return from_dict({"train": {"lr": 2.0, "min_lr_frac": 0.1, **train}})


def test_a_run_exactly_as_long_as_its_warm_up_has_a_learning_rate_at_every_step_it_asks_for():
    # train_run sets the lr at every step 0..steps, the last (no update) included: with
    # warmup_steps == steps that step is the decay's first, over a span of 0 steps, which a
    # `max(0, ...)` would divide by
    lrs = [lr_at(_cfg(steps=5, warmup_steps=5), s) / 2.0 for s in range(6)]
    assert lrs == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])


def test_the_decay_reaches_its_floor_at_step_steps_also_one_step_after_the_warm_up():
    # steps = warmup_steps + 1: a one-step decay, lr at its only update (step 5) and the floor
    # min_lr_frac * lr at step 6, as for any longer decay (a span of 2 put it halfway, 0.55)
    cfg = _cfg(steps=6, warmup_steps=5)
    assert lr_at(cfg, 5) == 2.0 and lr_at(cfg, 6) == pytest.approx(0.2)


@pytest.mark.parametrize("steps, last_held", [(10, 0), (11, 1), (20, 1), (101, 10), (1000, 99), (1001, 100)])
def test_learned_gates_are_held_up_to_the_last_step_under_a_tenth_of_the_run(steps, last_held):
    # 10 * step < steps: 1/11, 10/101 and 99/1000 are under a tenth, 100/1000 is not. The suite's
    # 19, 25 and 100 steps could not tell 11 * step < steps from it
    cfg = from_dict({"model": {"gates": "learned"}, "train": {"steps": steps, "warmup_steps": 1}})
    assert gates_held(cfg, last_held) and not gates_held(cfg, last_held + 1)
    assert not gates_held(from_dict({"train": {"steps": steps}}), 0)  # fixed gates: nothing to hold
