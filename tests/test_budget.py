"""The memory check: a config that cannot fit is one line naming what to lower, before any work."""

import itertools
from pathlib import Path

import pytest

from dynamics.budget import (
    MEMORY_ENV,
    DoesNotFit,
    cgroup_limit,
    check_fits,
    check_memory,
    estimate,
    machine_memory,
    n_snapshots,
)
from dynamics.config import ConfigError, RunConfig, from_dict, load_config, replace_section, with_values
from dynamics.record import snapshot_steps

GIB = 2**30


def test_n_snapshots_counts_the_schedule_without_building_it():
    for steps, dense, every in itertools.product(range(1, 70), (0, 1, 3, 8, 64, 100), (1, 2, 3, 8, 30, 100)):
        assert n_snapshots(steps, dense, every) == len(snapshot_steps(steps, dense, every)), (steps, dense, every)


@pytest.mark.parametrize("section, key, needle", [
    # each was accepted, made the store and a run group, and failed tens of seconds later with a MemoryError
    ("train", {"batch_size": 10**8}, "for a training step), more than the 16.0 GiB this machine has: lower "
                                     "train.batch_size, model.context, model.vocab_size, model.d_model, model.d_mlp or "
                                     "model.n_layers, or set DYNAMICS_MEMORY_GB"),
    ("record", {"n_probe": 10**6}, "for an attention snapshot), more than the 16.0 GiB this machine has: lower "
                                   "record.n_probe or model.context"),
    ("record", {"eval_batch_size": 10**7}, "for an evaluation), more than the 16.0 GiB this machine has: lower "
                                           "train.eval_batches, record.eval_batch_size"),
    # 10^8 snapshots: a set of Python ints to build, then an array and a dict held throughout (measured
    # 75 and 110 bytes a snapshot at 5 million); counted as 36 bytes, once, it passed on a 4 GiB machine
    ("train", {"steps": 10**8}, "of it for the loss curve and snapshot schedule, + 15.0 MiB for a training step), "
                                "more than the 4.0 GiB this machine has: lower train.steps or record.every"),
])
def test_a_config_that_cannot_fit_is_refused_naming_what_to_lower(section, key, needle):
    cfg = from_dict({section: key, "record": {"every": 1}} if "steps" in key else {section: key})
    with pytest.raises(ConfigError, match="^config needs at least") as e:
        check_memory(cfg, 4 * GIB if "steps" in key else 16 * GIB)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_long_context_is_counted_in_the_attention_maps():
    # T x T per layer, head and probe sequence: context 4096 with the default probe is 4 GiB of float32 maps
    cfg = from_dict({"model": {"context": 4096}})
    assert estimate(cfg).largest == "an attention snapshot"
    assert estimate(cfg).phases["an attention snapshot"] == (4 + 4 + 2) * 2 * 4 * 8 * 4096**2  # 10 GiB
    check_memory(cfg, 16 * GIB)
    with pytest.raises(ConfigError, match="record.n_probe or model.context"):
        check_memory(cfg, 8 * GIB)


def test_the_default_config_fits_in_little_memory():
    assert estimate(RunConfig()).peak < 32 * 2**20
    check_memory(RunConfig(), 2**28)
    check_fits(RunConfig())  # this machine


def test_a_gpu_run_is_checked_in_host_memory_for_its_host_side_only():
    # the activations live on the GPU: the host holds the tokens, the loss curve and the maps copied out
    cfg = from_dict({"train": {"device": "cuda", "batch_size": 2**20}})
    assert estimate(cfg, "host").peak < estimate(cfg, "device").peak < estimate(cfg).peak
    check_memory(cfg, 4 * GIB, part="host")
    with pytest.raises(ConfigError, match="for a training step"):
        check_memory(cfg, 4 * GIB, part="device")


def test_the_environment_sets_the_memory_checked_against(monkeypatch):
    cfg = from_dict({"train": {"batch_size": 10**6}})  # ~460 GiB
    monkeypatch.setenv(MEMORY_ENV, "1000")
    assert machine_memory() == 10**12
    check_fits(cfg)
    monkeypatch.setenv(MEMORY_ENV, "2")
    with pytest.raises(ConfigError, match=f"more than the 1.9 GiB {MEMORY_ENV} allows"):
        check_fits(cfg)
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(ConfigError, match=f"^{MEMORY_ENV}='lots': expected a positive number of GB$"):
        check_fits(cfg)


@pytest.mark.parametrize("raw, needle", [
    # the largest part is held throughout: the phase's keys (train.batch_size) would not shrink it
    ({"task": {"pool_size": 10**8}}, "48.4 GiB of it for the tokens, + 15.0 MiB for a training step), more than "
                                     "the 16.0 GiB this machine has: lower task.pool_size"),
    ({"model": {"d_model": 8192, "n_heads": 8, "n_layers": 12}}, "of it for the model, + 4.5 GiB for a training "
                                                                 "step), more than the 16.0 GiB this machine has: "
                                                                 "lower model.d_model"),
])
def test_the_message_names_the_keys_of_the_largest_part(raw, needle):
    with pytest.raises(DoesNotFit) as e:
        check_memory(from_dict(raw), 16 * GIB)
    assert needle in str(e.value)


