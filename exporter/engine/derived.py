"""Derived signals: pure formulas over measured quantities, each ``None`` when its inputs are missing.

References: Young (1974) and Daly (2006) for the optimal checkpoint interval; Kokolis et al.,
"Revisiting Reliability in Large-Scale Machine Learning Research Clusters" (2024) for the
expected effective training time ratio (ETTR).
"""

from __future__ import annotations

import math
from statistics import median


def overlap_ratio(blocking_s: float, background_s: float) -> float | None:
    """Checkpoint overlap: the share of the saves' seconds spent in the background, not blocking the
    loop (the recording rules' ``checkpoint_overlap`` signal, ``alerts/signals.py``)."""
    both = blocking_s + background_s
    return background_s / both if both > 0 else None


def blocking_fraction(blocking_s: float, wall_s: float) -> float | None:
    """Checkpoint blocking rank-seconds as a share of wall rank-seconds (the blocking SLI)."""
    return blocking_s / wall_s if wall_s > 0 else None


def mtbf(elapsed_s: float, faults: int) -> float | None:
    """Mean time between faults: the job's elapsed wall time over the faults seen in it."""
    return elapsed_s / faults if faults > 0 and elapsed_s > 0 else None


def young_daly_interval(blocking_cost_s: float | None, mtbf_s: float | None) -> float | None:
    """The checkpoint interval sqrt(2 · C · MTBF) that minimises expected waste (first order)."""
    if blocking_cost_s is None or mtbf_s is None:
        return None
    return math.sqrt(2.0 * blocking_cost_s * mtbf_s)


def ettr(interval_s: float | None, blocking_cost_s: float | None, restart_cost_s: float | None,
         mtbf_s: float | None) -> float | None:
    """Expected ETTR ≈ (1 − (u₀ + Δt/2) / MTBF) / (1 + w/Δt), clamped to [0, 1].

    Kokolis et al. write the failure term as N·r (nodes × failures per node-time); for one job
    that product is 1 / MTBF. With no fault seen yet only the checkpoint term applies. Needs a
    measured interval Δt and blocking cost w; u₀ (restart overhead) is 0 when none was measured.
    """
    if interval_s is None or blocking_cost_s is None or interval_s <= 0:
        return None
    failure_term = 0.0 if mtbf_s is None else ((restart_cost_s or 0.0) + interval_s / 2.0) / mtbf_s
    value = (1.0 - failure_term) / (1.0 + blocking_cost_s / interval_s)
    return min(1.0, max(0.0, value))


def skew_ratios(recent_means: dict[int, float]) -> dict[int, float]:
    """Each rank's recent mean step time over the median of those means (stragglers > 1)."""
    if not recent_means:
        return {}
    mid = median(recent_means.values())
    if mid <= 0:
        return {}
    return {rank: mean / mid for rank, mean in recent_means.items()}
