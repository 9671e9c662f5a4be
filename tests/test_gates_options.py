"""`gates.options`: GateOptions refuses values of the wrong type and counts or a lambda out of range."""

import numpy as np
import pytest

from dynamics.config import ConfigError
from dynamics.gates import GateOptions
from dynamics.limits import MAX_STEPS
from tests.test_gates import one_thread  # noqa: F401 - one_thread: the module-scoped autouse fixture


def test_options_of_the_wrong_type_are_named():
    # steps=2.5 was accepted and failed inside the fit; steps="5" with a bare TypeError
    for key, bad, kind in (("steps", 2.5, "an integer"), ("steps", "5", "an integer"), ("restarts", 2.0, "an integer"),
                           ("seed", 1.5, "an integer"), ("lam", "0.1", "a number"), ("clamp_start", 1, "true or false")):
        with pytest.raises(ConfigError, match=f"^gates.{key}: expected {kind}, got {bad!r}$"):
            GateOptions(**{key: bad})
    assert GateOptions(steps=np.int64(3), lam=np.float32(0.5), init_steps=None).steps == 3


def test_the_gates_functions_take_gate_options_or_none_and_name_anything_else():
    # fit_chg(model, cfg, {"steps": 5}) failed inside the fit: 'dict' object has no attribute 'restarts'
    import torch

    from dynamics import gates
    from dynamics.config import RunConfig
    from dynamics.gates.options import gate_options
    from dynamics.model import Transformer

    assert gate_options(None) == GateOptions() and gate_options(GateOptions(steps=3)).steps == 3
    cfg = RunConfig()
    model = Transformer(cfg.model, generator=torch.Generator())
    for call in (lambda o: gates.fit_chg(model, cfg, o), lambda o: gates.head_ablation(model, cfg, options=o),
                 lambda o: gates.head_importance(model, cfg, o)):
        with pytest.raises(ConfigError, match=r"^options must be a GateOptions \(or None for the defaults\), got dict$"):
            call({"steps": 5})


def test_an_absurd_restart_count_is_refused_before_the_fit():
    # Restarts are one batch: --restarts 1000000 asked for 32 GB at the first forward, a traceback
    assert GateOptions(restarts=256).restarts == 256
    with pytest.raises(ConfigError) as e:
        GateOptions(restarts=10**6)
    assert str(e.value) == "gates.restarts: must be at most 256 (fitted as one batch), got 1000000"


def test_counts_past_the_step_limit_and_a_lambda_float32_cannot_hold_are_refused():
    # --steps 10**13 ran until killed; --lam 1e39 raised a traceback from torch.full after the first stage
    for key in ("steps", "init_steps"):
        assert getattr(GateOptions(**{key: MAX_STEPS}), key) == MAX_STEPS
        with pytest.raises(ConfigError, match=f"^gates.{key}: must be .*{MAX_STEPS:,}"):
            GateOptions(**{key: MAX_STEPS + 1})
    assert GateOptions(lam=3.4e38).lam == 3.4e38
    with pytest.raises(ConfigError, match=r"^gates.lam: must be at most 3.403e\+38 \(float32\), got 1e\+39$"):
        GateOptions(lam=1e39)


def test_a_lambda_of_0_is_refused_g_plus_and_g_minus_would_be_the_first_fit_again():
    # --lam 0 fitted G+ and G- as the lambda = 0 stage: the same gates, every head "facilitating"
    # with agreement 1, exit 0
    for lam in (0.0, -0.0, -0.1):
        with pytest.raises(ConfigError, match=r"^gates.lam: give \|lambda\| \(> 0; G\+ uses \+lam, G- uses -lam\), got "):
            GateOptions(lam=lam)
    assert GateOptions(lam=1e-6).lam == 1e-6


def test_values_that_round_to_0_in_float32_are_refused():
    # --lam 1e-50 became tensor([0., 0.]) in the fit: G+ and G- were the lambda = 0 stage's gates
    # (0.664 0.664, ...), stored under lam=1e-50; lr 1e-50 moved no gate at all
    for name in ("lam", "lr", "clamp", "max_diff", "grad_clip"):
        with pytest.raises(ConfigError, match=rf"^gates.{name}: must be > 0 in float32 \(it rounds to 0 there\), got 1e-50$"):
            GateOptions(**{name: 1e-50})
        assert getattr(GateOptions(**{name: 1e-45}), name) == 1e-45  # the least float32 subnormal: not 0
    assert GateOptions(grad_clip=0.0).grad_clip == 0.0  # off
