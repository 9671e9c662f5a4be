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
    assert lines[2].split()[header.index("redundancy")] == "0.500"  # a row built without summary_row's counts
    assert lines[3].startswith("bifurcation: step the heads' divergence (the mean over layers) left its early band")  # the columns
    # "never" with the divergence near its bound at step 0 is heads split from initialisation, which the page's caption said
    assert "never where it did not: heads that start far apart (a large init_scale) can stay in their band" in lines[3]
    assert lines[4].endswith("redundancy between the heads of the model)")


def test_analyse_table_gives_redundancy_as_a_count_of_heads(capsys):
    # Two decimals printed 5 of 8 heads as 0.62 and 3 of 8 as 0.38 (half to even on exact halves).
    row = {"status": "completed", "bifurcation_step": 10, "final_divergence": 0.25, "slash_dominant": 0,
           "roles": {"induction": 8}}
    print_analysis([{"run": "r1", "redundancy": 0.625, "redundant_heads": 5, "heads": 8} | row,
                    {"run": "r2", "redundancy": 0.0, "redundant_heads": 0, "heads": 8} | row])
    lines = capsys.readouterr().out.splitlines()
    column = lines[0].split().index("redundancy")
    assert [line.split()[column] for line in lines[1:3]] == ["5/8", "0/8"]
    assert "redundancy: heads in a cluster of 2 or more there, of all heads (" in lines[3]


def test_the_table_says_where_a_diverged_run_was_read(capsys):
    # Its "final" figures come from its last finite snapshot (step 8 of a run that diverged at
    # 13, the schedule running to 300), while the footnote said "at the last snapshot".
    row = {"bifurcation_step": 10, "final_divergence": 0.25, "redundancy": 0.0, "redundant_heads": 0, "heads": 8,
           "slash_dominant": 0, "roles": {"induction": 8}}
    diverged = [{"run": f"d{i}", "status": "diverged", "diverged_step": 13 + i, "read_at_step": 8 + i} | row
                for i in range(6)]
    print_analysis([{"run": "r1", "status": "completed"} | row, diverged[0]])
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("diverged: read at the last snapshot with finite attention, recorded up to the divergence, not "
                       "at the schedule's end: d0 at step 8 (diverged at step 13)")
    print_analysis(diverged)
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        "d3 at step 11 (diverged at step 16), and 2 more")
    print_analysis([{"run": "r1", "status": "completed"} | row])
    assert "diverged" not in capsys.readouterr().out


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


def test_a_stores_values_are_printed_with_their_control_characters_escaped(tmp_path, capsys):
    # A store from elsewhere whose index held "\x1b[2J\x1b[H" and a fake table cleared the terminal
    # and showed other losses in place of status's own; analyse's table printed them as raw
    from dynamics.status import show_status

    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_sweep_index(path, {"axes": ["model.init_scale\x1b]0;title\x07", "train.seed"],
                                   "runs": {"ra": {"model.init_scale\x1b]0;title\x07": "1\x1b[2J\x1b[H\rfake\x9b",
                                                   "train.seed": 0}}})
    row = {"status": "completed", "bifurcation_step": 10, "final_divergence": 0.25, "redundancy": 0.0,
           "slash_dominant": 1, "roles": {"induction": 1}}
    print_analysis([{"run": "ra"} | row], str(path))
    show_status(str(path))
    out = capsys.readouterr().out
    assert not any(ch in out for ch in "\x1b\x07\r\x9b")
    assert out.count("1\\x1b[2J\\x1b[H\\rfake\\x9b") == 2 and out.count("model.init_scale\\x1b]0;title\\x07") == 2


ANALYSED = {"run": "r1", "status": "completed", "bifurcation_step": 40, "final_divergence": 0.25, "redundancy": 0.5,
            "redundant_heads": 2, "heads": 4, "slash_dominant": 1, "roles": {"induction": 1, "previous_token": 3}}


def _cells(capsys) -> list[list[str]]:
    """The table's rows below its header, split at the columns' runs of two or more spaces."""
    import re

    lines = capsys.readouterr().out.splitlines()
    return [re.split(r"\s{2,}", line) for line in lines[1:] if line.startswith("r")]


def test_analyse_table_cells_of_an_analysed_run(capsys):
    print_analysis([ANALYSED])
    assert _cells(capsys) == [["r1", "completed", "40", "0.250", "2/4", "1", "previous_token:3 induction:1"]]


