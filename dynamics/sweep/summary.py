"""What a sweep did: :class:`SweepSummary`, and the statuses that count as finished."""

from __future__ import annotations

from dataclasses import dataclass, field

from dynamics.schema import FINISHED_STATUSES as FINISHED


@dataclass
class SweepSummary:
    """What a sweep did."""

    total: int = 0
    """Points in the grid."""
    counts: dict[str, int] = field(default_factory=dict)
    """Final status -> number of runs (completed, diverged, failed, interrupted, cancelled)."""
    skipped: list[str] = field(default_factory=list)
    """Runs already finished before this launch, or by another process before their task reached
    them (nothing retrained; one whose task waited for that process is in ``waited`` instead)."""
    failed: list[str] = field(default_factory=list)
    """Run ids that failed."""
    cancelled: list[str] = field(default_factory=list)
    """Run ids whose task was cancelled on the cluster (e.g. the scheduler was lost); resumable."""
    errors: dict[str, str] = field(default_factory=dict)
    """run id -> one-line error, for failed and cancelled runs."""
    waited: dict[str, str] = field(default_factory=dict)
    """run id -> what came of it, for runs another process was training when their task reached them
    (``dynamics run`` of the point, an orphaned task of a killed launcher): waited for, not failed."""
    after_cancel: dict[str, str] = field(default_factory=dict)
    """run id -> how it finished, for runs whose task was cancelled on the cluster (the scheduler
    lost) but that finished in the store, before the cancellation or trained on after it: counted
    by that status, not cancelled."""
    resumed: dict[str, int] = field(default_factory=dict)
    """run id -> the checkpoint step it resumed at (trained before by an earlier launch, or a worker that died)."""
    labels: dict[str, str] = field(default_factory=dict)
    """run id -> point label (``model.n_heads=4, train.seed=0``)."""
    wall_time: float = 0.0
    """Seconds the launch took."""

    @property
    def ok(self) -> bool:
        """True when every run ended completed or diverged."""
        return sum(n for s, n in self.counts.items() if s not in FINISHED) == 0

    def lines(self) -> list[str]:
        """Human-readable summary, one line per fact."""
        parts = [f"{n} {s}" for s, n in sorted(self.counts.items(), key=lambda kv: -kv[1])]
        head = f"sweep: {self.total} run{'' if self.total == 1 else 's'}: " + (", ".join(parts) or "nothing to do")
        notes = [f"{len(self.skipped)} already finished, not retrained"] if self.skipped else []
        # their first steps trained before (an earlier launch, a worker that died), as `dynamics run` says
        if self.resumed:
            notes.append(f"{len(self.resumed)} resumed from a checkpoint")
        if notes:
            head += f" ({'; '.join(notes)})"
        out = [head + f" in {self.wall_time:.1f} s"]
        for status, run_ids in (("failed", self.failed), ("cancelled", self.cancelled)):
            for run_id in run_ids:
                out.append(f"  {status} {run_id} [{self.labels.get(run_id, '?')}]: {self.errors.get(run_id, '?')}")
        for run_id, note in self.waited.items():
            out.append(f"  waited for {run_id} [{self.labels.get(run_id, '?')}]: {note}")
        for run_id, note in self.after_cancel.items():
            out.append(f"  finished {run_id} [{self.labels.get(run_id, '?')}]: {note}")
        return out
