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
