"""What :mod:`dynamics.messages` says on stderr: the notes on runs trained by other code or on
other machines, and the lines naming damaged runs."""

A, B = "a" * 64, "b" * 64


def test_note_mixed_training_says_both_notes_where_code_and_machine_differ(tmp_path, capsys):
    # dropping mixed_execution from the notes survived: runs of one store trained with AVX2 and
    # AVX512 kernels were compared without a word
    from dynamics import store
    from dynamics.messages import note_mixed_training
    from tests.test_store import write_run

    path = tmp_path / "s.zarr"
    store.init_store(path)
    machine = {"status": "completed", "torch_version": "2.13.0+cpu", "device": "cpu"}
    write_run(path, "r1", attrs=machine | {"code_hash": A, "cpu_capability": "AVX2"})
    write_run(path, "r2", attrs=machine | {"code_hash": B, "cpu_capability": "AVX512"})
    said = note_mixed_training(str(path), ["r1", "r2"])
    assert [note.split(" (")[0] for note in said] == [
        "these 2 runs were not all trained by the same dynamics code",
        "these 2 runs were not all trained with the same torch build, device and CPU kernels"]
    assert "torch 2.13.0+cpu, cpu, AVX2: r1; torch 2.13.0+cpu, cpu, AVX512: r2" in said[1]
    assert capsys.readouterr().err.count("dynamics: note: these 2 runs") == 2


def test_one_damaged_run_is_named_with_its_reason_then_in_the_summary_line(capsys):
    # the summary line's condition `if damaged` -> more than one survived: a lone damaged run had no summary
    from dynamics.messages import name_damaged

    name_damaged({"rx": "run rx in s.zarr cannot be read: zarr.json missing"})
    assert capsys.readouterr().err == ("dynamics: run rx in s.zarr cannot be read: zarr.json missing\n"
                                       "dynamics: 1 run(s) could not be read (damaged), skipped: rx\n")
    name_damaged({})
    assert capsys.readouterr().err == ""


def test_runs_of_one_task_setting_trained_on_other_data_are_noted(tmp_path, capsys):
    # A corpus run made under another Python (another standard library) joined a store's runs of
    # one setting, and the two were compared as seeds (consistency 0.956) with no word. Runs of
    # another setting, whose data differ by design, and a low-data pool's per-seed data, are not.
    from dynamics import store
    from dynamics.messages import note_mixed_training
    from tests.test_store import write_run

    path = tmp_path / "s.zarr"
    store.init_store(path)
    corpus = {"model": {"vocab_size": 256}, "task": {"name": "corpus", "pool_size": 0}}
    seed = lambda k: {"train": {"seed": k}}  # noqa: E731
    write_run(path, "r1", attrs={"status": "completed", "data_hash": A, "config": corpus | seed(0)})
    write_run(path, "r2", attrs={"status": "completed", "data_hash": B, "config": corpus | seed(1)})
    write_run(path, "r3", attrs={"status": "completed", "data_hash": A, "config": corpus | seed(2)})
    markov = {"model": {"vocab_size": 64}, "task": {"name": "markov", "pool_size": 0}}
    write_run(path, "r4", attrs={"status": "completed", "data_hash": "c" * 64, "config": markov | seed(0)})
    pool = {"model": {"vocab_size": 64}, "task": {"name": "markov", "pool_size": 8}}
    write_run(path, "r5", attrs={"status": "completed", "data_hash": "d" * 64, "config": pool | seed(0)})
    write_run(path, "r6", attrs={"status": "completed", "data_hash": "e" * 64, "config": pool | seed(1)})
    assert note_mixed_training(str(path), ["r4", "r5", "r6"]) == []
    [said] = note_mixed_training(str(path), ["r1", "r2", "r3", "r4", "r5", "r6"])
    assert said == ("these 3 runs have the same task settings but were trained on other data (data hash "
                    "aaaaaaaaaaaa: r1, r3; bbbbbbbbbbbb: r2): another Python's standard library, for the corpus task; "
                    "a difference between them may be the data's, not the experiment's (each run's data_hash "
                    "attribute says which)")
    assert capsys.readouterr().err.count("dynamics: note: these 3 runs have the same task settings") == 1


