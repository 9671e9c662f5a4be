"""What a completed run's figures do not say by themselves, said beside them by `dynamics analyse`,
`dynamics predict` and `dynamics report`.

A run that completed has roles, slash counts and a bifurcation like any other, and two kinds read
as if training had shaped them when it had not:

- training made the model worse: its eval loss at the last snapshot is above that at step 0 (lr
  10 on learning_rate.toml ended at 242 nats from 4.2; lr 100 runs of a sweep held every self,
  slash and induction head of the predictor's targets);
- training never moved the heads: every head's attention on the probes is the same at the last
  snapshot as at the first, as stored. An lr too small to change float16 attention does it (1e-12),
  and so do gradients of exactly 0: an init_scale of 3e9 overflows the squares in a LayerNorm,
  whose output is then 0, and the run "completed" at ln(vocab) with every head's ``grad_norm`` 0.

Heads pinned to hard attention templates keep the templates' attention by design: left out of the
comparison (a run whose every head is pinned is not said to be unmoved).
Unchanged attention is read from the run's analysis where one is at hand (``divergence_from_init``,
0 at the last snapshot exactly where a head's attention is the first snapshot's), else from its
recording: two whole snapshots, 64 MiB each on a large run, read for every run of a store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from dynamics.schema import ANALYSIS_VERSION

UNCHANGED_WHY = ("a learning rate too small to move them, or gradients of exactly 0, which activations past "
                 "float32's range give, as a huge init_scale makes them; the run's grad_norm tells which")


def eval_ends(run) -> tuple[float, float]:
    """The eval loss (mean over components) at a run's first and last snapshots; NaN where a
    snapshot holds none."""
    if "eval_loss" not in run or not run["eval_loss"].sizes.get("snapshot", 0):
        return (math.nan, math.nan)
    with np.errstate(all="ignore"):
        mean = run["eval_loss"].isel(snapshot=[0, -1]).values.astype(np.float64).mean(-1)  # (2,)
    return (float(mean[0]), float(mean[1]))


def attention_unchanged(run, analysis=None, pinned_heads: frozenset = frozenset()) -> bool:
    """Every head's stored attention on the probes is the same at a run's last snapshot as at its
    first, the heads ``pinned_heads`` ((layer, head) pairs) left out: from ``analysis`` (the run's,
    with ``divergence_from_init``) where given, 0 for every head; else bit for bit from the
    recording (a NaN anywhere is a change). False with fewer than two snapshots, or no free head.
    Another version's analysis is not read (as `dynamics.store.open_analysis(load=...)` leaves it
    unread: its figures are other analysers', and a bad chunk there was a traceback out of predict)."""
    if analysis is not None and "divergence_from_init" in analysis and \
            analysis.attrs.get("analysis_version") == ANALYSIS_VERSION:
        if analysis.sizes.get("snapshot", 0) < 2:
            return False
        last = np.asarray(analysis["divergence_from_init"].isel(snapshot=-1).values, dtype=np.float64)  # (layer, head)
        free = _free(last.shape, pinned_heads)
        return bool(free.any() and (last[free] == 0).all())  # NaN (no such head) is no 0
    if "attention" not in run or run["attention"].sizes.get("snapshot", 0) < 2:
        return False
    ends = run["attention"].isel(snapshot=[0, -1]).values  # (2, layer, head, probe, query, key)
    free = _free(ends.shape[1:3], pinned_heads)
    return bool(free.any() and np.array_equal(ends[0][free], ends[1][free]))


def _free(shape: tuple[int, ...], pinned_heads: frozenset) -> np.ndarray:
    """(layer, head) bool: the heads not in ``pinned_heads``."""
    free = np.ones(shape, bool)
    for layer, head in pinned_heads:
        if layer < shape[0] and head < shape[1]:
            free[layer, head] = False
    return free


def pinned(config: dict) -> frozenset:
    """The (layer, head) pairs a run of ``config`` (as a run's attrs hold it) clamps to a hard
    attention template (``[intervene.templates]``, the table's ``hard`` or a head's own)."""
    templates = (config.get("intervene") or {}).get("templates") or {}
    table = bool(templates.get("hard", False))
    return frozenset((int(h["layer"]), int(h["head"])) for h in templates.get("heads") or []
                     if (table if h.get("hard") is None else bool(h["hard"])))


def of_run(run, status: str, analysis=None) -> dict:
    """The caveats of a run (an opened run group, with its attrs) whose training ended with
    ``status``: ``loss_rose`` (its eval loss at the first and last snapshots) where it rose,
    ``attention_unchanged`` (True) where its heads did not move, read from ``analysis`` where
    given (`attention_unchanged`). Only a completed run has them: a diverged one is said so."""
    if status != "completed":
        return {}
    start, end = eval_ends(run)
    said: dict = {}
    if math.isfinite(start) and math.isfinite(end) and end > start:
        said["loss_rose"] = (start, end)
    config = run.attrs.get("config")
    if attention_unchanged(run, analysis, pinned(config if isinstance(config, dict) else {})):
        said["attention_unchanged"] = True
    return said


def apart(a: float, b: float) -> tuple[str, str]:
    """Two losses to 4 significant digits, or as many more as tell them apart (to 10): a rise of
    3e-7 nats printed "2.773 -> 2.773".

    >>> apart(2.30258, 2.71828)
    ('2.303', '2.718')
    >>> apart(2.7725887, 2.7725890)
    ('2.7725887', '2.772589')
    """
    for digits in range(4, 11):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            break
    return x, y


def text(said: dict) -> str:
    """The caveats of `of_run` as a short clause for one run's row, "" where there are none."""
    parts = []
    if "loss_rose" in said:
        parts.append(f"eval loss rose over training ({' -> '.join(apart(*said['loss_rose']))} nats)")
    if said.get("attention_unchanged"):
        parts.append("attention unchanged from the first snapshot")
    return "; ".join(parts)


def notes(said: Mapping[str, dict]) -> list[str]:
    """A sentence for each caveat some run has, naming up to four runs: ``said`` maps run ids to
    `of_run`'s dicts (read back from a store's attrs, a pair is a list)."""
    rose = [(rid, s["loss_rose"]) for rid, s in said.items() if "loss_rose" in s]
    still = [rid for rid, s in said.items() if s.get("attention_unchanged")]
    lines = []
    if rose:
        lines.append(f"loss rose in {len(rose)} completed run(s): the eval loss at the last snapshot is above that at "
                     f"step 0, so training made them worse and their heads' figures are not those of a model that "
                     f"learned its task: " + _first_four([f"{rid} ({' -> '.join(apart(*ends))} nats)" for rid, ends in rose]))
    if still:
        lines.append(f"attention unchanged in {len(still)} completed run(s): every head's attention on the probes is "
                     f"the same at the last snapshot as at the first, so training never moved their heads and their "
                     f"figures are those of their initialisation ({UNCHANGED_WHY}): " + _first_four(still))
    return lines


def _first_four(items: list[str]) -> str:
    return ", ".join(items[:4]) + (f", and {len(items) - 4} more" if len(items) > 4 else "")
