"""The bench scripts (bench/): the figures README's Performance section quotes come from them."""

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import analysis as bench_analysis
from bench import record as bench_record
from bench import rounding as bench_rounding
from bench import store as bench_store
from bench import sweep as bench_sweep
from bench import train as bench_train
from tests.conftest import TINY as TINY_TOML

ROOT = Path(__file__).resolve().parents[1]
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"  # where train.py sets malloc's thresholds


def test_flops_per_token_of_the_default_model_matches_a_hand_count():
    # RunConfig(): L 2, d_model 64, H 4 x d_head 16, d_mlp 256, V 64, T 64, RoPE (no W_pos).
    # Matmul weights per layer: W_Q, W_K, W_V, W_O 4 x 64 x 64 + W_in, W_out 2 x 64 x 256 = 49,152;
    # two layers plus W_U 64 x 64: N = 102,400. Attention over the causal triangle, forward and
    # backward: 6 L (T + 1) H d_head = 6 x 2 x 65 x 4 x 16 = 49,920.
    from dynamics.config import RunConfig
    from dynamics.train import build

    cfg = RunConfig()
    fpt, n = bench_train.flops_per_token(cfg, build(cfg, bench_train.torch.device("cpu")))
    assert n == 102_400
    assert fpt == 6 * 102_400 + 49_920


def test_the_batch_line_is_the_least_squares_line_through_the_step_times():
    # On a line, the fit is that line: 2 ms + 0.5 ms a row.
    assert bench_train.line_through({16: 10.0, 32: 18.0, 64: 34.0}) == pytest.approx((2.0, 0.5))
    # Off it, least squares: x 16, 32, 64 (mean 112/3, so 3 dx = -64, -16, 80); y 10, 20, 34
    # (mean 64/3, 3 dy = -34, -4, 38); slope = sum dx dy / sum dx^2 = 5,280 / 10,752 = 0.491...,
    # and the line passes through the means: intercept = 64/3 - slope x 112/3 = 2.99...
    slope = 5_280 / 10_752
    assert bench_train.line_through({16: 10.0, 32: 20.0, 64: 34.0}) == pytest.approx((64 / 3 - slope * 112 / 3, slope))


