"""The report: PNG figures (matplotlib, Agg) and one self-contained HTML page per store.

``write_report(store, out_dir)`` writes ``out_dir/index.html`` and ``out_dir/figures/<generation>/*.png``
(a new folder per report, linked from the page once whole: a report stopped part-way leaves the
previous one as it was).
The page opens from ``file://`` with no server: its script is inline, plain JavaScript, and
loads nothing from the network. It shows

1. the attention maps of every head of one run, one PNG per snapshot, scrubbed with a step
   slider (the reader watches the heads specialise);
2. emergence curves against training step for every run (slash score, share of each role,
   mean within-layer JS divergence), coloured by the first swept parameter and styled (line
   style, marker) by the others, with the mean and range over seeds; a swept value keeps
   its colour in every figure;
3. bifurcation and slash-emergence steps against the swept init_scale, lr and n_heads,
   unfinished runs hollow ("not yet" rather than "never"); where no axis is swept, each run's
   steps as text;
4. the redundancy dendrogram and the JS distance matrix of one run at its last snapshot;
5. causal head gating: G+ against G- per head with the taxonomy regions (Nam et al. 2025,
   Figure 1c) and the same over training (the runs' recorded ``chg``, or
   ``derived/gates.<run_id>`` written by ``dynamics gates``: for a run with both, the G+/G-
   scatter shows the fit at the later step, the ``dynamics gates`` one at a tie, and the
   panels over training the recorded fits; the caption names each, and the runs fitted before
   training ended); labels are the stored role codes (majority over restarts, as
   ``dynamics gates``), positions the mean gates, with ``dynamics gates``' caution where a
   fit's rho is below ``RHO_CAUTION`` (0.3);
6. the early-role predictor's metric against horizon (``derived/predict.<target>``, written by
   ``dynamics predict``).

Partial stores
--------------
A sweep may still be running. The page never fails on a missing part: it says
"Not available: <what> because <why>" in its place. Runs without stored analysis are
analysed here, in memory, on the snapshots recorded so far (``compute_missing=True``, the
default; nothing is written to the store, so a report never races a running sweep); the
runs table says which runs were analysed this way. With ``compute_missing=False`` those runs
are left out of the analysis figures and named as missing.

The runs table also lists the runs of the sweep index that have not started ("pending"), and
shows a run whose status says "running" while no process holds its training lock as
"stopped" (as ``dynamics status`` does).

Sources: Nam, Conklin, Yang, Griffiths, Cohen, Leslie 2025, "Causal Head Gating"
(arXiv 2505.13737, the G+/G- taxonomy, threshold 0.5); Clark et al. 2019 (JS distances and
clustering); Cheng et al. 2026 (slash scores). See docs in :mod:`dynamics.analysis`.

This module never imports torch (nor pyplot: figures are drawn on ``matplotlib.figure.Figure``
with the Agg canvas, so the caller's backend is left alone).
"""

# `name as name`: private helpers the tests import from dynamics.report, outside __all__.
from dynamics.report.chg import CHG_LABELS, CHG_THRESHOLD, chg_label
from dynamics.report.data import _choose_run as _choose_run
from dynamics.report.data import _Run as _Run
from dynamics.report.page import write_report

__all__ = ["CHG_LABELS", "CHG_THRESHOLD", "chg_label", "write_report"]