def test_the_report_notes_runs_of_one_task_setting_trained_on_other_data():
    # the report carries the same note under its heading (page.py's notes)
    import numpy as np

    from dynamics.provenance import trained_on_data
    from dynamics.report.data import _Run, training_notes

    key = trained_on_data({"config": {"task": {"name": "corpus"}}})[0]

    def run(rid, data_hash):
        return _Run(rid, "completed", {}, 1.0, 0, np.zeros(0, bool), np.zeros(0, np.int64), data=(key, data_hash))

    assert training_notes([run("r1", A), run("r2", A)]) == []
    [note] = training_notes([run("r1", A), run("r2", B)])
    assert note.startswith("these 2 runs have the same task settings but were trained on other data (data hash "
                           "aaaaaaaaaaaa: r1; bbbbbbbbbbbb: r2)")


def test_the_data_note_names_each_setting_and_a_synthetic_tasks_cause():
    # Two settings read as one ("; and" between them), and an induction store's note blamed the
    # corpus's standard library, which a synthetic task never reads.
    from dynamics.provenance import mixed_data, trained_on_data

    def key(period):
        return trained_on_data({"config": {"task": {"name": "induction", "max_period": period},
                                           "model": {"vocab_size": 16}}})[0]

    note = mixed_data({"r1": (key(5), A), "r2": (key(5), B), "r3": (key(6), A), "r4": (key(6), "c" * 64)})
    assert note == ("these 4 runs (in 2 task settings) were trained on other data within each setting (data hash "
                    "task.max_period=5: aaaaaaaaaaaa: r1; bbbbbbbbbbbb: r2 | task.max_period=6: aaaaaaaaaaaa: r3; "
                    "cccccccccccc: r4): another version of the data generator (dynamics.tasks.GENERATOR_VERSIONS); a "
                    "difference between them may be the data's, not the experiment's (each run's data_hash attribute "
                    "says which)")
    assert mixed_data({"r1": (key(5), A), "r3": (key(6), B)}) is None  # other settings: other data by design


def test_a_note_quoting_a_stores_attrs_prints_their_control_characters_escaped(capsys):
    # the mixed-execution note quotes each run's torch version and device, which a store from
    # elsewhere sets to anything: an escape sequence there reached the terminal raw
    from dynamics.messages import print_note

    print_note("runs trained with torch 2.13.0\x1b[2J\x1b]0;x\x07\r and 2.12.0")
    assert capsys.readouterr().err == "dynamics: note: runs trained with torch 2.13.0\\x1b[2J\\x1b]0;x\\x07\\r and 2.12.0\n"


def test_runs_whose_importance_is_of_two_forms_are_noted(tmp_path, capsys):
    # A run begun before the per-sequence importance (no importance_form attr) beside runs of it:
    # the code-hash note said other code trained it, not that its importance is another measure
    from dynamics import store
    from dynamics.messages import note_mixed_training
    from tests.test_store import write_run

    path = tmp_path / "s.zarr"
    store.init_store(path)
    same = {"status": "completed", "code_hash": A}
    write_run(path, "r1", attrs=same | {"importance_form": "per_sequence"})
    write_run(path, "r2", attrs=same | {"importance_form": "per_sequence"})
    assert note_mixed_training(str(path), ["r1", "r2"]) == []
    write_run(path, "r0", attrs=same)
    said = note_mixed_training(str(path), ["r0", "r1", "r2"])
    assert said == ["these 3 runs' importance is not all of one form (per_sequence: r1, r2; batch: r0): a run "
                    "begun before the per-sequence form (no importance_form attribute) holds |dL/dg| of the batch's "
                    "mean loss, so importance, winner_take_all and the importance target compare two measures"]
    assert capsys.readouterr().err == f"dynamics: note: {said[0]}\n"


def test_the_report_notes_runs_whose_importance_is_of_two_forms():
    # as analyse, predict and the demo say it, read from each run's attrs as the report reads them
    import numpy as np

    from dynamics.provenance import importance_form
    from dynamics.report.data import _Run, training_notes

    def run(rid, attrs):
        return _Run(rid, "completed", {}, 1.0, 0, np.zeros(0, bool), np.zeros(0, np.int64),
                    importance_form=importance_form(attrs))

    new = {"importance_form": "per_sequence"}
    assert training_notes([run("r1", new), run("r2", new)]) == []
    [note] = training_notes([run("r1", new), run("r2", {})])
    assert note.startswith("these 2 runs' importance is not all of one form (per_sequence: r1; batch: r2)")
