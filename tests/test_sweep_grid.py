"""expand_grid's refusals at their edges, each with its known message (test_sweep.py holds the rest)."""

import pytest

from dynamics.config import ConfigError, from_dict
from dynamics.limits import MAX_POINTS
from dynamics.sweep.grid import expand_grid


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
