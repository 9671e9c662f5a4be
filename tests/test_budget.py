"""The memory check: a config that cannot fit is one line naming what to lower, before any work."""

import itertools

import pytest

from dynamics.budget import MEMORY_ENV, check_fits, check_memory, estimate, machine_memory, n_snapshots
from dynamics.config import ConfigError, RunConfig, from_dict
from dynamics.record import snapshot_steps

GIB = 2**30


def test_n_snapshots_counts_the_schedule_without_building_it():
    for steps, dense, every in itertools.product(range(1, 70), (0, 1, 3, 8, 64, 100), (1, 2, 3, 8, 30, 100)):
        assert n_snapshots(steps, dense, every) == len(snapshot_steps(steps, dense, every)), (steps, dense, every)


@pytest.mark.parametrize("section, key, needle", [
    # each was accepted, made the store and a run group, and failed tens of seconds later with a MemoryError
    ("train", {"batch_size": 10**8}, "for a training step), more than the 16.0 GiB this machine has: lower "
                                     "train.batch_size, model.context or model.vocab_size, or set DYNAMICS_MEMORY_GB"),
    ("record", {"n_probe": 10**6}, "for an attention snapshot), more than the 16.0 GiB this machine has: lower "
                                   "record.n_probe or model.context"),
    ("record", {"eval_batch_size": 10**7}, "for an evaluation), more than the 16.0 GiB this machine has: lower "
                                           "train.eval_batches, record.eval_batch_size"),
    # 10^8 snapshots: the schedule is a set of Python ints before anything trains
    ("train", {"steps": 10**8}, "(3.4 GiB for it), more than the 1.0 GiB this machine has: lower train.steps or "
                                "record.every"),
])
def test_a_config_that_cannot_fit_is_refused_naming_what_to_lower(section, key, needle):
    cfg = from_dict({section: key, "record": {"every": 1}} if "steps" in key else {section: key})
    with pytest.raises(ConfigError, match="^config needs at least") as e:
        check_memory(cfg, GIB if "steps" in key else 16 * GIB)
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
