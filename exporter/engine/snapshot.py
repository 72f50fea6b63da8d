"""What the accounting engine tells its views: frozen, plain-data snapshots.

``Engine.snapshot(now_mono, now_wall)`` returns a ``Snapshot``; the Prometheus collector, the OTLP
instruments, the status page and the offline report all render one, and none of them computes
anything the engine could get wrong twice. Names and units follow ``nvrx_slo.contracts.catalogue``:
seconds, rank-seconds for time accounting, Unix seconds for ``*_wall`` timestamps.

The invariant every snapshot keeps, per rank and therefore in sum:

    sum(rank.seconds.values()) + rank.unprotected_s == rank.wall_s

``seconds`` holds every settled category (``catalogue.SETTLED_CATEGORIES``) and only grows from
one snapshot to the next; ``unprotected_s`` is the provisional gauge (see docs/accounting.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

from nvrx_slo.contracts.catalogue import Category, FaultCause, RestartLevel, RestartPhase, StepTimer

K = TypeVar("K")


def _summed(maps: Iterable[Mapping[K, float]]) -> dict[K, float]:
    out: dict[K, float] = {}
    for m in maps:
        for key, value in m.items():
            out[key] = out.get(key, 0.0) + value
    return out


@dataclass(frozen=True)
class Histogram:
    """A Prometheus-style histogram: ``counts[i]`` observations ≤ ``bounds[i]``, cumulative.

    ``counts`` has ``len(bounds) + 1`` entries; the last is the ``+Inf`` bucket and equals ``count``.
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int

    @classmethod
    def merged(cls, hists: Sequence[Histogram]) -> Histogram:
        """Every observation of ``hists`` (at least one, all with the same bounds) in one histogram."""
        return cls(hists[0].bounds, tuple(map(sum, zip(*(h.counts for h in hists), strict=True))),
                   sum(h.sum for h in hists), sum(h.count for h in hists))

    def cumulative_at(self, bounds: Sequence[float]) -> list[int]:
        """The observations ≤ each of ``bounds`` (some of this histogram's own), then all of them:
        the buckets of an export with fewer bounds than the engine keeps."""
        return [self.counts[self.bounds.index(b)] for b in bounds] + [self.counts[-1]]

    def share_within(self, bound: float) -> float | None:
        """The share of observations ≤ ``bound`` (one of the bounds); ``None`` with none."""
        return self.counts[self.bounds.index(bound)] / self.count if self.count else None

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


class RankState(str, Enum):
    """Where a rank's loop is at its newest accounted event."""

    INIT = "init"  # started, no step yet
    TRAINING = "training"  # between steps (or in one)
    RESTART = "restart"  # a fault was seen; the restarted loop has not stepped yet
    ENDED = "ended"  # the loop is over: process_end, or the Wrapper's completion
    LOST = "lost"  # job level only (``exporter/offline/rollup.py``): the pod running it went, its processes too


@dataclass(frozen=True)
class RankSnapshot:
    rank: int
    wall_s: float  # rank-seconds since the job's first process start (stops when the job finished)
    seconds: Mapping[Category, float]  # settled seconds per category; UNPROTECTED is not a key
    unprotected_s: float  # provisional: steps since the last durable save + the open tail
    # Of unprotected_s, what no save or restore read so far keeps (once the reorder window settles
    # it, it is lost or badput): what the job loses if the pod goes now. 0 once the pod finished.
    at_risk_s: float
    steps: int  # completed steps, rolled-back ones included
    step: int | None  # latest training step number reached
    last_step_wall: float | None  # Unix time the latest step ended
    step_duration: Histogram  # catalogue.STEP_BUCKETS
    worker_alive: bool | None  # async checkpoint worker, None if never reported by this process
    skew_ratio: float | None  # recent mean step time / median across ranks
    gpu_idle_s: float  # rank-seconds not in a step's compute/optimizer (source STEP_PHASES)
    state: RankState
    pid: int
    restart: int  # ft_launcher restart count of the newest process
    iter: int  # inprocess.Wrapper iteration of the newest process
    last_restore_wall: float | None  # Unix time of its newest restore (the job went on without a pod gone before)
    user_spans: Mapping[str, float]  # the user_span category by span name
    first_step_wall: float | None  # Unix time the rank's first step (in this pod) began
    pod: str = ""  # in a job's snapshot: the pod that ran it (a lost pod's rank and its replacement's differ)
    step_timer: StepTimer | None = None  # how its newest process times its steps (None: not journaled)

    @property
    def efficiency(self) -> float | None:
        """The rank's productive seconds over its wall seconds."""
        return self.seconds.get(Category.PRODUCTIVE, 0.0) / self.wall_s if self.wall_s > 0 else None


@dataclass(frozen=True)
class CheckpointRecord:
    """One save, aggregated over the ranks that journaled it (max times, summed bytes)."""

    ckpt: str
    step: int
    mode: str
    blocking_s: float | None  # slowest rank's start -> scheduled (+ finalize spans and the loop's waits on it)
    background_s: float | None  # slowest rank's scheduled -> written
    ok: bool | None  # None while in flight; False if any rank failed
    bytes: int
    written_wall: float | None  # Unix time the last rank's write finished
    ranks: int  # ranks that reported its start
    incarnation: tuple[int, int]  # (restart, iter) of the processes that saved it: an id may recur after a rollback
    began_wall: float | None  # Unix time the first rank started it


