"""`--device cuda` where there is a GPU: the same model, runs and resume as on the CPU.

Skipped on a machine without CUDA (CI has none); run by hand on a GPU machine with
``python -m pytest -m cuda``. A GPU run is not bitwise equal to a CPU run (other kernels, other
summation orders), so these compare within float32 tolerances and print what they measured.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from dynamics import store
from dynamics.config import ModelConfig, load_config, with_values
from dynamics.model import Transformer
from dynamics.train import train_run
from tests.conftest import wait_for_checkpoint

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def arrays(path):
    ds = store.open_run(path).load()
    return {name: ds[name].values for name in ds.data_vars}


def max_diff(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    assert (np.isfinite(a) == np.isfinite(b)).all(), "NaN in one run where the other is finite"
    return float(np.abs(a[both] - b[both]).max()) if both.any() else 0.0


@pytest.mark.parametrize("pos", ["rope", "learned", "none"])
def test_fused_and_eager_on_cuda_match_the_cpu_model(pos):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_mlp=64, vocab_size=16, context=16, pos=pos)
    torch.manual_seed(0)
    cpu = Transformer(cfg)
    gpu = Transformer(cfg)
    gpu.load_state_dict(cpu.state_dict())
    gpu = gpu.cuda()
    toks = torch.randint(0, 16, (3, 12), generator=torch.Generator().manual_seed(1))  # (B, T)
    with torch.no_grad():
        ref = cpu(toks)  # (B, T, V)
        fused = gpu(toks.cuda()).cpu()
        with gpu.hooks([(f"blocks.{l}.attn.hook_pattern", lambda t, n: None) for l in range(2)]):
            eager = gpu(toks.cuda()).cpu()
    print(f"pos={pos}: |fused-cpu|max {max_diff(fused, ref):.2e}  |eager-cpu|max {max_diff(eager, ref):.2e}")
    torch.testing.assert_close(fused, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(eager, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("extra", [
    "",
    '[intervene.templates]\nheads = [{ layer = 0, head = 0, pattern = "previous_token" }]\n',
    "[intervene.conditioned_gates]\n",
], ids=["plain", "templates", "conditioned_gates"])
def test_cuda_run_follows_the_cpu_run(tiny_config, tmp_path, extra):
    cfg = load_config(tiny_config(steps=40, every=10, extra=extra))
    cpu = train_run(cfg, str(tmp_path / "cpu.zarr"))
    gpu = train_run(with_values(cfg, {"train.device": "cuda"}), str(tmp_path / "gpu.zarr"))
    assert cpu.status == gpu.status == "completed"
    a, b = arrays(tmp_path / "cpu.zarr"), arrays(tmp_path / "gpu.zarr")
    assert a.keys() == b.keys()
    assert store.run_attrs(tmp_path / "gpu.zarr", gpu.run_id)["device"] == "cuda"
    # Same init (built on the CPU, then moved) and the same batches: the first loss agrees to
    # float32 rounding; 40 AdamW steps later the two runs still follow one trajectory.
    assert abs(float(a["loss"][0]) - float(b["loss"][0])) < 1e-4
    diffs = {name: max_diff(a[name], b[name]) for name in a}
    print("max |cpu - cuda|:", {k: f"{v:.1e}" for k, v in sorted(diffs.items())})
    assert diffs["loss"] < 2e-2
    assert diffs["attention"] < 5e-2  # float16 probabilities


def test_cuda_resume_after_sigkill(tiny_config, tmp_path):
    cfg = tiny_config(steps=200, every=20)
    run_id = load_config(cfg).run_id()
    whole, killed = tmp_path / "whole.zarr", tmp_path / "killed.zarr"
    cmd = [sys.executable, "-m", "dynamics", "run", cfg, "--device", "cuda", "--out"]
    r = subprocess.run(cmd + [str(whole)], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr

    proc = subprocess.Popen(cmd + [str(killed)], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_checkpoint(killed, run_id, 40, timeout=180)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    attrs = store.run_attrs(killed, run_id)
    assert attrs["status"] == "running" and 40 <= attrs["checkpoint_step"] < 200, attrs.get("checkpoint_step")

    r = subprocess.run(cmd + [str(killed)], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    attrs = store.run_attrs(killed, run_id)
    assert attrs["status"] == "completed" and attrs["starts"] == 2
    a, b = arrays(whole), arrays(killed)
    assert store.open_run(killed).step.values.tolist() == store.open_run(whole).step.values.tolist()
    diffs = {name: max_diff(a[name], b[name]) for name in a}
    print("max |whole - resumed| on cuda:", {k: f"{v:.1e}" for k, v in sorted(diffs.items())})
    assert diffs["loss"] < 1e-3 and diffs["attention"] < 1e-2
