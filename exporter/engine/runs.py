"""Runs of plain steps: the bulk of a journal, accounted a run at a time (``Engine.ingest_many``).

Nearly every record a pod journals is a step of some rank's current process, read in order. One by
one, each pays the engine's whole per-record path (plausibility, dedupe, the process's life, the
lane's counts, the reorder buffer, the ledger), most of which cannot change between two such
steps. A *plain* step is one ``Engine.ingest`` accepts with no effect beyond its process's seq
floor, its lane and the pod's newest instant and accepted count:

* a step of a started, live process whose seqs arrive in order (the next one, none ahead), of the
  lane whose newest process it is, later than the lane's newest record and than the step before it;
* plausible (``events.self_consistent``; not in the caller's future; beginning neither before the
  pod's origin, which would move it, nor more than the window before its process's start);
* before the instant the pod's open saves can fold (``Checkpoints.due``) while no restart is open;
* on a lane whose ledger applies its records without a word to the restarts: no restart of its
  own open, every record it holds, and the run's steps, of the process it applies now and of no
  later Wrapper iteration, none a Wrapper fault.

Between such steps nothing reads what another lane holds, so each lane's steps of a run are counted
and taken together (``Lane.take_run``), exactly as one by one: ``tests/test_engine_runs.py`` checks
that every state and snapshot agree with ``ingest`` record by record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

from nvrx_slo.contracts.schema import Step
from nvrx_slo.exporter.engine.accounting import INPROCESS_FAULT
from nvrx_slo.exporter.engine.lanes import Lane
from nvrx_slo.exporter.engine.life import Process
from nvrx_slo.exporter.events import EPS, MAX_SPAN_S, STRUCTS, Event

if TYPE_CHECKING:
    from nvrx_slo.exporter.engine.engine import EngineState

_FAULTS = frozenset(cls for cls in STRUCTS.values() if issubclass(cls, INPROCESS_FAULT))
PID, ITER = attrgetter("pid"), attrgetter("iter")


@dataclass(slots=True)
class Run:
    """One process's steps in a run, and what its next step must be to join it."""

    process: Process
    lane: Lane
    seq: int  # its next step's seq
    mono: float  # the newest step's mono: the next is later
    floor: float  # no step begins before this: the pod's origin, its process's start less the window
    iter: int  # nor comes from a later Wrapper iteration than its ledger applies
    steps: list[Step] = field(default_factory=list)


def _open(s: EngineState, ev: Event) -> Run | None:
    """The run ``ev``'s process starts with ``ev``, if its process and lane allow one (see above)."""
    process = s.processes.get(ev.pid)
    if (process is None or not process.started or process.ended is not None or process.seqs.ahead
            or process.lane is None or ev.rank is None):
        return None
    lane = s.lanes.get(process.lane)
    if lane is None or lane.newest_pid != ev.pid:
        return None
    ledger, pending = lane.ledger, lane.pending
    if ledger.first is None or ledger.fact is not None or ledger.pid != ev.pid or pending and (
            any(pid != ev.pid for pid in set(map(PID, pending))) or max(map(ITER, pending)) > ledger.iter
            or not _FAULTS.isdisjoint(map(type, pending))):
        return None
    assert s.origin is not None and process.first is not None  # the process has an accepted record
    # the launcher's word that a worker exited is applied to its lane without being counted in it
    newest = lane.newest if lane.applied is None else max(lane.newest, lane.applied.mono)
    return Run(process, lane, process.seqs.floor, newest, max(s.origin, process.first - s.window), ledger.iter)


class Found(NamedTuple):
    """What ``scan`` found: the run ends before ``records[end]``; its steps by process; and whether
    its last step reaches the instant the open saves may fold (``Checkpoints.due``), which
    ``Engine.ingest`` would fold them at before taking that step."""

    end: int
    runs: list[Run]
    folds: bool


def scan(s: EngineState, records: Sequence[Event], i: int, not_after: float) -> Found:
    """The run of plain steps from ``records[i]`` (none: ``end == i``)."""
    due = s.checkpoints.due
    if not isinstance(records[i], Step) or s.restarts.open or s.newest >= due:
        return Found(i, [], False)
    runs: dict[int, Run | None] = {}  # by pid; None: its steps cannot run now
    pid, run, j, n = None, None, i, len(records)
    while j < n:
        ev = records[j]
        if not isinstance(ev, Step):
            break
        if ev.pid != pid:
            pid = ev.pid
            if pid not in runs:
                runs[pid] = _open(s, ev)
            run = runs[pid]
        mono, start = ev.mono, ev.start
        span = mono - start + EPS  # events.self_consistent's rule for a step, inlined: this runs per step
        if (run is None or ev.seq != run.seq or mono <= run.mono or mono > not_after
                or start < run.floor or ev.iter > run.iter or start > mono + EPS or mono - start > MAX_SPAN_S
                or not (0.0 <= ev.data_s <= span and 0.0 <= ev.compute_s <= span and 0.0 <= ev.optimizer_s <= span)
                or (ev.blocked_s or 0.0) < 0.0):
            break
        run.seq, run.mono = run.seq + 1, mono
        run.steps.append(ev)
        j += 1
        if mono >= due:  # the saves fold before it is taken, and may move ``due``: the run ends with it
            return Found(j, [run for run in runs.values() if run is not None and run.steps], True)
    return Found(j, [run for run in runs.values() if run is not None and run.steps], False)


def account(s: EngineState, found: Found, n: int, fold: Callable[[], None]) -> None:
    """Account a run of ``n`` plain steps (``scan``); ``fold``: the engine's fold of the open saves.
    Its steps leave every lane's process and the saves as they were, so the saves fold as they
    would before its last step: at the pod's newest instant then, its last step's."""
    for run in found.runs:
        run.process.seqs.floor = run.seq
        if run.mono > s.newest:
            s.newest = run.mono
    s.counts.accepted += n
    if found.folds:
        fold()
    for run in found.runs:
        run.lane.take_run(run.steps, s.window, s.restarts)