def test_bifurcation_cell_names_each_layer_only_where_one_differs_from_the_model(capsys):
    print_analysis([ANALYSED | {"layer_bifurcation_steps": [40, 40]},
                    ANALYSED | {"run": "r2", "layer_bifurcation_steps": [40, None]},
                    ANALYSED | {"run": "r3", "bifurcation_step": None, "layer_bifurcation_steps": [None, 12]}])
    assert [row[2] for row in _cells(capsys)] == ["40", "40 (by layer: 40, never)", "never (by layer: never, 12)"]


def test_the_undefined_note_names_redundancy_only_when_a_run_has_it_undefined(capsys):
    # two heads per layer in one layer: divergence undefined, yet a pair of heads across layers for redundancy
    print_analysis([ANALYSED | {"bifurcation_step": "undefined", "final_divergence": "undefined"}])
    assert capsys.readouterr().out.splitlines()[-1].endswith("measured between the heads of a layer)")


def test_slash_dom_undefined_is_explained_under_the_table(capsys):
    # probes too short for any slash offset: the column read "undefined" with no note, though the
    # notes explained every other "undefined" (the report's caption says why; the table did not)
    print_analysis([ANALYSED | {"run": "short", "slash_dominant": "undefined"}, ANALYSED])
    out = capsys.readouterr().out
    column = out.splitlines()[0].split().index("slash_dom")
    assert [line.split()[column] for line in out.splitlines() if line.startswith("short ")] == ["undefined"]
    assert ("slash_dom undefined: the probes are too short to score any slash offset (none that uniform attention or a "
            "first-token sink does not already reach)") in out
    print_analysis([ANALYSED])
    assert "slash_dom undefined" not in capsys.readouterr().out


def test_analysis_failures_name_the_runs_that_raised_not_those_left_unfinished(capsys):
    from dynamics.tables import analysis_failures

    rows = [ANALYSED, {"run": "r2", "status": "running", "skipped": True, "reason": "unfinished"},
            {"run": "r3", "status": "completed", "skipped": True, "error": "ValueError: x", "reason": "analysis failed"}]
    assert analysis_failures(rows) == ["r3"]
    assert capsys.readouterr().err == "dynamics: the analysis of 1 run(s) failed: r3\n"
    assert analysis_failures(rows[:2]) == [] and capsys.readouterr().err == ""


def test_a_pending_point_already_in_the_rows_is_listed_once(tmp_path, capsys):
    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_sweep_index(path, {"axes": ["train.seed"], "runs": {"ra": {"train.seed": 0}, "rb": {"train.seed": 1}}})
    print_analysis([ANALYSED | {"run": "ra"}], str(path), pending=True)
    rows = _cells(capsys)
    assert [row[0] for row in rows] == ["ra", "rb"]
    assert rows[1][-1] == "not analysed (not started)"


def _configured(path, run_id, **values):
    """A run whose attrs hold a full config with `values` ({"train.lr": 0.01, ...}) set."""
    from dynamics.config import RunConfig
    from tests.test_store import write_run

    status = values.pop("status", "completed")
    config = RunConfig().to_dict()
    for key, value in values.items():
        section, name = key.split(".")
        config[section][name] = value
    write_run(path, run_id, attrs={"status": status, "config": config})


def test_one_run_of_twins_keeps_the_setting_that_tells_it_from_its_twin(tmp_path, capsys):
    # Two sweeps of one grid at two lrs: `analyse --run` of one printed its swept values only, and
    # its row read as its twin's (the lr column was found among the rows shown, one run)
    path = tmp_path / "s.zarr"
    store.init_store(path)
    _configured(path, "ra", **{"train.lr": 0.003})
    _configured(path, "rb", **{"train.lr": 0.01})
    store.write_sweep_index(path, {"axes": ["train.seed"], "runs": {"ra": {"train.seed": 0}, "rb": {"train.seed": 0}}})
    print_analysis([ANALYSED | {"run": "rb"}], str(path))
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert lines[0][:4] == ["run", "train.seed", "train.lr", "status"]
    assert lines[1][:4] == ["rb", "0", "0.01", "completed"] and len([x for x in lines if x[0] == "ra"]) == 0


