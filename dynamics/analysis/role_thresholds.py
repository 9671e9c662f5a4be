"""The role names and the thresholds a head's role scores are read against (`roles`).

Kept apart from the scores so that options, the predictor and the report can name the roles
and their thresholds without the scoring code.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from numbers import Integral, Real

__all__ = ["GENERIC_ROLES", "ROLES", "SPECIFIC_ROLES", "RoleThresholds", "check_kinds"]

ROLES = ("previous_token", "self", "slash", "induction", "sink", "token", "local", "diffuse", "none")
"""Role names. A label code is an index into this tuple."""

SPECIFIC_ROLES = ROLES[:6]
"""Roles that name a definite pattern. They are labelled before the generic ones."""

GENERIC_ROLES = ROLES[6:8]
"""Roles that describe a shape rather than a mechanism: local (near the diagonal), diffuse (spread)."""


def check_kinds(options, ints: tuple[str, ...], nested: dict[str, type] | None = None) -> None:
    """TypeError naming the first field of the dataclass `options` whose value is not of its kind:
    an integer for `ints` (or None where None is the field's default), an instance of its class
    for `nested`, a real number for the others.

    The range checks after it compared a string with '<' (a bare TypeError naming no field), and a
    count given as 2.5 was accepted and truncated where it was used.
    """
    nested = nested or {}
    for f in fields(options):
        value = getattr(options, f.name)
        if f.name in nested:
            ok, kind = isinstance(value, nested[f.name]), f"a {nested[f.name].__name__}"
        elif f.name in ints:
            ok = (isinstance(value, Integral) and not isinstance(value, bool)) or (value is None and f.default is None)
            kind = "an integer"
        else:
            ok, kind = isinstance(value, Real) and not isinstance(value, bool), "a number"
        if not ok:
            raise TypeError(f"{type(options).__name__}.{f.name}: expected {kind}, got {value!r}")


@dataclass(frozen=True)
class RoleThresholds:
    """Thresholds for each role's score, and the settings the scores need.

    A role passes when its score is at least its threshold. Every threshold lies in (0, 1].
    """

    previous_token: float = 0.5
    """slash_score(1) needed. At 0.5 most of the attention goes one step back. Not Voita et al.'s
    rule (the largest weight one step back in >= 90% of rows), which heads holding less meet:
    the analysis's ``previous_token_peak`` (`dynamics.analysis.positional.peak_share`) gives it."""
    self: float = 0.5
    """slash_score(0) needed."""
    slash: float = 0.5
    """max slash_score over offsets in [slash_min_offset, slash_max_offset]. Cheng et al.'s
    kappa; see `dynamics.analysis.slash.DEFAULT_KAPPA`."""
    induction: float = 0.4
    """Mean attention on the token after a previous occurrence of the current token. Under
    uniform attention this is about (#occurrences / (i + 1)), which is small for random tokens
    (0.04 to 0.17 on the experiments' probe batches, README's Analysis definitions) but not for few or repetitive ones (0.45 on
    random binary tokens at T = 64): `role_scores` leaves induction unscored on probes where
    uniform attention reaches this threshold. 0.4 asks for a clear majority of the mass of a
    clean induction head."""
    sink: float = 0.3
    """alpha_0, the mean attention on position 0. Gu et al.'s epsilon. Uniform causal attention
    gives H_T / T, which is 0.21 at T = 16 but 0.34 at T = 8: probes need T >= 10 (0.293), and
    an untrained head, a little off uniform, passes 0.3 at T = 10 (`dynamics analyse` notes
    roles held at step 0)."""
    token: float = 0.5
    """Mean share of attention on visible occurrences of `token_id`. The post uses 50%."""
    local: float = 0.8
    """Mean attention mass within offsets 0..local_width-1. Uniform causal attention gives
    w (H_T - H_w) / (T - w), with w = local_width and H_n the n-th harmonic number: about
    w ln(T / w) / T for long probes."""
    diffuse: float = 0.8
    """Mean normalised entropy H(A[i, :]) / ln(i + 1). Uniform causal attention gives 1."""
    slash_min_offset: int = 2
    """Smallest offset counted as "slash". 0 and 1 are the self and previous-token roles."""
    slash_max_offset: int | None = None
    """Largest offset counted as "slash". None means T // 2, so that every score averages over
    at least half of the queries. slash_score(T - 1) rests on a single row, and a sink head
    would score 1 there."""
    token_id: int = ord("/")
    """Token id for the token role (47, '/')."""
    local_width: int = 3
    """Band width w of the local role: offsets 0..w-1."""

    def __post_init__(self):
        check_kinds(self, ints=("slash_min_offset", "slash_max_offset", "token_id", "local_width"))
        for name in ROLES[:-1]:
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"RoleThresholds.{name} must be in (0, 1]; got {value!r}")
        if self.slash_min_offset < 0:
            raise ValueError(f"RoleThresholds.slash_min_offset must be >= 0; got {self.slash_min_offset!r}")
        if self.slash_max_offset is not None and self.slash_max_offset < self.slash_min_offset:
            raise ValueError(
                f"RoleThresholds.slash_max_offset must be >= slash_min_offset; got {self.slash_max_offset!r}"
            )
        if self.slash_max_offset is not None and self.slash_max_offset < 1:
            # role_scores scores offset 1 for previous_token whatever the window, and a window
            # of offset 0 alone was read there: a head 0.45 one step back labelled "slash"
            raise ValueError(f"RoleThresholds.slash_max_offset must be >= 1 (offset 0 alone is the self role); "
                             f"got {self.slash_max_offset!r}")
        if self.local_width < 1:
            raise ValueError(f"RoleThresholds.local_width must be >= 1; got {self.local_width!r}")