@pytest.mark.parametrize("main, argv", [
    (bench_train.main, ["--steps", "0"]),
    (bench_train.main, ["--repeats", "0"]),
    (bench_train.main, ["--run-steps", "20"]),  # its progress comes every 10 steps: too few to time
    (bench_train.main, ["--allocator-rounds", "0"]),
    (bench_record.main, ["--repeats", "0"]),
    (bench_record.main, ["--calls", "0", "--skip-runs"]),
    (bench_record.main, ["--threads", "0"]),
    (bench_store.main, ["--snapshots", "0"]),
    (bench_store.main, ["--repeats", "0"]),
    (bench_store.main, ["--index-runs", "12", "0"]),
    (bench_sweep.main, ["--workers", "0"]),  # hung: a LocalCluster of no workers
    (bench_sweep.main, ["--repeat", "0"]),
    # the second sweep of a count found its store's runs completed, and timed nothing: ~0 s
    (bench_sweep.main, ["--workers", "1", "2", "1"]),
    (bench_analysis.main, ["--runs", "0"]),
    (bench_analysis.main, ["--store-mb", "-1"]),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v.__module__)
def test_a_bad_flag_is_one_line_and_exit_2_before_any_work(main, argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and argv[0] in err, err


@pytest.mark.parametrize("main, argv, names", [
    (bench_record.main, ["--steps", "10", "--config", "no-such.toml"], "no-such.toml"),
    (bench_record.main, ["--device", "tpu"], "train.device"),
    (bench_train.main, ["--set", "model.d_model=65"], "model.d_model"),
    # replaced by --device and --threads: `--set train.device=cuda` ran on the CPU
    (bench_train.main, ["--set", "train.device=cuda"], "--set train.device: this bench sets it from --device"),
    (bench_train.main, ["--set", "train.threads=2"], "--set train.threads: this bench sets it from --threads"),
    (bench_sweep.main, ["--steps", str(10**9)], "train.steps"),
    (bench_analysis.main, ["--skip-time", "--heads", "3"], "--heads 3"),  # 3 heads do not divide d_model 64
    # each was a traceback (exit 1) after the store was built or a run trained
    (bench_sweep.main, ["--runs", "100000", "--workers", "1"], "is more than the 10,000 a sweep may have"),
    (bench_analysis.main, ["--skip-memory", "--steps", "2"], "--steps 2: 3 snapshot(s), and an analysis needs >= 4"),
    (bench_analysis.main, ["--skip-time", "--heads", "64"], "(64 / 64, d_head 0): RoPE needs an even head width"),
    (bench_analysis.main, ["--skip-time", "--context", "1"], "model.context: must be >= 2"),
    (bench_analysis.main, ["--skip-memory", "--config", "experiments/distill.toml"], "intervene.distill.teacher"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v.__module__ if callable(v) else "")
def test_a_bad_config_is_one_line_and_exit_2(main, argv, names, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # experiments/distill.toml as a user gives it, from the project's root
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and names in err, err


def test_record_bench_refuses_a_cuda_device_this_torch_cannot_use(capsys):
    if bench_record.torch.cuda.is_available():
        pytest.skip("CUDA is usable here")
    assert bench_record.main(["--device", "cuda", "--skip-runs"]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_analysis_bench_refuses_a_configs_cuda_device_this_torch_cannot_use(tmp_path, capsys):
    # its config's train.device was trained on as given: a 35-line traceback, exit 1
    if bench_record.torch.cuda.is_available():
        pytest.skip("CUDA is usable here")
    config = tmp_path / "cuda.toml"
    config.write_text('[train]\ndevice = "cuda"\n')
    assert bench_analysis.main(["--skip-memory", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: train.device 'cuda': this torch 2.13.0+cpu has no usable CUDA device".replace(
        "2.13.0+cpu", bench_record.torch.__version__)


def test_analysis_child_reports_a_run_it_could_not_analyse_as_failed(tmp_path, capsys):
    # analyse_store reports a run whose analysis raised (a MemoryError under the bench's
    # RLIMIT_AS among them) as a skipped row instead of raising: the child said "ok", and the
    # bench printed "finished" under a cap the analysis had not got through.
    path = tmp_path / "s.zarr"
    bench_analysis.build_store(str(path), layers=1, heads=2, probes=1, context=8, attention_mb=0.001,
                               run_id="synthetic0")
    chunks = sorted((path / "runs" / "synthetic0" / "attention").rglob("c/*"))
    shutil.rmtree(chunks[0]) if chunks[0].is_dir() else chunks[0].unlink()  # a chunk gone
    assert bench_analysis.child(str(path), None) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ok"] is False and "synthetic0" in out["error"]


def test_analysis_peak_rss_is_the_childs_own_not_its_parents():
    # ru_maxrss of a process spawned by fork/vfork + exec starts at its parent's peak RSS: the
    # bench's child, spawned by a parent that had just built a store, reported that as its peak.
    ballast = np.ones(256 * 2**20 // 8)  # this process's peak rises past 256 MiB
    del ballast
    code = "import sys; sys.path.insert(0, sys.argv[1]); from bench._common import peak_rss_bytes; print(peak_rss_bytes())"
    res = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, check=True)
    assert int(res.stdout) < 128 * 2**20


def test_the_train_benchs_worker_reports_its_own_peak_memory():
    # Its "peak RSS MiB" column read ru_maxrss: both malloc settings' workers showed the parent's peak.
    ballast = np.ones(1536 * 2**20 // 8)  # this process's peak rises past 1.5 GiB, far above a worker's
    ballast[::512] = 1.0
    del ballast
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "train.py"), "--worker", "--threads", "1", "--steps", "1",
                          "--repeats", "1"], capture_output=True, text=True, check=True)
    peak = json.loads(res.stdout.strip().splitlines()[-1])["peak_mib"]
    assert 0 < peak < 1024, peak


def test_bench_figures_are_not_measured_on_a_diverged_run(tmp_path, capsys):
    # analysis.py printed a time share against 5 steps of training labelled as 60, exit 0; train.py
    # failed with an IndexError, record.py with an AssertionError (none under python -O)
    from dynamics.config import from_dict

    diverges = {"train": {"lr": 300.0, "warmup_steps": 1, "steps": 60}}
    config = tmp_path / "div.toml"
    config.write_text("[train]\nlr = 300.0\nwarmup_steps = 1\n")
    with pytest.raises(SystemExit, match=r"^bench analysis: the trained run ended diverged after \d+ of 50 steps; no "
                                         r"time share is measured on it$"):
        bench_analysis.main(["--skip-memory", "--config", str(config), "--steps", "60", "--rounds", "1", "--analyses", "1"])
    with pytest.raises(SystemExit, match=r"^bench train: the train_run ended diverged after \d+ of 60 steps"):
        bench_train.train_run_step_time(from_dict(diverges), 60, str(tmp_path))
    with pytest.raises(SystemExit, match=r"^bench record: a run ended diverged after \d+ of 60 steps"):
        bench_record.run_once(from_dict(diverges), str(tmp_path), True)


def test_rounding_compares_two_stores_of_the_same_run_with_known_differences(tmp_path, capsys):
    import tomllib

    from dynamics import store
    from dynamics.analyse import analyse_store
    from dynamics.config import from_dict
    from dynamics.record import coords, snapshot_steps, variables
    from dynamics.train import train_run
    from tests.conftest import TINY

    cfg = from_dict(tomllib.loads(TINY.format(steps=10, every=5)))
    a, b = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    run_id = train_run(cfg, a).run_id
    shutil.copytree(a, b)
    analyse_store(a)
    analyse_store(b)
    same = bench_rounding.compare_run(a, b, run_id)
    assert same["first_step"] is None and same["loss_rel"] == 0 and same["attention"] == 0 and same["roles"] == 0

    # b: the loss from step 3 on half as large again, one final attention weight moved by 0.25
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    run = store.open_run(b, run_id)
    loss = run.loss.values
    att = run.attention.isel(snapshot=-1).values.copy()  # (layer, head, probe, query, key)
    att[0, 0, 0, 5, 2] += np.float16(0.25)
    w = store.RunWriter(b, run_id, variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                        attrs={}, resume=True)
    w.write_region("loss", 3, loss[3:] * np.float32(1.5))
    w.write_snapshot(len(steps_at) - 1, {"attention": att})
    got = bench_rounding.compare_run(a, b, run_id)
    assert got["first_step"] == 3
    assert got["loss_rel"] == pytest.approx(1 / 3, rel=1e-6)  # |l - 1.5 l| / (1.5 l)
    assert got["attention"] == pytest.approx(0.25, abs=1e-3)  # float16 rounding of the moved weight
    assert got["heads"] == cfg.model.n_layers * cfg.model.n_heads

    assert bench_rounding.main([a, b]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == [run_id, "3", "3.33e-01", "0.25", f"0/{got['heads']}"]  # no swept values: one run
    assert out[-1] == f"final roles differing: 0 of {got['heads']} heads"
    assert bench_rounding.main([a, str(tmp_path / "none.zarr")]) == 2
    assert "none.zarr is not a dynamics store" in capsys.readouterr().err
    # a damaged run: one line and exit 2, as other bad input, where a StoreError's traceback was
    Path(b, "runs", run_id, "zarr.json").write_text("{bad")
    assert bench_rounding.main([a, b]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and run_id in err, err


def test_rounding_counts_a_value_one_store_lacks_as_a_difference(tmp_path):
    # A run that diverged in one store only (NaN losses from then on, its last attention unwritten)
    # printed a loss difference of 0 and an attention difference of 0 or nan: the differences were
    # taken with nanmax, which passes over a NaN against a number. They are inf now.
    import tomllib

    from dynamics import store
    from dynamics.config import from_dict
    from dynamics.record import coords, snapshot_steps, variables
    from dynamics.train import train_run
    from tests.conftest import TINY

    cfg = from_dict(tomllib.loads(TINY.format(steps=10, every=5)))
    a, b = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    run_id = train_run(cfg, a).run_id
    shutil.copytree(a, b)
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    run = store.open_run(b, run_id)
    w = store.RunWriter(b, run_id, variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                        attrs={}, resume=True)
    w.write_region("loss", 6, np.full(run.loss.size - 6, np.nan, np.float32))
    got = bench_rounding.compare_run(a, b, run_id)
    assert got["first_step"] == 6 and got["loss_rel"] == np.inf and got["attention"] == 0
    att = run.attention.isel(snapshot=-1).values.copy()
    att[0, 0, 0, 5, :] = np.nan  # one map's row unwritten in b: NaN against a's weights
    w.write_snapshot(len(steps_at) - 1, {"attention": att})
    assert bench_rounding.compare_run(a, b, run_id)["attention"] == np.inf



def test_rounding_compares_two_identical_diverged_runs_as_equal(tmp_path):
    # The schedule's last snapshot was compared, which a diverged run never writes: two bitwise
    # copies printed an attention difference of nan
    import tomllib

    from dynamics.config import from_dict
    from dynamics.train import train_run
    from tests.conftest import TINY

    raw = tomllib.loads(TINY.format(steps=40, every=10))
    raw["train"].update(lr=1e6, grad_clip=0.0)
    a, b = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    result = train_run(from_dict(raw), a)
    assert result.status == "diverged"
    shutil.copytree(a, b)
    got = bench_rounding.compare_run(a, b, result.run_id)
    assert got["attention"] == 0.0 and got["loss_rel"] == 0.0 and got["first_step"] is None


@pytest.mark.parametrize("script, argv, printed", [
    # --set a narrower MLP: every section on a cheaper model, and the override seen to reach it
    # (2 x (4 x 64 x 64 + 2 x 64 x 128) + 64 x 64 = 69,632 weights)
    ("train.py", ["--steps", "1", "--repeats", "1", "--peak-n", "64", "--run-steps", "21", "--pairs", "1", "--no-threads",
                  "--allocator-rounds", "1", "--set", "model.d_mlp=128"],
     ["d_model=64 H=4 d_head=16 d_mlp=128", "FLOPs/token = 6 x 69632 + 6 L (T+1) H d_head", "MFU = ",
      "2. where the step goes", "dense matmuls:",
      "attention alone,", "profiler self time", "3. train_run(recording=False) step / bare step = ",
      "step time at batch 16 / 32 / 64: ", "the least-squares line through each round's three: ", "the rows' own ",
      "minor page faults: ", "5. malloc thresholds"]
     + (["with train.py's malloc thresholds", "train.py's (dynamics.allocator)"] if GLIBC else ["not compared"])),
    ("record.py", ["--steps", "20", "--dense-steps", "2", "--repeats", "1", "--calls", "1", "--config", "TINY"],
     ["1. end to end: train_run time / recording=False time", "every step, 2 steps, on, sync writes",
      "(the <= 3% goal is for the defaults' 1000 steps; ", " snapshot(s) after step 0 over 20 here)",
      "2. per snapshot, each piece alone", "all, training thread"]),
    # 3: past the 2 snapshots of the untimed first write, which once failed every larger run
    ("store.py", ["--snapshots", "3", "--repeats", "1", "--index-runs", "2", "20"],
     ["blosc-zstd-5-shuffle", "<- store", "store uses: zstd-1", "least CPU within 5% of the best ratio: ",
      "root index: one run's entry updated", "     20 runs ("]),
    ("analysis.py", ["--skip-memory", "--steps", "30", "--rounds", "1", "--analyses", "1", "--config", "TINY"],
     ["1. time: analyse_store / train_run on the same store", "(goal <= 10%"]),
    ("analysis.py", ["--skip-time", "--store-mb", "1", "--runs", "1", "--layers", "1", "--heads", "2", "--cap-mb", "256"],
     ["2. memory: analyse_store", "under RLIMIT_AS = baseline address space + 256 MiB: finished"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_each_bench_runs_end_to_end_and_prints_what_readme_quotes(script, argv, printed, tmp_path):
    # The other tests here check flags and formulas; a bench broken on its working path (a renamed
    # import, a changed API) went unseen until someone re-measured README's Performance table.
    # "TINY": the tests' tiny model, where the bench's figures do not matter, only its path through
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(TINY_TOML.format(steps=20, every=10))
    argv = [str(tiny) if a == "TINY" else a for a in argv]
    r = subprocess.run([sys.executable, str(ROOT / "bench" / script), *argv], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    for needle in printed:
        assert needle in r.stdout, (needle, r.stdout[-3000:])


@pytest.mark.distributed
def test_the_sweep_bench_runs_end_to_end_on_its_two_clusters():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "sweep.py"), "--runs", "2", "--steps", "10", "--repeat", "1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    for needle in ("2 runs x 10 steps, 1 worker(s): ", "2 runs x 10 steps, 2 worker(s): ", "with the cluster's start"):
        assert needle in r.stdout, (needle, r.stdout)


@pytest.mark.parametrize("main, argv, needle", [
    (bench_train.main, ["--config", "experiments/templates.toml"], "--config experiments/templates.toml: an [intervene]"),
    (bench_train.main, ["--set", "model.gates=learned"], '--set: learned gates (model.gates = "learned") changes'),
    (bench_record.main, ["--config", "experiments/distill.toml"], "--config experiments/distill.toml: an [intervene]"),
])
def test_a_config_whose_step_the_bench_does_not_reproduce_is_refused(main, argv, needle, capsys, monkeypatch):
    # The bench's step applied no intervention hooks or losses and no gate regulariser or hold:
    # its figures for such a config were not train.py's step, as the bench says they are.
    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_the_analysis_bench_times_analyses_not_analyses_kept(tmp_path, monkeypatch):
    # `dynamics analyse` keeps an analysis written from the recording a run holds: the bench's
    # second analysis of one store took 0.07 s where the first took 0.9 s, and its median share of
    # training halved. Every row it times must be analysed, none kept.
    from dynamics import cli
    from dynamics.config import load_config

    tiny = tmp_path / "tiny.toml"
    tiny.write_text(TINY_TOML.format(steps=20, every=10))
    seen = []
    analyse = cli.analyse_store

    def spy(*args, **kwargs):
        seen.append(analyse(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(cli, "analyse_store", spy)
    bench_analysis.time_round(load_config(tiny), str(tmp_path), 3)
    assert len(seen) == 3 and [[r.get("kept") for r in rows] for rows in seen] == [[None]] * 3


def test_the_record_bench_times_a_chg_fit_at_the_snapshots_it_runs_at(tmp_path, capsys):
    # With record.chg_every set, a snapshot also fits causal head gating (seconds), which the
    # per-piece table left out while its "all" row summed the rest as what recording adds.
    from dynamics.config import load_config
    from dynamics.record import chg_fitted, snapshot_steps

    path = tmp_path / "chg.toml"
    path.write_text(TINY_TOML.format(steps=20, every=10) + "chg_every = 2\nchg_steps = 3\n")
    assert bench_record.main(["--config", str(path), "--steps", "20", "--dense-steps", "4", "--skip-runs",
                              "--calls", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line[3:35].strip(): line[35:].split() for line in out.splitlines() if line.startswith("   ")
            and len(line[35:].split()) >= 4 and line[35:].split()[-1].endswith("%")}
    assert bench_record.CHG_PIECE in rows and rows[bench_record.CHG_PIECE][0] == "training"
    cfg = load_config(str(path))
    fits = int(chg_fitted(cfg, snapshot_steps(20, cfg.record.dense_until, cfg.record.every))[1:].sum())
    n = len(snapshot_steps(20, cfg.record.dense_until, cfg.record.every)) - 1
    assert 0 < fits < n  # not at every snapshot: the table weighs the fit by the snapshots it runs at
    assert (f"({bench_record.CHG_PIECE}: record.chg_every 2, so at {fits} of the {n} snapshots after step 0 at the "
            f"default cadence and 2 of 4 at the dense;") in out
    # "all" is every piece, the fit included: its default column is the rows' sum (as printed, rounded)
    pieces = [k for k in rows if not k.startswith("all")]
    default = {k: float(rows[k][-2].rstrip("%")) for k in rows}
    assert abs(sum(default[k] for k in pieces) - default["all"]) <= 0.01 * len(pieces)
    assert default[bench_record.CHG_PIECE] > 0  # timed, and counted in "all"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="needs 2 CPUs and affinity")
def test_the_benches_say_how_many_cpus_they_could_use_not_the_machines_count():
    # Under taskset (or a cgroup's cpuset) the headers said the machine's 2 CPUs where 1 was usable
    code = (f"import os, sys; sys.path.insert(0, {str(ROOT)!r}); os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}}); "
            "from bench._common import cpus; print(cpus())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.stdout.strip() == f"1 usable CPUs (of the machine's {os.cpu_count()})", r.stderr
    from bench._common import cpus
    from dynamics.limits import usable_cores

    assert cpus() == (f"{os.cpu_count()} CPUs" if usable_cores() == os.cpu_count() else
                      f"{usable_cores()} usable CPUs (of the machine's {os.cpu_count()})")
