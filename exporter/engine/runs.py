"""Runs of plain records: the bulk of a journal, accounted a run at a time (``Engine.ingest_many``).

Nearly every record a pod journals is a step or a save's part of some rank's current process, read
in order. One by one, each pays the engine's whole per-record path (plausibility, dedupe, the
process's life, the lane's counts, the reorder buffer, the ledger), most of which cannot change
between two such records. A *plain* record is one ``Engine.ingest`` accepts with no effect beyond
its process's seq floor, its lane, the pod's newest instant and accepted count, and (a save's part)
the save it belongs to:

* a step, or a save's ``checkpoint_start``/``_scheduled``/``_finalize``/``_end``, of a started, live
  process whose seqs arrive in order (the next one, none ahead), of the lane whose newest process
  it is, later than the lane's newest record (a save's part: no earlier than the record before it
  in the run; a step: later);
* plausible (``events.self_consistent``; not in the caller's future; beginning neither before the
  pod's origin, which would move it, nor more than the window before its process's start);
* a save's start only where no part of its process of a save of its id was read without a start
  (open, or earlier in the run): it would give that part its start, after which the saves fold
  again (``Checkpoints.add``);
* while no restart is open, on a lane whose ledger applies its records without a word to the
  restarts: no restart of its own open, every record it holds, and the run's, of the process it
  applies now and of no later Wrapper iteration, none a Wrapper fault.

Between such records nothing reads what another lane holds, and the saves read of the lanes only
which process each runs (unchanged in a run). So the parts are added to the saves in order, the
saves folded before each record that brings the pod's newest instant to ``Checkpoints.due`` (found
by bisection: the newest instant before each record is a running maximum), and each lane's records
taken together (``Lane.take_run``: the whole run at once), exactly as one by one:
``tests/test_engine_runs.py`` checks that every state and snapshot agree with ``ingest`` record by record.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple, cast

from nvrx_slo.contracts.schema import CheckpointPart, CheckpointStart, EventType, Step
from nvrx_slo.exporter.engine.accounting import INPROCESS_FAULT
from nvrx_slo.exporter.engine.lanes import Lane
from nvrx_slo.exporter.engine.life import Process
from nvrx_slo.exporter.events import EPS, MAX_SPAN_S, STRUCTS, Event, begin, self_consistent

if TYPE_CHECKING:
    from nvrx_slo.exporter.engine.engine import EngineState

_FAULTS = frozenset(cls for cls in STRUCTS.values() if issubclass(cls, INPROCESS_FAULT))
_STEP = cast("type[Step]", STRUCTS[EventType.STEP])  # its struct: ``type(ev) is`` it is the fastest test
PID, ITER, MONO = attrgetter("pid"), attrgetter("iter"), attrgetter("mono")


@dataclass(slots=True)
class Run:
    """One process's records in a run, and what its next record must be to join it."""

    process: Process
    lane: Lane
    seq: int  # its next record's seq
    mono: float  # the newest record's mono: the next step is later, the next part no earlier
    floor: float  # no record begins before this: the pod's origin, its process's start less the window
    iter: int  # nor comes from a later Wrapper iteration than its ledger applies
    records: list[Event] = field(default_factory=list)
    parts: list[int] = field(default_factory=list)  # the indices in ``records`` of the saves' parts


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
    # the launcher's word that a worker exited is applied to its lane without being counted in it;
    # a run's first record is later than both, even a save's part (an equal mono may sort before)
    newest = lane.newest if lane.applied is None else max(lane.newest, lane.applied.mono)
    return Run(process, lane, process.seqs.floor, math.nextafter(newest, math.inf),
               max(s.origin, process.first - s.window), ledger.iter)


class Found(NamedTuple):
    """What ``scan`` found: the run ends before ``records[end]``; its records by process; and its
    saves' parts in order, each with its index in ``records``, its save's id and its lane's rank."""

    end: int
    runs: list[Run]
    parts: list[tuple[int, Event, str, int]]


def scan(s: EngineState, records: Sequence[Event], i: int, not_after: float) -> Found:
    """The run of plain records from ``records[i]`` (none: ``end == i``)."""
    if s.restarts.open:
        return Found(i, [], [])
    runs: dict[int, Run | None] = {}  # by pid; None: its records cannot run now
    parts: list[tuple[int, Event, str, int]] = []
    saves: set[tuple[str, int | None]] = set()  # (save id, pid) of the run's parts
    pid, run, j, n = None, None, i, len(records)
    while j < n:
        ev = records[j]
        if ev.pid != pid:
            pid = ev.pid
            if pid not in runs:
                runs[pid] = _open(s, ev)
            run = runs[pid]
        if run is None or ev.seq != run.seq or ev.iter > run.iter:
            break
        mono = ev.mono
        if type(ev) is _STEP:
            start = ev.start
            span = mono - start + EPS  # events.self_consistent's rule for a step, inlined: this runs per step
            if (mono <= run.mono or mono > not_after or start < run.floor or start > mono + EPS
                    or mono - start > MAX_SPAN_S
                    or not (0.0 <= ev.data_s <= span and 0.0 <= ev.compute_s <= span
                            and 0.0 <= ev.optimizer_s <= span) or (ev.blocked_s or 0.0) < 0.0):
                break
        elif isinstance(ev, CheckpointPart):
            if (mono < run.mono or mono > not_after or begin(ev) < run.floor or not self_consistent(ev, begin(ev))
                    or isinstance(ev, CheckpointStart) and ((ev.ckpt, pid) in saves
                                                            or s.checkpoints.startless(ev.ckpt, pid))):
                break
            saves.add((ev.ckpt, pid))
            run.parts.append(len(run.records))
            parts.append((j, ev, ev.ckpt, run.lane.ledger.rank))
        else:
            break
        run.seq, run.mono = run.seq + 1, mono
        run.records.append(ev)
        j += 1
    return Found(j, [run for run in runs.values() if run is not None and run.records], parts)


def account(s: EngineState, records: Sequence[Event], i: int, found: Found, fold: Callable[[], None]) -> None:
    """Account the run ``scan`` found at ``records[i]``; ``fold``: the engine's fold of the open saves.
    Its records leave every lane's process as it was, so the saves take its parts and fold as one
    by one: each part in turn, and a fold before the record that brings the pod's newest instant to
    ``Checkpoints.due``, at that instant."""
    end, checkpoints = found.end, s.checkpoints
    newest = list(accumulate(map(MONO, records[i:end]), max, initial=s.newest))  # [k + 1]: with records[i + k]
    at = 1  # the folds before records[i + at - 1] on are still to do

    def folds(upto: int) -> None:  # the folds before each record up to records[i + upto - 1]
        nonlocal at
        while (k := bisect_left(newest, checkpoints.due, at, upto + 1)) <= upto:
            s.newest = newest[k]
            fold()
            at = k + 1
        at = upto + 1

    for j, part, ckpt, rank in found.parts:
        folds(j - i + 1)
        checkpoints.add(part, ckpt, rank)  # it gives no start to a part read without one: ``scan``
    folds(end - i)
    s.newest = newest[-1]
    s.counts.accepted += end - i
    window, sink = s.window, s.restarts
    for run in found.runs:
        run.process.seqs.floor = run.seq
        records, parts = run.records, run.parts
        steps = records
        if parts:  # the steps between the parts
            bounds = zip([-1, *parts], [*parts, len(records)], strict=True)
            steps = list(chain.from_iterable(records[a + 1:b] for a, b in bounds))
        run.lane.take_run(records, cast("list[Step]", steps), window, sink)
