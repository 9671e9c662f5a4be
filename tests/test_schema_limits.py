"""dynamics.limits by known answers: the bounds at their exact values, where a bound tested only
through its own name moves with it unnoticed.

dynamics.schema's helpers (config_value, require_dims) are held by the sweep-grid, identity and
analyser tests; its version stamps (STORE_VERSION, ANALYSIS_VERSION) are not pinned: a test of
their values would catch only a deliberate bump."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dynamics.config import ConfigError, from_dict, load_config
from dynamics.limits import DEEPEST_IN_REPORT, DEEPEST_IN_STORE, FLOAT32_MAX, MAX_CONFIG_BYTES, MAX_STEPS
from dynamics.store._loc import MAX_RUN_ID
from tests.conftest import TINY, cli_in_process


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


# Every command that writes, at the deepest store and report folder allowed, with the longest new
# run id: each exits 0, and the deepest path each made, read by an audit hook (zarr's temporaries
# and renames included), is the bound less the digits a longer run's chunk indices and snapshot
# numbers may add. In a process of its own: an audit hook cannot be removed.
_DEEPEST_SCRIPT = """
import json, os, sys
from dynamics.cli import main
store, report, cfg, rid = sys.argv[1:5]
deepest = {store: "", report: ""}
def hook(event, args):
    if event in ("open", "os.mkdir", "os.rename"):
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)):
                a = os.fsdecode(a)
                for top in deepest:
                    if a.startswith(top + "/") and len(a) - len(top) > len(deepest[top]):
                        deepest[top] = a[len(top):]
sys.addaudithook(hook)
rcs = [main(argv) for argv in (
    ["run", cfg, "--out", store, "--run-id", rid], ["run", cfg, "--out", store, "--set", "train.seed=1"],
    ["analyse", store, "--workers", "1"], ["gates", store, "--run", rid, "--steps", "2", "--restarts", "1"],
    ["predict", store, "--target", "role", "--folds", "2"], ["report", store, "--out", report])]
print(json.dumps({"rcs": rcs, "store": deepest[store], "report": deepest[report]}))
"""


def _folder_of_length(base, length: int) -> str:
    """A new folder under `base` whose absolute path is `length` bytes long."""
    path = str(base)
    while len(path) < length:
        path = os.path.join(path, "d" * min(250, length - len(path) - 1))
    os.makedirs(path)
    assert len(os.fsencode(path)) == length
    return path


def test_every_command_writes_within_the_depth_bounds_at_the_deepest_root_allowed(tmp_path):
    limit = os.pathconf(tmp_path, "PC_PATH_MAX")
    store = os.path.join(_folder_of_length(tmp_path / "s", limit - 1 - DEEPEST_IN_STORE - 7), "s.zarr")
    report = _folder_of_length(tmp_path / "r", limit - 1 - DEEPEST_IN_REPORT)
    os.rmdir(report)  # the report makes it
    assert len(store) + DEEPEST_IN_STORE == len(report) + DEEPEST_IN_REPORT == limit - 1
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY.format(steps=10, every=5).replace("n_heads = 2", "n_heads = 4"))
    rid = "r" * MAX_RUN_ID
    done = subprocess.run([sys.executable, "-c", _DEEPEST_SCRIPT, store, report, str(cfg), rid],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["rcs"] == [0] * 6, done.stderr[-3000:]
    # a chunk of the snapshot axis, index 0-9 here; 8 more digits for MAX_STEPS' 10^8 snapshots
    assert re.fullmatch(rf"/runs/{rid}/head_weights/c/\d/0/0/0/0/0\.[0-9a-f]{{32}}\.partial", got["store"])
    assert len(got["store"]) == DEEPEST_IN_STORE - 8 == 202 and MAX_STEPS == 10**8
    # snapshot_0004.png: 5 more digits for 10^8 snapshots, 5 for the generation's count
    assert re.fullmatch(r"/figures/\d{8}-\d{6}-0/attention/snapshot_\d{4}\.png", got["report"])
    assert len(got["report"]) == DEEPEST_IN_REPORT - 10 == 54


def test_a_store_or_report_one_byte_deeper_is_refused_before_any_work(tmp_path, tiny):
    d, cfg, made = tiny
    limit = os.pathconf(tmp_path, "PC_PATH_MAX")
    root = _folder_of_length(tmp_path / "s", limit - DEEPEST_IN_STORE - len("/s.zarr"))
    store = os.path.join(root, "s.zarr")
    assert len(store) + DEEPEST_IN_STORE == limit
    done = cli_in_process("run", str(cfg), "--out", store)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"dynamics: error: --out {store}: a path {len(store):,} bytes long, and the files a store "
                           f"holds lie up to {DEEPEST_IN_STORE} bytes deeper, past the {limit:,} a path may have "
                           "here; give a shorter path\n")
    assert os.listdir(root) == []
    # the same folder reached through a link and `..`: short as text, as deep where it is written
    (Path(root) / "sub").mkdir()
    os.symlink(Path(root) / "sub", tmp_path / "lnk")
    done = cli_in_process("run", str(cfg), "--out", "lnk/../s.zarr", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith(f"dynamics: error: --out lnk/../s.zarr: a path {len(store):,} "
                                                           "bytes long, and the files a store holds")
    assert os.listdir(root) == ["sub"]
    os.rmdir(Path(root) / "sub")
    # a store made elsewhere, moved this deep: the commands that write into it refuse it, those that read do not
    shutil.copytree(made, store)
    before = sorted(p for p in Path(store).rglob("*"))
    for argv, label in ((["analyse", store], "analyse"), (["gates", store, "--steps", "2"], "gates"),
                        (["predict", store], "predict"), (["demo", "--out", store], "--out")):
        done = cli_in_process(*argv)
        assert done.returncode == 2 and done.stderr.startswith(f"dynamics: error: {label} {store}: a path "), argv
        assert done.stderr.count("\n") == 1
    assert cli_in_process("status", store).returncode == 0
    assert sorted(p for p in Path(store).rglob("*")) == before
    report = os.path.join(_folder_of_length(tmp_path / "r", limit - DEEPEST_IN_REPORT - 4), "rep")
    done = cli_in_process("report", made, "--out", report)
    assert done.returncode == 2 and done.stderr == (
        f"dynamics: error: --out {report}: a path {limit - DEEPEST_IN_REPORT:,} bytes long, and the files a report "
        f"holds lie up to {DEEPEST_IN_REPORT} bytes deeper, past the {limit:,} a path may have here; give a shorter path\n")
    assert not os.path.exists(report)