def test_the_runs_cross_seed_consistency_leaves_out_come_in_the_tables_order(tmp_path, capsys):
    from dynamics.tables import print_consistency

    path = tmp_path / "s.zarr"
    store.init_store(path)
    for rid, seed in (("rz", 0), ("ry", 1), ("rx", 2)):  # ids against the grid's order
        _configured(path, rid, **{"train.seed": seed, "status": "diverged"})
    store.write_sweep_index(path, {"axes": ["train.seed"],
                                   "runs": {"rz": {"train.seed": 0}, "ry": {"train.seed": 1}, "rx": {"train.seed": 2}}})
    rows = [{"run": rid, "status": "diverged", "skipped": True} for rid in ("rx", "ry", "rz")]  # analyse's order: by id
    print_consistency(str(path), rows)
    assert capsys.readouterr().out.strip().endswith("rz (diverged), ry (diverged), rx (diverged)")


def test_one_run_already_finished_gives_no_share_of_training():
    from dynamics.tables import demo_timing

    assert "no share of training: 1 of 4 runs were already finished" in demo_timing(10.0, 1.0, 12.0, 1, 4)

# Known answers that mutants of this module passed (a mutation audit's): each pins a number, an
# order or a wording the other tests let move.


_ROW = {"bifurcation_step": 10, "final_divergence": 0.25, "redundancy": 0.0, "redundant_heads": 0, "heads": 8,
        "slash_dominant": 0, "roles": {"induction": 8}}


def test_print_table_pads_each_column_to_its_widest_cell(capsys):
    # the widths are each column's longest cell (header included), cells two spaces apart, no trailing blanks
    from dynamics.tables import print_table

    print_table(["a", "bb"], [["ccc", "d"], ["e", "ffff"]])
    assert capsys.readouterr().out == "a    bb\nccc  d\ne    ffff\n"


def test_the_diverged_footnote_names_four_runs_without_a_count_of_more(capsys):
    # `len(early) > 4` -> `>= 4` survived: four diverged runs read "..., and 0 more"
    from dynamics.tables import print_analysis

    rows = [{"run": f"d{i}", "status": "diverged", "diverged_step": 13 + i, "read_at_step": 8 + i} | _ROW
            for i in range(4)]
    print_analysis(rows)
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        "d2 at step 10 (diverged at step 15), d3 at step 11 (diverged at step 16)")


def test_the_loss_rose_footnote_gives_four_significant_digits_of_four_runs_then_a_count(capsys):
    # its rounding (:.4g) and its cut at four runs were pinned by no test
    from dynamics.tables import print_analysis

    rows = [{"run": f"r{i}", "status": "completed", "loss_rose": (2.30258, 2.71828 + i)} | _ROW for i in range(5)]
    print_analysis(rows)
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("loss rose in 5 completed run(s): the eval loss at the last snapshot is above that at step 0")
    assert last.endswith(": r0 (2.303 -> 2.718 nats), r1 (2.303 -> 3.718 nats), r2 (2.303 -> 4.718 nats), "
                         "r3 (2.303 -> 5.718 nats), and 1 more")
    print_analysis(rows[:4])
    assert capsys.readouterr().out.splitlines()[-1].endswith("r3 (2.303 -> 5.718 nats)")


def test_demo_timing_gives_the_share_to_a_tenth_of_a_percent_and_the_total_to_the_second():
    from dynamics.tables import demo_timing

    # 0.56 / 10 = 5.6%; 11.44 s rounds to 11
    assert demo_timing(10.0, 0.56, 11.44, 0, 3) == "training 10.0s, analysis 0.6s (5.6% of training), total 11s"


def _two_seeds(path):
    """Two completed runs of one config (seeds 0 and 1), each with a current analysis whose final
    profiles are the other's with its heads swapped: similarity 1."""
    import numpy as np
    import xarray as xr

    from dynamics import store
    from dynamics.analysis import ROLES
    from dynamics.analysis.pipeline import ANALYSIS_VERSION
    from dynamics.config import RunConfig
    from tests.test_store import write_run

    store.init_store(path)
    profile = np.random.default_rng(0).random((len(ROLES) - 1, 1, 2, 2))
    for rid, seed, p in (("ra", 0, profile), ("rb", 1, profile[..., ::-1])):
        config = RunConfig().to_dict()
        config["train"]["seed"] = seed
        write_run(path, rid, attrs={"status": "completed", "config": config})
        store.write_analysis(path, rid, xr.Dataset(
            {"role_score": (("role_name", "snapshot", "layer", "head"), p)},
            coords={"role_name": list(ROLES[:-1]), "layer": [0, 1], "head": [0, 1]},
            attrs={"analysis_version": ANALYSIS_VERSION}))
    return str(path)


