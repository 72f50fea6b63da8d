"""One job from its pods' snapshots: what a person reads after a run of many pods.

Each pod's sidecar accounts only its own ranks, and its snapshot is the truth about them; the job
is their sum. Time adds up (rank-seconds of every pod), and so do the checkpoint histograms
(rank-seconds of blocking and background). Restarts do not: a job in lock step restarts every
pod at each fault, and each pod records its share — the failed pod an in-job restart, a survivor
an in-process attempt and then an in-job restart by its launcher's new rendezvous round. The job
had one restart: the pods' records whose spans overlap, from the earliest fault any pod saw to
the last rank back to training, at the most disruptive level any pod needed.

Saves do not add up either: each pod records its share of a save under its own processes'
incarnation (a replacement pod's first process is restart 0 however often the job restarted), so
the pods' records of one checkpoint id begun between the same two job restarts are one save of
the job, as good as its worst share.

The restarts and saves come from each snapshot's ``restarts.recent`` and ``checkpoints.recent``
(the newest few per pod): a report over a long job's full history replays its journals instead.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Collection, Sequence

from nvrx_slo.contracts.catalogue import Category, FaultCause, RestartLevel, RestartPhase
from nvrx_slo.exporter.engine import derived
from nvrx_slo.exporter.engine.histogram import RestartBuckets
from nvrx_slo.exporter.engine.snapshot import (
    CheckpointRecord,
    CheckpointStats,
    Histogram,
    RankState,
    RestartRecord,
    RestartStats,
    Snapshot,
)

_DISRUPTION = (RestartLevel.INPROCESS, RestartLevel.INJOB, RestartLevel.POD)


@dataclasses.dataclass(frozen=True)
class JobRestart:
    record: RestartRecord  # job level: earliest fault, the last pod back; ``ranks`` summed
    pods: tuple[str, ...]  # the pods whose records it merges, in fault order


def merge_restarts(pods: Sequence[Snapshot]) -> list[JobRestart]:
    """The pods' restart records, one per job restart (overlapping spans merged), oldest first.

    Its fault is the earliest journaled fault instant among them (else the earliest bound).
    A record still in progress (``duration_s`` None) stays open: every later record joins it.
    Phases are those of the pod that came back last, its detect phase widened by however much
    earlier the job's first fault was, so they still sum to the job's duration. A pod that started
    during the restart (the replacement of a lost pod: a first process, no restart of its own) ends
    it too: the job trains again once that pod's ranks step, later than the survivors' (the wait
    is the restore phase's, which ends at the last rank's first step).
    """
    records = sorted(((r, snap.pod) for snap in pods for r in snap.restarts.recent), key=lambda x: x[0].fault_wall)
    groups: list[list[tuple[RestartRecord, str]]] = []
    end = float("-inf")
    for record, pod in records:
        if groups and record.fault_wall <= end:
            groups[-1].append((record, pod))
        else:
            groups.append([(record, pod)])
            end = float("-inf")
        end = max(end, float("inf") if record.duration_s is None else record.fault_wall + record.duration_s)
    return [_joined(_merged(group), pods) for group in groups]


def _joined(restart: JobRestart, pods: Sequence[Snapshot]) -> JobRestart:
    r = restart.record
    if r.duration_s is None:
        return restart
    end = r.fault_wall + r.duration_s
    late = [(first, snap.pod) for snap in pods if snap.pod not in restart.pods and snap.job_start_wall is not None
            and r.fault_wall < snap.job_start_wall <= end
            for first in (rank.first_step_wall for rank in snap.ranks) if first is not None and first > end]
    if not late:
        return restart
    back = max(first for first, _ in late)
    phases = dict(r.phases)
    phases[RestartPhase.RESTORE] = phases.get(RestartPhase.RESTORE, 0.0) + back - end
    record = dataclasses.replace(r, duration_s=back - r.fault_wall, phases=phases)
    return JobRestart(record, (*restart.pods, *dict.fromkeys(pod for _, pod in late)))


def _merged(group: list[tuple[RestartRecord, str]]) -> JobRestart:
    # a journaled fault instant is the true one; a pod's last record before it only bounds it
    first = next((r for r, _ in group if r.fault_journaled), group[0][0])
    level = max((r.level for r, _ in group), key=_DISRUPTION.index)
    if any(r.duration_s is None for r, _ in group):
        duration, phases = None, {}
    else:
        last = max((r for r, _ in group), key=lambda r: r.fault_wall + (r.duration_s or 0.0))
        duration = last.fault_wall + (last.duration_s or 0.0) - first.fault_wall
        phases = _phases_since(last, first.fault_wall)
    cause = first.cause or next((r.cause for r, _ in group if r.cause), None)
    record = RestartRecord(level, cause, first.fault_wall, duration, phases, sum(r.ranks for r, _ in group),
                           first.fault_journaled, first.fault, sum(r.lost_s for r, _ in group),
                           sum(r.restart_s for r, _ in group))
    return JobRestart(record, tuple(dict.fromkeys(pod for _, pod in group)))


def _phases_since(last: RestartRecord, fault_wall: float) -> dict[RestartPhase, float]:
    """``last``'s phases from the job's fault on: its detect phase takes the lead when that pod's
    fault came later; when it came earlier (a bound), its first phases lose the excess."""
    lead = last.fault_wall - fault_wall
    phases = {phase: last.phases.get(phase, 0.0) + (max(lead, 0.0) if phase is RestartPhase.DETECT else 0.0)
              for phase in RestartPhase if phase in last.phases or (phase is RestartPhase.DETECT and lead > 0)}
    excess = -lead
    for phase, seconds in phases.items():
        if excess <= 0:
            break
        phases[phase] = max(0.0, seconds - excess)
        excess -= seconds
    return phases


def merge_checkpoints(pods: Sequence[Sequence[CheckpointRecord]],
                      restarts: Sequence[RestartRecord]) -> tuple[CheckpointRecord, ...]:
    """The job's saves from each pod's records (``restarts``: the job's, ``merge_restarts``),
    oldest first. A lock-step job saves a checkpoint id at most once between two of its restarts,
    so the pods' records of one id begun between the same two restarts' faults are one save:
    failed if any share failed, else unfinished if any is (a lost pod's share never ends), else
    durable; its times are the slowest share's, its bytes and ranks the shares' sums."""
    faults = sorted(r.fault_wall for r in restarts)
    groups: dict[tuple[str, int], list[CheckpointRecord]] = {}
    for records in pods:
        for c in records:
            began = c.began_wall if c.began_wall is not None else c.written_wall
            epoch = 0 if began is None else bisect.bisect_right(faults, began)
            groups.setdefault((c.ckpt, epoch), []).append(c)
    merged = [_one_save(shares) for shares in groups.values()]
    return tuple(sorted(merged, key=lambda c: (_when(c), c.ckpt)))


def _when(c: CheckpointRecord) -> float:
    return next((t for t in (c.began_wall, c.written_wall) if t is not None), float("-inf"))


def _one_save(shares: list[CheckpointRecord]) -> CheckpointRecord:
    oks = [c.ok for c in shares]
    ok = False if False in oks else None if None in oks else True
    first = min(shares, key=_when)

    def slowest(values: list[float | None]) -> float | None:
        return max((v for v in values if v is not None), default=None)

    return dataclasses.replace(
        first, step=max(c.step for c in shares), mode=next((c.mode for c in shares if c.mode), ""),
        blocking_s=slowest([c.blocking_s for c in shares]), background_s=slowest([c.background_s for c in shares]),
        ok=ok, bytes=sum(c.bytes for c in shares), written_wall=slowest([c.written_wall for c in shares]),
        ranks=sum(c.ranks for c in shares),
        began_wall=min((c.began_wall for c in shares if c.began_wall is not None), default=None))


def _restart_stats(restarts: list[JobRestart], elapsed: float) -> RestartStats:
    duration = {level: RestartBuckets() for level in RestartLevel}
    phases = {(lv, ph): RestartBuckets() for lv in RestartLevel for ph in RestartPhase}
    counts = {level: 0 for level in RestartLevel}
    for job_restart in restarts:
        r = job_restart.record
        counts[r.level] += 1
        if r.duration_s is not None:
            duration[r.level].observe(r.duration_s)
        for phase, seconds in r.phases.items():
            phases[(r.level, phase)].observe(seconds)
    return RestartStats(counts, {k: b.frozen() for k, b in duration.items()},
                        {k: b.frozen() for k, b in phases.items()}, derived.mtbf(elapsed, len(restarts)),
                        tuple(r.record for r in restarts), None)


def _settled(gone: Snapshot) -> Snapshot:
    """A lost pod's unsettled time, as its going decided it: what the saves it journaled keep is
    productive, the rest (its work at risk: its steps since, the badput its reorder window still
    held, its open tail) lost, since no save of its can land now. The rules count the same at-risk
    seconds as badput once its series are gone. Its ranks are lost, whatever its journal's last
    records said (a pod's state lags its reorder window), and their checkpoint workers with them."""
    ranks = []
    caused = dict(gone.caused)
    lost = (Category.LOST, FaultCause.POD_LOST)
    caused[lost] = caused.get(lost, 0.0) + sum(r.at_risk_s for r in gone.ranks)
    for r in gone.ranks:
        seconds = dict(r.seconds)
        seconds[Category.LOST] += r.at_risk_s
        seconds[Category.PRODUCTIVE] += r.unprotected_s - r.at_risk_s
        ranks.append(dataclasses.replace(r, seconds=seconds, unprotected_s=0.0, at_risk_s=0.0, state=RankState.LOST,
                                         worker_alive=None if r.worker_alive is None else False))
    return dataclasses.replace(gone, ranks=tuple(ranks), caused=caused)


def lost_pods(pods: Sequence[Snapshot]) -> set[str]:
    """The pods the job went on without, read from journals after the fact: a pod that had not
    finished when another pod's rank restored from a checkpoint after the pod's last record. (A
    live caller that saw the pod go says so instead: ``job_snapshot(..., lost=)``.)"""
    restored = max((r.last_restore_wall for snap in pods for r in snap.ranks if r.last_restore_wall is not None),
                   default=float("-inf"))
    return {snap.pod for snap in pods if not snap.finished and snap.job_start_wall is not None
            and restored > snap.job_start_wall + max((r.wall_s for r in snap.ranks), default=0.0)}


def _finished(pods: Sequence[Snapshot], world: int | None) -> bool:
    """As many lanes as the world has ranks ended in finished pods (a lost pod's, in its
    replacement's; a lane keeps the rank its accelerator first ran, and a rendezvous may renumber
    the ranks after a loss); without a known world size, every pod finished."""
    if world is None:
        return all(snap.finished for snap in pods)
    return sum(len(snap.ranks) for snap in pods if snap.finished) >= world


def job_snapshot(pods: Sequence[Snapshot], lost: Collection[str] = ()) -> Snapshot:
    """The job as one snapshot (every pod's ranks; ``pod`` lists the pods), for the same views.

    The job's wall is its world size × its span (the first pod's first event to the last pod's
    end): the rank-seconds no pod accounted are ``absent_s`` — a pod scheduled late, a lost node
    until its replacement runs its ranks. ``lost`` names the pods the caller saw go: their
    unsettled time is settled as their going decided it (``_settled``), and their
    checkpoint counts are left out (a lost pod's last snapshot misses every save after it). A save
    is durable for the job once every pod's share is, so the job counts the fewest saves any other
    pod counted. A pod-level estimate that does not add up across pods (the ETTR prediction,
    checkpoint age and interval, the Young/Daly interval, journal lag) is left out (None); the
    readers' counts are summed.
    """
    if not pods:
        raise ValueError("a job needs at least one pod's snapshot")
    pods = [_settled(snap) if snap.pod in lost else snap for snap in pods]
    ranks = tuple(sorted((dataclasses.replace(r, pod=snap.pod) for snap in pods for r in snap.ranks),
                         key=lambda r: r.rank))
    # each pod's span on the wall clock: its first event to its ranks' end (the job's clock: the
    # pods' monotonic clocks are their nodes')
    spans = [(snap.job_start_wall, snap.job_start_wall + max((r.wall_s for r in snap.ranks), default=0.0))
             for snap in pods if snap.job_start_wall is not None]
    start, end = min((s for s, _ in spans), default=0.0), max((e for _, e in spans), default=0.0)
    elapsed = end - start
    world = max((snap.world_size for snap in pods if snap.world_size is not None), default=None)
    absent = 0.0 if world is None else max(0.0, world * elapsed - sum(r.wall_s for r in ranks))
    restarts = merge_restarts(pods)
    finished = _finished(pods, world)
    cks = [snap.checkpoints for snap in pods if snap.pod not in lost] or [snap.checkpoints for snap in pods]
    blocking, background = Histogram.merged([c.blocking for c in cks]), Histogram.merged([c.background for c in cks])
    blocked = sum(r.seconds[Category.CHECKPOINT_BLOCKING] for r in ranks)
    successes = [c for c in cks if c.last_success_wall is not None]
    newest = max(successes, key=lambda c: c.last_success_wall or 0.0) if successes else None
    checkpoints = CheckpointStats(
        saves=min(c.saves for c in cks), failures=max(c.failures for c in cks),
        in_flight=max(c.in_flight for c in cks), bytes_total=sum(c.bytes_total for c in cks),
        blocking=blocking, background=background, overlap_ratio=derived.overlap_ratio(blocking.sum, background.sum),
        blocking_fraction=derived.blocking_fraction(blocked, sum(r.wall_s for r in ranks)),
        last_success_wall=None if newest is None else newest.last_success_wall,
        last_success_step=None if newest is None else newest.last_success_step,
        age_s=None, interval_s=None, optimal_interval_s=None,
        recent=merge_checkpoints([snap.checkpoints.recent for snap in pods], [r.record for r in restarts]))
    return Snapshot(
        now_mono=max(snap.now_mono for snap in pods), now_wall=max(snap.now_wall for snap in pods),
        job=pods[0].job, pod=", ".join(snap.pod for snap in pods),
        node=", ".join(dict.fromkeys(snap.node for snap in pods if snap.node)),
        job_start_wall=start if spans else None, finished=finished,
        failure=next((snap.failure for snap in pods if snap.failure is not None), None) if finished else None,
        ranks=ranks,
        checkpoints=checkpoints, restarts=_restart_stats(restarts, elapsed), predicted_efficiency=None,
        events_accepted=sum(snap.events_accepted for snap in pods), duplicates=sum(s.duplicates for s in pods),
        out_of_order=sum(s.out_of_order for s in pods), late=sum(s.late for s in pods),
        implausible=sum(s.implausible for s in pods), records_lost=sum(s.records_lost for s in pods),
        journal_lag_s=None, world_size=world, pod_ranks=sum(snap.pod_ranks for snap in pods), absent_s=absent,
        caused=_caused(pods, absent))


def _caused(pods: Sequence[Snapshot], absent: float) -> dict[tuple[Category, FaultCause], float]:
    """The pods' seconds by cause, and the job's absent ones: ranks no pod ran (a node or pod gone)."""
    out: dict[tuple[Category, FaultCause], float] = {}
    for snap in pods:
        for key, seconds in snap.caused.items():
            out[key] = out.get(key, 0.0) + seconds
    if absent > 0:
        out[(Category.ABSENT, FaultCause.POD_LOST)] = absent
    return out
