"""Does the bifurcation step's probe range cover another sample's step? A calibration check.

    python bench/probe_range.py STORE [--probes 8] [--draws 40] [--seed 1]

`dynamics analyse` gives each run's bifurcation step a range: the 5% to 95% quantiles of the
step over bootstrap resamples of its probe sequences (`dynamics.analysis.probe_resample`). A
bootstrap of a first-crossing time from a handful of probes need not be calibrated, so this
measures it. STORE holds runs recorded on many probes, e.g. the quickstart sweep trained with
64 (the runs bitwise those of the demo; only the probes differ)::

    dynamics sweep experiments/quickstart.toml --out S --set record.n_probe=64
    python bench/probe_range.py S

For each run and draw, the probes are shuffled and split into two disjoint samples of
``--probes`` each, A and B, as two recordings of the run on fresh probes would be. The range
is computed on A as the analysis computes it, the step on B; printed per run, how often B's step
("never" included) lies inside A's range, then over all runs against the 90% the range is
named for. Also each run's step on all its probes and how the step spread over the A samples.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `bench._common` and `dynamics` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import bad_input, load_line, open_split_runs, probe_split_parser  # noqa: E402


def _step(js) -> float:
    """The analysis's bifurcation step on the probes of ``js`` (within-layer JS per probe)."""
    from dynamics.analysis.bifurcation import bifurcation_step
    from dynamics.analysis.divergence import mean_within_layer_divergence

    return float(bifurcation_step(mean_within_layer_divergence(np.sqrt(js.mean("probe")))).values)


def coverage(js, probes: int, draws: int, seed: int) -> dict:
    """Of ``draws`` disjoint pairs of ``probes``-probe samples (A, B) of ``js`` (within-layer JS per
    probe, dims (snapshot, layer, head, head_b, probe) with a step coordinate): how often B's step
    lies in A's probe range, and the steps of the A samples. "Never" (NaN) counts as after every step."""
    from dynamics.analysis.probe_resample import probe_range, resampled_bifurcation

    rng = np.random.default_rng(seed)
    inside, steps = 0, []
    for _ in range(draws):
        order = rng.permutation(js.sizes["probe"])
        a, b = js.isel(probe=order[:probes]), js.isel(probe=order[probes:2 * probes])
        low, high = (np.inf if np.isnan(v) else v for v in probe_range(resampled_bifurcation(a)).values)
        step_b = _step(b)
        inside += low <= (np.inf if np.isnan(step_b) else step_b) <= high
        steps.append(_step(a))
    return {"inside": int(inside), "draws": draws, "steps": steps, "all": _step(js)}


def _said(step: float) -> str:
    return "never" if np.isnan(step) else f"{step:g}"


def main(argv=None) -> int:
    args = probe_split_parser(__doc__).parse_args(argv)

    from dynamics.analysis.divergence import js_distance, same_layer_block
    from dynamics.schema import BASELINE_SNAPSHOTS

    opened = open_split_runs(args.store, args.probes)
    if isinstance(opened, str):
        return bad_input(opened)
    runs = sorted(opened)
    # every refusal before any work: the rule needs more snapshots than its baseline
    for rid, ds in sorted(opened.items()):
        if ds.sizes["snapshot"] <= BASELINE_SNAPSHOTS:
            return bad_input(f"run {rid} recorded {ds.sizes['snapshot']} snapshots; a bifurcation step needs "
                             f"more than the band's {BASELINE_SNAPSHOTS}")
    # one head a layer: no pair to compare, the step undefined (not "never"), so nothing to cover
    pairless = sorted(rid for rid, ds in opened.items() if ds.sizes["head"] < 2)
    if len(pairless) == len(opened):
        return bad_input(f"no run of {args.store} has a layer of two heads: its bifurcation step is undefined")
    print(f"{len(runs)} runs; samples of {args.probes} probes, {args.draws} disjoint pairs a run; {load_line()}")
    for rid in pairless:
        print(f"{rid}: one head a layer, its bifurcation undefined: left out")
    inside = total = 0
    for rid, ds in sorted((rid, ds) for rid, ds in opened.items() if rid not in pairless):
        attn = ds["attention"].astype("float32")
        _, by_probe = js_distance(attn, by_probe=True)
        got = coverage(same_layer_block(by_probe), args.probes, args.draws, args.seed)
        inside, total = inside + got["inside"], total + got["draws"]
        said, counts = np.unique([_said(s) for s in got["steps"]], return_counts=True)
        spread = ", ".join(f"{s} x{c}" for s, c in sorted(zip(said, counts, strict=True), key=lambda x: -x[1]))
        print(f"{rid}: on all {ds.sizes['probe']} probes {_said(got['all'])}; B inside A's range "
              f"{got['inside']}/{got['draws']}; steps on the A samples: {spread}")
    print(f"overall: B's step inside A's 5%-95% probe range in {inside}/{total} ({inside / total:.1%}); "
          f"the range is named for 90%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
