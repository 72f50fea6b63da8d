"""The spec's SLOs judged on one snapshot, and where its time went: what the status page and the
text SLO report both show, decided here once so that the two never disagree.

The judgement is of the whole job so far, not of a burn-rate window: the rules (``alerts/``) judge
windows from the same counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.contracts.targets import Targets
from nvrx_slo.exporter.engine.snapshot import Histogram, Snapshot


def _pct(ratio: float | None, digits: int = 2) -> str:
    return "—" if ratio is None else f"{100 * ratio:.{digits}f}%"


@dataclass(frozen=True)
class SloResult:
    key: str
    name: str
    objective: str
    value: float | None
    shown: str
    ok: bool | None  # None: not measurable yet (no restarts, no saves)


def slo_results(snap: Snapshot, targets: Targets) -> list[SloResult]:
    """The spec's SLOs judged on this snapshot, efficiency first."""
    eff = snap.efficiency
    durations = list(snap.restarts.duration.values())
    fast = Histogram.merged(durations).share_within(targets.recovery_threshold_s) if durations else None
    ck = snap.checkpoints
    return [
        SloResult("efficiency", "training efficiency", f"productive / wall ≥ {_pct(targets.efficiency, 0)}",
                  eff, _pct(eff), None if eff is None else eff >= targets.efficiency),
        SloResult("recovery", "recovery latency",
                  f"{_pct(targets.recovery, 0)} of restarts back to training in < {targets.recovery_threshold_s:g} s",
                  fast, _pct(fast, 1) if fast is not None else "no restarts",
                  None if fast is None else fast >= targets.recovery),
        SloResult("checkpoint_blocking", "checkpoint blocking", f"blocking ≤ {_pct(targets.blocking_max, 0)} of wall",
                  ck.blocking_fraction, _pct(ck.blocking_fraction, 3),
                  None if ck.blocking_fraction is None else ck.blocking_fraction <= targets.blocking_max),
        SloResult("checkpoint_overlap", "checkpoint overlap",
                  f"background / (blocking + background) ≥ {_pct(targets.checkpoint_overlap, 0)}",
                  ck.overlap_ratio, _pct(ck.overlap_ratio, 1),
                  None if ck.overlap_ratio is None else ck.overlap_ratio >= targets.checkpoint_overlap),
    ]


def breakdown(snap: Snapshot) -> dict[Category, float]:
    """Rank-seconds per category, unprotected included (and a job's absent ranks when there were
    any): the values sum to ``snap.wall_s``."""
    seconds = snap.seconds
    parts: dict[Category, float] = {c: seconds.get(c, 0.0) for c in Category if c is not Category.ABSENT}
    parts[Category.UNPROTECTED] = snap.unprotected_s
    if snap.absent_s:
        parts[Category.ABSENT] = snap.absent_s
    return parts
