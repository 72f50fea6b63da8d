"""A snapshot's parts from what the engine holds: a rank's, and the pod's checkpoint statistics.

Pure functions of their arguments: what the engine settled (ledgers), what a preview of its
reorder buffers would settle, and the instants the snapshot counts between.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvrx_slo.contracts.catalogue import SETTLED_CATEGORIES
from nvrx_slo.exporter.engine import derived
from nvrx_slo.exporter.engine.accounting import BLOCKING, GAP, INIT, LOST, PRODUCTIVE, Ledger
from nvrx_slo.exporter.engine.checkpoints import CheckpointsView
from nvrx_slo.exporter.engine.lanes import Lane
from nvrx_slo.exporter.engine.snapshot import CheckpointStats, RankSnapshot


def rank(led: Ledger, preview: Ledger, lane: Lane, origin: float, end: float, finished: bool,
         skew: float | None, held: float) -> RankSnapshot:
    """One rank from ``origin`` to ``end``: its settled seconds, and the rest provisional (unprotected)
    unless the job finished. ``preview``: its ledger with its reorder buffer applied (what the
    saves read so far keep); ``held``: its seconds the open restarts have yet to decide."""
    seconds = [0.0] * len(SETTLED_CATEGORIES)
    unprotected = end - origin  # nothing applied yet: all provisional
    if led.first is not None:
        seconds = led.seconds[:]
        seconds[INIT] += led.first - origin
        tail = max(0.0, end - led.t)
        unprotected = led.undecided() + held
        if finished:
            seconds[BLOCKING if led.blocking is not None else GAP[led.state]] += tail
        else:
            unprotected += tail
    idle = sum(seconds) - seconds[PRODUCTIVE] - seconds[LOST]
    kept = preview.seconds[PRODUCTIVE] - led.seconds[PRODUCTIVE]  # by saves read, not yet settled
    return RankSnapshot(
        rank=led.rank, wall_s=end - origin, seconds=dict(zip(SETTLED_CATEGORIES, seconds, strict=True)),
        unprotected_s=unprotected, at_risk_s=0.0 if finished else max(0.0, unprotected - kept),
        steps=lane.steps, step=lane.step, last_step_wall=lane.step_wall,
        step_duration=lane.hist.frozen(), worker_alive=lane.worker_alive(), skew_ratio=skew, gpu_idle_s=idle,
        state=led.state, pid=lane.newest_pid, restart=lane.newest_restart, iter=lane.newest_iter,
        last_restore_wall=lane.last_restore_wall, user_spans=dict(led.user), first_step_wall=lane.first_step_wall,
        step_timer=lane.step_timer())


def blocking_cost(ck: CheckpointsView) -> float | None:
    """The mean blocking of a save (per rank), the Young/Daly and ETTR models' C."""
    return ck.blocking.sum / ck.blocking.count if ck.blocking.count else None


def interval(ck: CheckpointsView) -> float | None:
    """The measured mean time between durable saves."""
    if ck.saves < 2 or ck.first_written is None or ck.last_written is None:
        return None
    return (ck.last_written - ck.first_written) / (ck.saves - 1)


def checkpoint_stats(ck: CheckpointsView, ranks: Sequence[RankSnapshot], now_mono: float,
                     mtbf: float | None) -> CheckpointStats:
    wall = sum(r.wall_s for r in ranks)
    blocked = sum(r.seconds[SETTLED_CATEGORIES[BLOCKING]] for r in ranks)
    return CheckpointStats(
        saves=ck.saves, failures=ck.failures, in_flight=ck.in_flight, bytes_total=ck.bytes_total,
        blocking=ck.blocking.frozen(), background=ck.background.frozen(),
        overlap_ratio=derived.overlap_ratio(ck.blocking.sum, ck.background.sum),
        blocking_fraction=derived.blocking_fraction(blocked, wall),
        last_success_wall=ck.last_wall, last_success_step=ck.last_step,
        age_s=None if ck.last_written is None else max(0.0, now_mono - ck.last_written),
        interval_s=interval(ck), optimal_interval_s=derived.young_daly_interval(blocking_cost(ck), mtbf),
        recent=ck.recent)