@dataclass(frozen=True)
class CheckpointStats:
    saves: int  # durable saves (checkpoint ids with an ok end and no failed end)
    failures: int  # checkpoint ids with a failed end
    in_flight: int  # checkpoint ids started by a live process and not yet ended there
    bytes_total: int  # bytes of durable saves, all ranks
    blocking: Histogram  # one observation per rank per save; catalogue.CHECKPOINT_BUCKETS
    background: Histogram  # one observation per rank per durable save
    overlap_ratio: float | None  # background / (blocking + background), all saves so far
    blocking_fraction: float | None  # checkpoint_blocking rank-seconds / wall rank-seconds
    last_success_wall: float | None
    last_success_step: int | None
    age_s: float | None  # monotonic seconds since the newest durable save was written
    interval_s: float | None  # measured mean time between durable saves
    optimal_interval_s: float | None  # Young/Daly sqrt(2 * C * MTBF)
    recent: tuple[CheckpointRecord, ...]  # newest last, bounded


@dataclass(frozen=True)
class RestartRecord:
    """One restart of the pod's job, counted once however many ranks took part."""

    level: RestartLevel
    cause: str | None
    fault_wall: float
    duration_s: float | None  # fault -> first step of the restarted loop; None while in progress
    phases: Mapping[RestartPhase, float]  # only the phases whose boundaries were journaled
    ranks: int
    fault_journaled: bool  # the fault's instant was journaled (else a rank's last record before it: a bound)
    fault: FaultCause = FaultCause.UNKNOWN  # why (``cause`` is what was journaled of it, as text)
    lost_s: float = 0.0  # rank-seconds of work its ranks' restores rolled back, up to its fault instant ...
    # ... and restarting, with what its ranks did after that instant: its cost, charged to ``fault``
    # (the lost part of its ranks' unfinished steps is their own faults', not in it)
    restart_s: float = 0.0


@dataclass(frozen=True)
class RestartStats:
    counts: Mapping[RestartLevel, int]  # every level is a key
    duration: Mapping[RestartLevel, Histogram]  # catalogue.RESTART_BUCKETS
    phases: Mapping[tuple[RestartLevel, RestartPhase], Histogram]  # every (level, phase) is a key
    mtbf_s: float | None  # job wall time / faults; None before the first fault
    recent: tuple[RestartRecord, ...]  # newest last, bounded
    launcher_remaining: int | None  # ft_launcher's --max-restarts minus its workers' restart count; None: not journaled


@dataclass(frozen=True)
class Snapshot:
    now_mono: float
    now_wall: float
    job: str
    pod: str
    node: str
    job_start_wall: float | None  # Unix time of the pod journal's earliest event
    finished: bool  # the job is over (``launcher.Launcher.ending``): wall stopped, everything settled
    failure: str | None  # how a job that is over failed (None: it finished cleanly, or runs)
    ranks: tuple[RankSnapshot, ...]  # sorted by rank
    checkpoints: CheckpointStats
    restarts: RestartStats
    predicted_efficiency: float | None  # ETTR model (Kokolis et al. 2024)
    events_accepted: int
    duplicates: int  # same (pid, seq) seen again: ignored
    out_of_order: int  # arrived behind a newer event of its rank, within the reorder window: accounted
    late: int  # older than the reorder window when it arrived: counted, not accounted
    implausible: int  # times contradicting themselves, their process or the clock: counted, not accounted
    records_lost: int  # seqs a process wrote that were never read (rotated away unread, failed writes)
    journal_lag_s: float | None  # now_mono - newest event's mono
    world_size: int | None  # the job's ranks: its processes' WORLD_SIZE, or a fixed-size launcher's (None: unknown)
    pod_ranks: int  # ranks the pod runs: journaled, or said by its running launcher (a job: its pods' sum)
    absent_s: float  # job level: rank-seconds no pod accounted (Category.ABSENT); 0 for a pod
    # The settled lost and restart seconds (and a job's absent ones) by the cause of the fault that
    # cost them; a restart's once it is over (folded), so they may lag ``seconds`` while one is open.
    caused: Mapping[tuple[Category, FaultCause], float] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """The job's state as views show it: running, finished, or failed and how."""
        if not self.finished:
            return "running"
        return "finished" if self.failure is None else f"failed ({self.failure})"

    @property
    def wall_s(self) -> float:
        """Rank-seconds of wall: every rank's, and for a job the absent ranks' too."""
        return sum(r.wall_s for r in self.ranks) + self.absent_s

    @property
    def seconds(self) -> dict[Category, float]:
        """Settled rank-seconds per category, summed over ranks."""
        return _summed(r.seconds for r in self.ranks)

    @property
    def user_spans(self) -> dict[str, float]:
        """The user_span category by span name, summed over ranks."""
        return _summed(r.user_spans for r in self.ranks)

    @property
    def unprotected_s(self) -> float:
        return sum(r.unprotected_s for r in self.ranks)

    @property
    def latest_step(self) -> int | None:
        """The training step the most advanced rank reached; ``None`` before any step."""
        return max((r.step for r in self.ranks if r.step is not None), default=None)

    @property
    def restarts_total(self) -> int:
        return sum(self.restarts.counts.values())

    @property
    def rank_count(self) -> int:
        """Ranks accounted: in a job a lost pod's rank and its replacement's are one."""
        return len({r.rank for r in self.ranks})

    @property
    def efficiency(self) -> float | None:
        """Goodput ratio: productive rank-seconds / wall rank-seconds (the rank average)."""
        wall = self.wall_s
        return self.seconds.get(Category.PRODUCTIVE, 0.0) / wall if wall > 0 else None