def test_the_cross_seed_line_gives_three_decimals(tmp_path, capsys):
    # `{sim:.3f}` / `{unmatched:.3f}` -> two decimals survived: no test read the printed line
    import re

    from dynamics.tables import print_consistency

    path = _two_seeds(tmp_path / "s.zarr")
    print_consistency(path, [{"run": "ra", "status": "completed"}, {"run": "rb", "status": "completed"}])
    [line] = capsys.readouterr().out.splitlines()
    m = re.fullmatch(r"cross-seed consistency config [0-9a-f]{8}: (\S+) over 2 seeds \(1 = same heads up to "
                     r"permutation; unmatched heads give (\S+)\)", line)
    assert m, line
    assert m[1] == "1.000" and re.fullmatch(r"\d\.\d{3}", m[2])
    # and each is its own number: the unmatched reference is seed_consistency's, not the similarity again
    from dynamics.analyse import seed_consistency

    [(_, sim, unmatched, _, _)] = seed_consistency(path, ["ra", "rb"])
    assert (m[1], m[2]) == (f"{sim:.3f}", f"{unmatched:.3f}") and m[1] != m[2]


def test_a_completed_run_whose_analysis_failed_is_left_out_of_its_seed_group(tmp_path, capsys):
    # `not r.get("skipped")` dropped from `compared` survived: a run whose analysis failed this
    # time was compared by the one an earlier analyse left in the store
    from dynamics.tables import print_consistency

    path = _two_seeds(tmp_path / "s.zarr")
    print_consistency(path, [{"run": "ra", "status": "completed"},
                             {"run": "rb", "status": "completed", "skipped": True, "reason": "analysis failed"}])
    assert capsys.readouterr().out == (
        "cross-seed consistency leaves out 1 finished run(s) without a final profile (it compares completed, "
        "analysed runs): rb (not analysed)\n")


def test_a_diverged_run_without_a_seed_to_compare_is_not_said_to_be_left_out(tmp_path, capsys):
    # `peers > 1` -> `>= 1` survived: on runs of two configs, one seed each, the line named every
    # diverged run as "left out" of a comparison there was none to make
    from dynamics import store
    from dynamics.config import RunConfig
    from dynamics.tables import print_consistency
    from tests.test_store import write_run

    path = tmp_path / "s.zarr"
    store.init_store(path)
    for rid, lr in (("ra", 0.01), ("rb", 0.003)):
        config = RunConfig().to_dict()
        config["train"]["lr"] = lr
        write_run(path, rid, attrs={"status": "diverged", "config": config})
    print_consistency(str(path), [{"run": "ra", "status": "diverged", "skipped": True},
                                  {"run": "rb", "status": "diverged", "skipped": True}])
    assert capsys.readouterr().out == ""


def test_a_row_with_a_count_of_redundant_heads_but_no_count_of_heads_gets_its_fraction(capsys):
    # `and row.get("heads")` dropped survived: such a row printed "2/None"
    from dynamics.tables import print_analysis

    print_analysis([{"run": "r1", "status": "completed", "redundancy": 0.5, "redundant_heads": 2, "heads": None}
                    | {k: v for k, v in _ROW.items() if k not in ("redundancy", "redundant_heads", "heads")}])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[lines[0].split().index("redundancy")] == "0.500"


def test_a_table_of_runs_none_of_them_analysed_has_no_footnote_on_its_columns(capsys):
    # `any(not skipped)` -> `rows` survived: the columns' footnote was printed under a table of dashes
    from dynamics.tables import print_analysis

    print_analysis([{"run": "r1", "status": "running", "skipped": True, "reason": "unfinished"}])
    assert capsys.readouterr().out.splitlines() == [
        "run  status   bifurcation  divergence  redundancy  slash_dom  final roles",
        "r1   running  -            -           -           -          not analysed (unfinished)"]


def test_the_undefined_note_is_said_where_one_run_of_several_has_a_single_head_per_layer(capsys):
    # `any(... == "undefined")` -> `all(...)` survived: beside a run of two heads per layer the note went
    from dynamics.tables import print_analysis

    one_head = {"run": "r2", "status": "completed", "bifurcation_step": "undefined",
                "final_divergence": "undefined", "redundancy": "undefined", "slash_dominant": 0,
                "roles": {"previous_token": 1}}
    print_analysis([{"run": "r1", "status": "completed"} | _ROW, one_head])
    assert capsys.readouterr().out.splitlines()[-1] == (
        "undefined: one head per layer, so no pair of heads to compare (bifurcation and divergence are measured "
        "between the heads of a layer, redundancy between the heads of the model)")


