"""The grid's order of a store's runs (dynamics.grid), which every listing of them shares."""

from dynamics.grid import grid_key


def test_a_run_without_a_value_for_an_axis_sorts_after_the_values():
    # seed 1 is listed first, so it ranks first; rd has no seed and comes after both seeds,
    # rb no init_scale and comes after rc at their seed; runs outside the index last, by id
    index = {"axes": ["train.seed", "model.init_scale"], "runs": {
        "ra": {"train.seed": 1, "model.init_scale": 0.5},
        "rb": {"train.seed": 0},
        "rc": {"train.seed": 0, "model.init_scale": 0.5},
        "rd": {"model.init_scale": 2.0}}}
    assert sorted(["rz", "rd", "rc", "ry", "rb", "ra"], key=grid_key(index)) == ["ra", "rc", "rb", "rd", "ry", "rz"]
