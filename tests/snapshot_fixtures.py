"""Hand-built engine snapshots, for testing views (collector, OTLP, report) apart from the engine."""

from __future__ import annotations

from nvrx_slo.alerts import spec
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.contracts.catalogue import Category, FaultCause, RestartLevel, RestartPhase
from nvrx_slo.exporter.engine.snapshot import (
    CheckpointStats,
    Histogram,
    RankSnapshot,
    RankState,
    RestartRecord,
    RestartStats,
    Snapshot,
)

# What the views judge against: the shipped spec's targets, as the CLI hands them over.
TARGETS = spec.load().targets


def histogram(bounds: tuple[float, ...], observations: list[float]) -> Histogram:
    counts = tuple(sum(1 for o in observations if o <= b) for b in bounds) + (len(observations),)
    return Histogram(bounds, counts, float(sum(observations)), len(observations))


def rank(r: int, *, wall: float = 100.0, productive: float = 90.0, unprotected: float = 2.0,
         at_risk: float = 1.5) -> RankSnapshot:
    rest = wall - productive - unprotected
    seconds = {c: 0.0 for c in cat.SETTLED_CATEGORIES}
    seconds[Category.PRODUCTIVE] = productive
    seconds[Category.CHECKPOINT_BLOCKING] = rest * 0.25
    seconds[Category.RESTART] = rest * 0.5
    seconds[Category.INIT] = rest * 0.25
    return RankSnapshot(rank=r, wall_s=wall, seconds=seconds, unprotected_s=unprotected, at_risk_s=at_risk,
                        steps=100 + r, step=99 + r,
                        last_step_wall=1.7e9 + r, step_duration=histogram(cat.STEP_BUCKETS, [0.2, 0.3, 0.9 + r]),
                        worker_alive=r != 1, skew_ratio=1.0 + r / 10, gpu_idle_s=5.0 + r, state=RankState.TRAINING,
                        pid=1000 + r, restart=0, iter=0, last_restore_wall=None, user_spans={"eval": 0.0},
                        first_step_wall=None, step_timer=cat.StepTimer.CUDA if r != 1 else cat.StepTimer.HOST_ON_GPU)


def snapshot(n_ranks: int = 2, **kw: object) -> Snapshot:
    levels = list(RestartLevel)
    restarts = RestartStats(
        counts={lv: (1 if lv is RestartLevel.INJOB else 0) for lv in levels},
        duration={lv: histogram(cat.RESTART_BUCKETS, [3.0] if lv is RestartLevel.INJOB else []) for lv in levels},
        phases={(lv, ph): histogram(cat.RESTART_BUCKETS, [0.5] if lv is RestartLevel.INJOB else [])
                for lv in levels for ph in RestartPhase},
        mtbf_s=200.0,
        recent=(RestartRecord(RestartLevel.INJOB, "SIGKILL", 1.7e9 + 50, 3.0,
                              {ph: 0.5 for ph in RestartPhase}, n_ranks, True, FaultCause.KILLED, 0.0, 3.0 * n_ranks),),
        launcher_remaining=2,
    )
    checkpoints = CheckpointStats(
        saves=3, failures=1, in_flight=1, bytes_total=3 << 20,
        blocking=histogram(cat.CHECKPOINT_BUCKETS, [0.02, 0.03, 4.0]),
        background=histogram(cat.CHECKPOINT_BUCKETS, [0.5, 0.6]), overlap_ratio=0.9, blocking_fraction=0.005,
        last_success_wall=1.7e9 + 80, last_success_step=90, age_s=20.0, interval_s=30.0, optimal_interval_s=45.0,
        recent=())
    fields: dict[str, object] = dict(
        now_mono=1000.0, now_wall=1.7e9 + 100, job="job-a", pod="pod-0", node="node-0", job_start_wall=1.7e9,
        finished=False, failure=None, ranks=tuple(rank(r) for r in range(n_ranks)), checkpoints=checkpoints,
        restarts=restarts,
        predicted_efficiency=0.97, events_accepted=1234, duplicates=2, out_of_order=3, late=1, implausible=0,
        records_lost=0,
        journal_lag_s=0.4, world_size=n_ranks, pod_ranks=n_ranks, absent_s=0.0,
        caused={(Category.RESTART, FaultCause.KILLED): 3.0 * n_ranks})  # of 4.0 each: one restart still open
    fields.update(kw)
    return Snapshot(**fields)
