"""dynamics.limits by known answers: the bounds at their exact values, where a bound tested only
through its own name moves with it unnoticed.

dynamics.schema's helpers (config_value, require_dims) are held by the sweep-grid, identity and
analyser tests; its version stamps (STORE_VERSION, ANALYSIS_VERSION) are not pinned: a test of
their values would catch only a deliberate bump."""

import math
import re

import numpy as np
import pytest

from dynamics.config import ConfigError, from_dict, load_config
from dynamics.limits import FLOAT32_MAX, MAX_CONFIG_BYTES


def test_float32_max_is_float32s_largest_and_the_bound_is_inclusive():
    assert FLOAT32_MAX == float(np.finfo(np.float32).max)
    for key in ("train.lr", "train.weight_decay", "model.init_scale", "model.rope_base"):
        section, name = key.split(".")
        assert getattr(getattr(from_dict({section: {name: FLOAT32_MAX}}), section), name) == FLOAT32_MAX
        above = math.nextafter(FLOAT32_MAX, math.inf)
        with pytest.raises(ConfigError, match=rf"^{key}: must be at most 3.403e\+38 \(float32\), got {re.escape(str(above))}$"):
            from_dict({section: {name: above}})
    # half a float32 step above: inf in the model's float32
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(FLOAT32_MAX * (1 + 2**-24)))
    with pytest.raises(ConfigError, match="^train.lr: must be at most"):
        from_dict({"train": {"lr": FLOAT32_MAX * (1 + 2**-24)}})


def test_a_config_of_16_mib_is_read_and_one_byte_more_is_refused(tmp_path):
    assert MAX_CONFIG_BYTES == 16_777_216
    path = tmp_path / "long.toml"
    head = b"[train]\nsteps = 7\n#"
    path.write_bytes(head + b"#" * (16_777_216 - len(head) - 1) + b"\n")
    assert path.stat().st_size == 16_777_216 and load_config(path).train.steps == 7
    with path.open("ab") as fh:
        fh.write(b"\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: longer than 16,777,216 bytes, which no config is (a data file or a device?)"
