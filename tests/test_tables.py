"""The tables the commands print."""

from dynamics import store
from dynamics.tables import print_analysis


def test_analyse_table_of_a_one_head_model_prints_redundancy_undefined(capsys):
    # summary_row gives "undefined" for a model of one head (no pair to be redundant); the table
    # formatted every redundancy with :.2f.
    row = {"run": "r1", "status": "completed", "bifurcation_step": "undefined", "final_divergence": "undefined",
           "redundancy": "undefined", "slash_dominant": 0, "roles": {"previous_token": 1}}
    print_analysis([row, row | {"run": "r2", "redundancy": 0.5}])
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert lines[1].split()[header.index("redundancy")] == "undefined"
    assert lines[2].split()[header.index("redundancy")] == "0.50"
    assert lines[3].startswith("bifurcation: step the heads' divergence (the mean over layers) left its early band")  # the columns
    assert lines[4].endswith("redundancy between the heads of the model)")


def test_analyse_table_gives_each_runs_swept_values_in_the_grid_order(tmp_path, capsys):
    # The table listed runs by id (hashes) with no swept value, so which row was which point of the
    # grid could only be read off `dynamics status`; it now has status's columns and order.
    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_sweep_index(path, {"axes": ["model.init_scale", "train.seed"],
                                   "runs": {"rb": {"model.init_scale": 2.0, "train.seed": 0},
                                            "ra": {"model.init_scale": 0.5, "train.seed": 0}}})
    row = {"status": "completed", "bifurcation_step": 10, "final_divergence": 0.25, "redundancy": 0.0,
           "slash_dominant": 1, "roles": {"induction": 1}}
    print_analysis([{"run": "ra"} | row, {"run": "rb"} | row, {"run": "rx"} | row], str(path))
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert lines[0][:4] == ["run", "model.init_scale", "train.seed", "status"]
    assert [line[:3] for line in lines[1:3]] == [["rb", "2.0", "0"], ["ra", "0.5", "0"]]
    assert lines[3][:2] == ["rx", "completed"]  # outside the sweep: last, no swept values