def test_a_model_too_large_to_hold_is_told_to_shrink_the_model_not_the_batch():
    # 39.0 GiB of model and 168 GiB for a training step on a 23.5 GiB machine said "lower
    # train.batch_size, model.context or model.vocab_size"; at batch 1 it was refused again, for
    # the model. What is held alone does not fit, so only its keys can help.
    from dynamics.budget import estimate

    cfg = from_dict({"model": {"n_layers": 48, "d_model": 2048, "d_mlp": 8192, "n_heads": 8, "context": 512},
                     "train": {"batch_size": 64}})
    est = estimate(cfg)
    assert est.held["the model"] < est.phases["a training step"]  # the step is the largest part...
    with pytest.raises(DoesNotFit) as e:
        check_memory(cfg, est.state - 1)  # ...yet the held state alone is over
    assert "of it for the model, + " in str(e.value)
    assert ": lower model.d_model, model.n_layers, model.d_mlp or model.vocab_size, or set" in str(e.value)
    with pytest.raises(DoesNotFit) as e:  # with room for what is held, the step is what to lower
        check_memory(cfg, est.state + est.held["the model"])
    assert "for a training step), more than" in str(e.value) and ": lower train.batch_size, " in str(e.value)


def test_a_finished_run_needs_no_memory_but_a_bad_limit_is_refused_anyway(monkeypatch):
    # a store copied from a larger machine: rerunning to confirm nothing is left was refused
    cfg = from_dict({"train": {"batch_size": 10**8}})
    monkeypatch.setenv(MEMORY_ENV, "4")
    check_fits(cfg, lambda: True)
    with pytest.raises(DoesNotFit):
        check_fits(cfg, lambda: False)
    asked = []
    check_fits(RunConfig(), lambda: asked.append(1))  # asked only when the run does not fit
    assert not asked
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(ConfigError, match=f"^{MEMORY_ENV}='lots'") as e:
        check_fits(cfg, lambda: True)
    assert not isinstance(e.value, DoesNotFit)


@pytest.mark.parametrize("value, want", [("1e3", 10**12), (" 4 ", 4 * 10**9), ("0.5", 5 * 10**8), ("", None)])
def test_the_limit_is_read_as_gb(monkeypatch, value, want):
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    here = machine_memory()
    monkeypatch.setenv(MEMORY_ENV, value)
    assert machine_memory() == (want or here)  # empty: unset, as `DYNAMICS_MEMORY_GB= dynamics run` means


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e400", "4GB", "0x10"])
def test_a_bad_limit_is_one_line(monkeypatch, value):
    monkeypatch.setenv(MEMORY_ENV, value)
    with pytest.raises(ConfigError, match=f"^{MEMORY_ENV}='{value}': expected a positive number of GB$"):
        machine_memory()


def test_the_cgroup_limit_is_the_lowest_set(tmp_path):
    # real files laid out as /sys/fs/cgroup and /proc/self/cgroup are on a v2 host and a v1 one
    def layout(files: dict, proc: str) -> int | None:
        for name, text in files.items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
        (tmp_path / "cgroup").write_text(proc)
        return cgroup_limit(str(tmp_path / "fs"), str(tmp_path / "cgroup"))

    assert layout({}, "0::/\n") is None
    assert layout({"fs/memory.max": "max\n"}, "0::/\n") is None  # no limit
    assert layout({"fs/user.slice/memory.max": "4294967296\n"}, "0::/user.slice\n") == 2**32  # a host's own group
    assert layout({"fs/memory.max": "2147483648\n"}, "0::/user.slice\n") == 2**31  # a container's root
    (tmp_path / "fs" / "memory.max").unlink()
    (tmp_path / "fs" / "user.slice" / "memory.max").unlink()
    # v1: "unlimited" is a number past any memory; the process's own group holds the limit
    assert layout({"fs/memory/memory.limit_in_bytes": "9223372036854771712\n",
                   "fs/memory/job/memory.limit_in_bytes": "1073741824\n"}, "4:memory:/job\n1:cpu:/\n") == 2**30


def test_a_gpu_run_draws_its_pool_on_the_host():
    # only the pool's batches move to the GPU: the pool counted there refused runs that fit
    cfg = from_dict({"train": {"device": "cuda"}, "task": {"pool_size": 10**7}})
    assert estimate(cfg, "device").held["the tokens"] < 2**20 < 10**7 * 8 * 65 == estimate(cfg, "host").held["the tokens"] - 8 * 65 * 8


