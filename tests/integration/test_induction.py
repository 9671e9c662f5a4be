"""A real induction run: the loss on repeated tokens collapses, and the analysers find the
two-layer circuit of Olsson et al. 2022 (a previous-token head in layer 0, an induction head
in layer 1). One training (~1 min on 2 cores) shared by the checks."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dynamics
from dynamics.analysis import analyse_run, role_names
from dynamics.config import load_config
from dynamics.tasks import make_batch
from dynamics.train import load_run_model, set_threads, train_run

pytestmark = pytest.mark.slow

OVERRIDES = [
    "train.steps=1200", "train.lr=1e-2", "model.context=32", "model.vocab_size=32",
    "task.min_period=4", "task.max_period=12",
]


@pytest.fixture(scope="module")
def induction_run(tmp_path_factory):
    set_threads(1)
    cfg = load_config(Path(__file__).parents[2] / "experiments" / "induction.toml", OVERRIDES)
    path = str(tmp_path_factory.mktemp("induction") / "run.zarr")
    result = train_run(cfg, path)
    assert result.status == "completed"
    return path


def test_loss_on_repeats_falls_far_below_first_period(induction_run):
    model, cfg, _ = load_run_model(induction_run)
    batch = make_batch(cfg, "eval", 0, 64)
    tokens = torch.from_numpy(batch.tokens)
    with torch.no_grad():
        logits = model(tokens[:, :-1])
        nll = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none").view(64, -1).numpy()
    first, repeated = nll[~batch.repeat_mask].mean(), nll[batch.repeat_mask].mean()
    # the first period is unpredictable (chance = ln 32 = 3.47 nats); repeats are copied
    assert first > 3.0
    assert repeated < 0.25 * first


def test_analysis_finds_previous_token_then_induction_head(induction_run):
    result = analyse_run(dynamics.open_run(induction_run)).isel(snapshot=-1).compute()
    labels = role_names(result.role.values)  # (layer, head)
    assert "previous_token" in labels[0], labels
    assert "induction" in labels[1], labels
    # and the induction heads appear after the start of training, not at init
    first = analyse_run(dynamics.open_run(induction_run)).isel(snapshot=0).compute()
    assert "induction" not in role_names(first.role.values)
    assert np.isfinite(result.bifurcation_step)
