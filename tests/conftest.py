"""Shared fixtures: tiny configs that train in seconds."""

import os

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