def test_the_token_footnote_says_where_no_probe_holds_the_token():
    # The quickstart's vocabulary of 32 holds no '/' (47): every head's token share is NaN, and a
    # count of 0 token heads read as a finding
    import io
    from contextlib import redirect_stdout

    rows = [{"run": "a", "status": "completed"} | _ROW | {"token_unseen": 47},
            {"run": "b", "status": "completed"} | _ROW | {"token_unseen": None}]
    out = io.StringIO()
    with redirect_stdout(out):
        print_analysis(rows)
    assert ("token roles: token 47 is in none of the probe sequences of 1 of these run(s), so none of their heads "
            "can be measured as a token head (a vocabulary without it, or too few probes: record.n_probe)") in out.getvalue()
    out = io.StringIO()
    with redirect_stdout(out):
        print_analysis(rows[1:])
    assert "token roles" not in out.getvalue()


def test_summary_row_names_the_token_no_probe_holds():
    from dynamics.analysis.pipeline import analyse_run, summary_row
    from tests.test_pipeline import sweep_like

    ds = sweep_like()
    result = analyse_run(ds).isel(run=0).load()
    assert bool(result["token_share"].notnull().any())  # its probes hold the token
    assert summary_row(result)["token_unseen"] is None
    # the same runs with probe tokens below '/' (47) only, as a vocabulary of 32 draws them
    tokens = ds["probe_tokens"] % 32
    without = analyse_run(ds.assign(probe_tokens=tokens)).isel(run=0).load()
    assert summary_row(without)["token_unseen"] == 47 == without.attrs["token_id"]


def test_the_role_notes_name_voita_heads_labelled_otherwise_and_roles_held_at_step_0(capsys):
    from dynamics.tables import role_notes

    rows = [{"run": "a", "status": "completed"} | _ROW | {"peak_not_previous_token": 2, "roles_at_start": {},
                                                         "start_step": 0},
            {"run": "b", "status": "completed"} | _ROW | {"peak_not_previous_token": 0,
                                                         "roles_at_start": {"sink": 3, "induction": 1}, "start_step": 0},
            {"run": "c", "status": "completed"} | _ROW | {"peak_not_previous_token": 1,
                                                         "roles_at_start": {"sink": 1}, "start_step": 0}]
    voita, start = role_notes(rows)
    assert voita.startswith("previous-token heads: 3 head(s) put their largest weight one step back in >= 90% of rows")
    assert voita.endswith("`previous_token_peak` in the analysis names them: a (2), c (1)")
    assert start.startswith("roles at step 0: 5 head(s) hold a specific role before any update (sink 4, induction 1), ")
    assert "so it was not learned: where uniform attention scores close to a role's threshold" in start
    assert start.endswith("an [intervene] template or a large init_scale can set one: b (4), c (1)")
    print_analysis(rows)
    assert voita in capsys.readouterr().out
    # nothing to say: no line (a row stored before these counts has neither key)
    quiet = [{"run": "a", "status": "completed"} | _ROW | {"peak_not_previous_token": 0, "roles_at_start": {},
                                                          "start_step": 0}, {"run": "d", "status": "completed"} | _ROW]
    assert role_notes(quiet) == []
    assert role_notes([rows[1] | {"start_step": 5}]) == []  # a first snapshot after updates: not "before any update"


def test_the_probe_sensitive_note_names_four_heads_and_counts_the_rest():
    from dynamics.tables import role_notes

    def head(layer, n):
        return {"layer": layer, "head": n, "role": "local", "agreement": 0.5 + 0.05 * n, "other": "none"}

    rows = [{"run": "a", "status": "completed"} | _ROW | {"probe_sensitive_roles": [head(0, 0), head(0, 1), head(1, 2)]},
            {"run": "b", "status": "completed"} | _ROW | {"probe_sensitive_roles": []},
            {"run": "c", "status": "completed"} | _ROW | {"probe_sensitive_roles": [head(1, 3), head(1, 4), head(1, 5)]},
            {"run": "d", "status": "completed"} | _ROW | {"probe_sensitive_roles": None}]  # one probe
    (note,) = role_notes(rows)
    assert note.startswith("probe-sensitive roles: 6 head(s) get their final label on fewer than 90% of 200 ")
    assert note.endswith(": a L0H0 local 50.0% (else none), a L0H1 local 55.0% (else none), a L1H2 local 60.0% "
                         "(else none), c L1H3 local 65.0% (else none), and 2 more")
    assert role_notes(rows[1:2] + rows[3:]) == []