def test_no_experiment_point_is_refused_on_a_4_gib_machine():
    shipped = sorted(Path(__file__).parents[1].glob("experiments/*.toml"))
    assert len(shipped) >= 10, shipped  # none found checked nothing, and passed
    for path in shipped:
        cfg = load_config(path)
        for values in itertools.product(*cfg.sweep.axes.values()):
            point = with_values(cfg, dict(zip(cfg.sweep.axes, values, strict=True)))
            assert estimate(point).peak < 64 * 2**20, (path.name, values)  # 4 GiB / 64: ample margin
            check_memory(point, 4 * GIB)


def test_the_machines_memory_is_lowered_to_its_cgroup_limit(monkeypatch):
    # budget.machine_memory: a container's limit below the physical memory is what a run may use
    # (dropping `min(total, limit)`, mutant B31, checked runs against the host's whole memory and
    # let the kernel's OOM killer refuse them instead). cgroup_limit stands in for the files
    # under /sys/fs/cgroup, which a test cannot set; the physical memory is this machine's own.
    import os

    from dynamics import budget

    monkeypatch.delenv(budget.MEMORY_ENV, raising=False)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert physical > 2**26
    monkeypatch.setattr(budget, "cgroup_limit", lambda: 2**26)
    assert budget.machine_memory() == 2**26
    monkeypatch.setattr(budget, "cgroup_limit", lambda: physical * 2)  # v1's "no limit": a number past any memory
    assert budget.machine_memory() == physical


def test_workers_that_fit_share_the_memory_by_the_largest_run():
    # Each point was checked alone: two runs of 5 GiB each passed on a 6 GB machine and ran at once.
    from dynamics.budget import estimate, workers_that_fit

    small = RunConfig()
    large = replace_section(small, "train", batch_size=small.train.batch_size * 8)
    peak = estimate(large).peak
    assert peak > estimate(small).peak
    assert workers_that_fit([small, large, small], 3, available=10 * peak) == (3, None)  # room for all
    assert workers_that_fit([small, large, small], 3, available=3 * peak) == (3, None)  # exactly
    k, note = workers_that_fit([small, large, small], 3, available=3 * peak - 1)  # k x the largest, not the sum
    assert k == 2 and note == (f"3 workers would need at least {3 * peak:,} bytes together (3 x the largest run's "
                               f"estimate, {peak / 2**30:.1f} GiB), more than the {3 * peak - 1:,} bytes this machine "
                               f"has: training on 2 worker(s)")  # sizes that read apart, as check_memory's
    assert workers_that_fit([small, large, small], 3, available=peak // 2)[0] == 1  # each run alone: refused elsewhere
    assert workers_that_fit([large], 1, available=1) == (1, None)
    assert workers_that_fit([small, large], 3, available=2 * peak) == (3, None)  # two runs: two at once at most


def test_workers_on_one_gpu_share_its_memory_too(monkeypatch):
    # every local worker of a cuda sweep uses the one GPU: its device estimate counts k times there,
    # where only the host part (the tokens, the loss curve: small) was multiplied
    from dynamics.budget import MEMORY_ENV, estimate, workers_that_fit

    gpu = replace_section(RunConfig(), "train", device="cuda", batch_size=4096)
    device, host = estimate(gpu, "device").peak, estimate(gpu, "host").peak
    assert device > 20 * host
    monkeypatch.setenv(MEMORY_ENV, str(2.5 * device / 1e9))  # checks the GPU against it too, as check_fits does
    k, note = workers_that_fit([gpu] * 8, 8)
    assert k == 2 and note.endswith(f"{MEMORY_ENV} allows: training on 2 worker(s)") and note.startswith("8 workers")
    # a mixed grid's CPU runs leave the GPU alone: two cuda runs fit on it whatever the workers
    cpu = replace_section(RunConfig(), "train", batch_size=4)
    assert workers_that_fit([gpu, gpu, cpu, cpu, cpu, cpu], 6) == (6, None)
    assert workers_that_fit([gpu, gpu, gpu, cpu, cpu, cpu], 6)[0] == 2


def test_a_sweep_trains_on_the_workers_its_runs_fit_in(tmp_path, monkeypatch, capsys):
    from dynamics.budget import MEMORY_ENV, estimate
    from dynamics.config import load_config
    from tests.conftest import TINY, cli_in_process

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY.format(steps=3, every=1) + '\n[sweep]\n"train.seed" = [0, 1]\n')
    peak = estimate(load_config(cfg)).peak
    monkeypatch.setenv(MEMORY_ENV, str(1.5 * peak / 1e9))  # one run fits, two do not
    r = cli_in_process("sweep", str(cfg), "--out", str(tmp_path / "s.zarr"), "--workers", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("dynamics: note: 2 workers would need at least ") and lines[0].endswith(
        f"{MEMORY_ENV} allows: training on 1 worker(s)")
    assert "2 run(s) to train on 1 worker(s)" in lines[1]
