"""Shared fixtures: tiny configs that train in seconds."""

import os

import numpy as np
import pytest

# Tests run single-threaded torch: deterministic and fair on a shared 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


TINY = """
[model]
n_layers = 2
d_model = 32
n_heads = 2
attn_only = true
vocab_size = 16
context = 16

[task]
name = "induction"
min_period = 3
max_period = 6

[train]
steps = {steps}
lr = 3e-3
batch_size = 16
seed = 0
warmup_steps = 5

[record]
dense_until = 8
every = {every}
n_probe = 4
eval_batch_size = 16
"""


@pytest.fixture
def tiny_config(tmp_path):
    """Write a tiny induction config; returns a function(steps, every) -> path."""

    def make(steps: int = 40, every: int = 10, extra: str = "") -> str:
        p = tmp_path / f"tiny_{steps}_{every}.toml"
        p.write_text(TINY.format(steps=steps, every=every) + extra)
        return str(p)

    return make


def wait_for_checkpoint(path, run_id: str, at_least: int, timeout: float = 120.0) -> None:
    """Poll a store until ``run_id``'s checkpoint has reached step ``at_least`` (or time runs out),
    so a test can stop a training subprocess mid-run."""
    import time

    from dynamics import store

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.is_store(path) and run_id in store.list_runs(path):
            if store.run_attrs(path, run_id).get("checkpoint_step", 0) >= at_least:
                return
        time.sleep(0.02)


def assert_same_run_arrays(a, b) -> None:
    """The runs recorded at stores `a` and `b` hold the same variables, bitwise equal."""
    from dynamics import store

    got, want = store.open_run(a).load(), store.open_run(b).load()
    assert set(got.data_vars) == set(want.data_vars)
    for name in want.data_vars:
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)


def interrupt_at(n: int):
    """A train_run progress callback that stops the run, as Ctrl-C would, once it reports step >= n."""

    def progress(step, steps, loss):
        if step >= n:
            raise KeyboardInterrupt

    return progress
