"""dynamics.allocator: freed buffers stay in the process, so a repeated step stops page-faulting.

Each check runs in a fresh interpreter: the thresholds are process-wide and cannot be unset, and
this pytest process may already have trained a run.
"""

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt thresholds are glibc's")

# A step's pattern, made exact: twenty 2 MiB buffers written, then all freed. 20 x 2 MiB / 4 KiB
# = 10,240 pages a round, each faulted in again when the freed heap top went back to the kernel.
PAGES_PER_ROUND = 20 * (2 << 20) // 4096
ROUNDS = """
import json, resource, numpy as np
def step():
    xs = [np.ones(1 << 19, dtype=np.float32) for _ in range(20)]
    del xs
def faults_per_round(n=5):
    step()  # the first round's faults are the heap growing, with or without the thresholds
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n
"""


def run(body: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ROUNDS + body], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_glibc_default_faults_every_round_and_kept_memory_does_not():
    res = run("""
from dynamics.allocator import keep_freed_memory
before = faults_per_round()
kept = keep_freed_memory()
print(json.dumps({"before": before, "kept": kept, "again": keep_freed_memory(), "after": faults_per_round()}))
""")
    # the control: without the thresholds this pattern faults in (nearly) every page, every round
    assert res["before"] >= 0.9 * PAGES_PER_ROUND, res
    assert res["kept"] is True and res["again"] is True
    assert res["after"] < 0.01 * PAGES_PER_ROUND, res


def test_a_cpu_training_run_keeps_freed_memory(tiny_config, tmp_path):
    res = run(f"""
from dynamics.config import load_config
from dynamics.train import train_run
before = faults_per_round()
train_run(load_config({tiny_config(steps=3, every=10)!r}), {str(tmp_path / "s.zarr")!r})
print(json.dumps({{"before": before, "after": faults_per_round()}}))
""")
    assert res["before"] >= 0.9 * PAGES_PER_ROUND, res
    assert res["after"] < 0.01 * PAGES_PER_ROUND, res
