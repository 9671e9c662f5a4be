"""Does a head's label agreement over resampled probes tell how its label fares on new probes? A calibration check.

    python bench/role_agreement.py STORE [--probes 8] [--draws 40] [--seed 1]

`dynamics analyse` labels each head again on 200 bootstrap resamples of its run's probe
sequences (the analysis's ``role_resampled``) and names the heads whose final label fewer than
90% of them give (`dynamics.analysis.probe_resample.label_agreement`). A bootstrap of a label
read from a handful of probes need not be calibrated, so this measures it. STORE holds runs
recorded on many probes, e.g. the quickstart sweep trained with 64 (the runs bitwise those of the
demo; only the probes differ)::

    dynamics sweep experiments/quickstart.toml --out S --set record.n_probe=64
    python bench/role_agreement.py S

For each run and draw, the probes are shuffled and split into two disjoint samples of
``--probes`` each, A and B, as two recordings of the run on fresh probes would be. Each head's
last-snapshot label and its agreement are computed on A as the analysis computes them, its
label on B; printed, by agreement on A, how many (head, draw) pairs fell there and how often B
gave A's label, then for the heads the analysis names (agreement under 90%) and the others.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `bench._common` and `dynamics` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import bad_input, load_line, open_split_runs, probe_split_parser  # noqa: E402

BINS = ((0.0, 0.5), (0.5, 0.9), (0.9, 1.0), (1.0, 1.0))


def _labels(attn, tokens, thresholds, weights=None):
    from dynamics.analysis.roles import assign_roles, role_scores

    return assign_roles(role_scores(attn, tokens, thresholds, weights=weights), thresholds)


def calibration(attn, tokens, probes: int, draws: int, seed: int, thresholds=None) -> dict:
    """Of ``draws`` disjoint pairs of ``probes``-probe samples (A, B) of one snapshot's attention
    ``(layer, head, probe, query, key)`` and its ``(probe, position)`` tokens: each head's
    agreement on A (its A label's share of the analysis's resamples of A) and whether B gave it
    A's label; flat arrays over (draw, layer, head)."""
    from dynamics.analysis.probe_resample import label_agreement, probe_counts
    from dynamics.analysis.roles import RoleThresholds

    thresholds = thresholds or RoleThresholds()
    rng = np.random.default_rng(seed)
    agreement, same = [], []
    for _ in range(draws):
        order = rng.permutation(attn.sizes["probe"])
        a, b = order[:probes], order[probes:2 * probes]
        on_a = _labels(attn.isel(probe=a), tokens.isel(probe=a), thresholds)
        again = _labels(attn.isel(probe=a), tokens.isel(probe=a), thresholds, weights=probe_counts(probes))
        on_b = _labels(attn.isel(probe=b), tokens.isel(probe=b), thresholds)
        agreement.append(label_agreement(on_a, again).transpose("layer", "head").values.ravel())
        same.append((on_a == on_b).transpose("layer", "head").values.ravel())
    return {"agreement": np.concatenate(agreement), "same": np.concatenate(same)}


def _line(name: str, same: np.ndarray) -> str:
    if not same.size:
        return f"   {name:<28} none"
    return f"   {name:<28} {same.size:>6}  B gave A's label {same.sum():>6} ({same.mean():.1%})"


def main(argv=None) -> int:
    args = probe_split_parser(__doc__).parse_args(argv)

    from dynamics.analysis.probe_resample import LABEL_AGREEMENT, N_RESAMPLES

    opened = open_split_runs(args.store, args.probes)  # every refusal before any work
    if isinstance(opened, str):
        return bad_input(opened)
    runs = sorted(opened)
    print(f"{len(runs)} runs; samples of {args.probes} probes, {args.draws} disjoint pairs a run, "
          f"{N_RESAMPLES} resamples of each A; {load_line()}")
    agreement, same = [], []
    for rid, ds in sorted(opened.items()):
        got = calibration(ds["attention"].isel(snapshot=-1).astype("float32"), ds["probe_tokens"],
                          args.probes, args.draws, args.seed)
        agreement.append(got["agreement"])
        same.append(got["same"])
        named = got["agreement"] < LABEL_AGREEMENT
        print(f"{rid}: {named.sum()} of {named.size} (head, draw) pairs named; B gave A's label "
              f"{got['same'].mean():.1%} of the time")
    agreement, same = np.concatenate(agreement), np.concatenate(same)
    print("(head, draw) pairs by their agreement on A:")
    for low, high in BINS:
        inside = (agreement == 1.0) if low == high else (agreement >= low) & (agreement < high)
        print(_line("agreement 100%" if low == high else f"agreement {low:.0%} to under {high:.0%}", same[inside]))
    named = agreement < LABEL_AGREEMENT
    print(_line(f"named (under {LABEL_AGREEMENT:.0%})", same[named]))
    print(_line(f"not named ({LABEL_AGREEMENT:.0%} or more)", same[~named]))
    print(f"mean agreement of the named {agreement[named].mean():.1%}, of the others {agreement[~named].mean():.1%}"
          if named.any() else f"mean agreement {agreement.mean():.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
