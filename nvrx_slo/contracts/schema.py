"""Journal schema v1: the one contract between the trainer hooks (writers) and the exporter (reader).

It lives in ``nvrx_slo.contracts``, in neither room, so the sidecar needs no trainer code and the
trainer no exporter code. Stdlib only: the base install (a training process) carries it.

Wire format: JSON Lines, UTF-8, one object per line, each line written with a single
``write()`` on an ``O_APPEND`` descriptor (so concurrent writers never interleave), one file per
process: ``<journal_dir>/<pod>.rank-<rank>.<pid>.jsonl`` (``launcher`` for the launcher). Rotation
never renames: when a file reaches its size bound the writer goes on in the next generation
(``….<pid>.1.jsonl``, ``.2`` …) and deletes generations beyond its keep count, oldest first; see
``journal_file_name``.

Every record carries the common fields:

=========== ======== =========================================================================
field       type     meaning
=========== ======== =========================================================================
``v``       int      schema version (``SCHEMA_VERSION``); unknown versions are rejected
``type``    str      one of ``EventType``
``seq``     int      per-process sequence number, from 0; (pid, seq) identifies a record
``mono``    float    ``time.monotonic()`` when the event happened (end of a span). CLOCK_MONOTONIC
                     is node-wide on Linux, so ranks of one pod share it; it never jumps.
``wall``    float    ``time.time()`` at the same instant — for display and timestamps only
``job``     str      job name (``NVRX_SLO_JOB`` / Downward API), "" if unknown
``pod``     str      pod name (``HOSTNAME``/Downward API)
``node``    str      node name
``rank``    int|null global rank; null for the launcher process
``local_rank`` int|null
``pid``     int      OS process id of the writer
``restart`` int      the launcher's restart count (``TORCHELASTIC_RESTART_COUNT``, srun's
                     ``SLURM_RESTART_COUNT``), 0 first
``iter``    int      NVRx ``inprocess.Wrapper`` iteration (0 before any in-process restart)
=========== ======== =========================================================================

Spans are written once, at their end, with their start on the same monotonic clock in a
``start`` field, so a crash mid-span leaves no half record (the time shows as unattributed or
restart, never as double-counted).
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

SCHEMA_VERSION = 1

JOURNAL_DIR_ENV = "NVRX_SLO_JOURNAL_DIR"
JOURNAL_SUFFIX = ".jsonl"


class EventType(str, Enum):
    """The ``type`` of a record; each has its declaration below (its fields and what they mean)."""

    # --- rank processes --------------------------------------------------------------------
    PROCESS_START = "process_start"
    PROCESS_END = "process_end"
    STEP = "step"
    STEP_FAILED = "step_failed"
    USER_SPAN = "user_span"
    CHECKPOINT_START = "checkpoint_start"
    CHECKPOINT_SCHEDULED = "checkpoint_scheduled"
    CHECKPOINT_FINALIZE = "checkpoint_finalize"
    CHECKPOINT_END = "checkpoint_end"
    CHECKPOINT_WORKER = "checkpoint_worker"
    RESTORE = "restore"
    FAULT_INJECTED = "fault_injected"
    INPROCESS_ABORT = "inprocess_abort"
    INPROCESS_FINALIZE = "inprocess_finalize"
    INPROCESS_RANK_ASSIGNMENT = "inprocess_rank_assignment"
    INPROCESS_INITIALIZE = "inprocess_initialize"
    INPROCESS_COMPLETION = "inprocess_completion"
    INPROCESS_TERMINATE = "inprocess_terminate"
    WARNING = "warning"
    STEP_TIMING = "step_timing"
    # --- the ft_launcher process (rank and local_rank null) --------------------------------
    LAUNCHER_START = "launcher_start"
    LAUNCHER_FAILURE_DETECTED = "launcher_failure_detected"
    LAUNCHER_WORKERS_TERMINATED = "launcher_workers_terminated"
    LAUNCHER_RENDEZVOUS_START = "launcher_rendezvous_start"
    LAUNCHER_RENDEZVOUS_DONE = "launcher_rendezvous_done"
    LAUNCHER_WORKER_START = "launcher_worker_start"
    LAUNCHER_WORKER_EXIT = "launcher_worker_exit"
    LAUNCHER_SIGNAL = "launcher_signal"
    LAUNCHER_METRIC = "launcher_metric"
    LAUNCHER_EXIT = "launcher_exit"


# --- the events, each declared once --------------------------------------------------------
# A class per event type: its annotations are its fields, a field with a default (``None``) is
# optional (a writer may leave it out: a reader built later than its writer still reads it), and
# ``float`` is any JSON number. The field tables below are derived from these classes, and the
# sidecar's decoder builds its structs from them (``nvrx_slo.exporter.events``): they subclass
# these classes, which is why each holds no instance data of its own (``__slots__ = ()``).

class Record:
    """The common fields (see the module docstring): every record is one of the events below."""

    __slots__ = ()
    v: int
    type: EventType
    seq: int
    mono: float
    wall: float
    job: str
    pod: str
    node: str
    rank: int | None
    local_rank: int | None
    pid: int
    restart: int
    iter: int


class Span:
    """An event that covers the stretch ``[start, mono]`` (see "Spans" above)."""

    __slots__ = ()
    start: float


class Blocked:
    """An event the training loop writes, carrying its waits on saves since the rank's previous record."""

    __slots__ = ()
    # seconds the loop waited on saves outside any span of its own (polls of an async writer:
    # ``Hooks.checkpoint_wait``) since the rank's previous record: checkpoint blocking within the
    # stretch before this record (for a step, also within its span), so a wait needs no record.
    blocked_s: float | None = None


class CheckpointPart:
    """A record of one save, as each rank journals it; ``ckpt`` is an id unique within the job for
    one save (e.g. "step-000120"); after a rollback it may recur, in another (restart, iter)."""

    __slots__ = ()
    ckpt: str


class Cause:
    """An ``inprocess.Wrapper`` callback that knows why it runs (the exception, if any)."""

    __slots__ = ()
    cause: str | None


EVENTS: dict[EventType, type[Record]] = {}
_R = TypeVar("_R", bound=type[Record])


def _event(kind: EventType) -> Callable[[_R], _R]:
    def declare(cls: _R) -> _R:
        cls.type = kind  # the class's own type: every record of it has it
        EVENTS[kind] = cls
        return cls
    return declare


@_event(EventType.PROCESS_START)
class ProcessStart(Record):
    """Hooks initialised in a rank process."""

    __slots__ = ()
    world_size: int
    # the worker processes of this rank's pod (``LOCAL_WORLD_SIZE``, srun's tasks on this node), so
    # a pod knows of ranks whose records it has not read yet
    local_world_size: int | None = None
    # the restarts its launcher may make (torchrun's ``TORCHELASTIC_MAX_RESTARTS``), so a pod without a
    # launcher record tells a round that failed and is restarted from a job that failed for good
    max_restarts: int | None = None


@_event(EventType.PROCESS_END)
class ProcessEnd(Record, Blocked):
    """A rank process's end: ``Hooks.close``, or its interpreter's exit without it. ``error``: the
    uncaught exception it exited with (None: a clean end)."""

    __slots__ = ()
    error: str | None = None


@_event(EventType.STEP)
class Step(Record, Span, Blocked):
    """One training step, written at its end; data_s/compute_s/optimizer_s are the measured phases
    inside its span (the rest of the span is loop overhead and counts with compute)."""

    __slots__ = ()
    step: int
    data_s: float
    compute_s: float
    optimizer_s: float


@_event(EventType.STEP_FAILED)
class StepFailed(Record, Span, Blocked):
    """An exception left a step, written when it left (the fault instant): the step that never
    completed, and the exception that left it."""

    __slots__ = ()
    step: int
    error: str


@_event(EventType.USER_SPAN)
class UserSpan(Record, Span, Blocked):
    """Planned work that is not training (evaluation, SDC checks), named by the user (``Hooks.span(name)``)."""

    __slots__ = ()
    name: str


@_event(EventType.CHECKPOINT_START)
class CheckpointStart(Record, CheckpointPart, Blocked):
    """The save call began: training is now blocked. ``step``: the training step it holds."""

    __slots__ = ()
    step: int
    mode: str  # "async" | "sync"


@_event(EventType.CHECKPOINT_SCHEDULED)
class CheckpointScheduled(Record, CheckpointPart):
    """Blocking part over, training resumes."""

    __slots__ = ()
    plan_s: float
    stage_s: float
    bytes: int


@_event(EventType.CHECKPOINT_FINALIZE)
class CheckpointFinalize(Record, CheckpointPart, Span):
    """A finalize span in the training thread."""

    __slots__ = ()


@_event(EventType.CHECKPOINT_END)
class CheckpointEnd(Record, CheckpointPart):
    """Save durable (ok) or failed, written when observed. ``written``: the monotonic instant the
    write actually finished (<= mono); background = written - scheduled."""

    __slots__ = ()
    step: int
    ok: bool
    written: float
    error: str | None
    waited_s: float | None = None  # the loop's waits charged to this save after its block (its share of blocked_s)


@_event(EventType.CHECKPOINT_WORKER)
class CheckpointWorker(Record):
    """Liveness of NVRx's persistent async worker (no save's part)."""

    __slots__ = ()
    alive: bool
    worker_pid: int | None


@_event(EventType.RESTORE)
class Restore(Record, Span):
    """State loaded after a (re)start, written at its end. ``step``: the step resumed from (its work
    is kept), null for a fresh start; ``fallback``: why an older checkpoint (or a fresh start) was
    used instead of the newest, else null."""

    __slots__ = ()
    step: int | None
    path: str | None
    fallback: str | None


@_event(EventType.FAULT_INJECTED)
class FaultInjected(Record, Blocked):
    """The reference job injected a fault (test/demo only)."""

    __slots__ = ()
    kind: str
    step: int


@_event(EventType.INPROCESS_ABORT)
class InprocessAbort(Record):
    """Wrapper monitor thread: fault detected."""

    __slots__ = ()


@_event(EventType.INPROCESS_FINALIZE)
class InprocessFinalize(Record, Cause):
    """Wrapper main thread: teardown done."""

    __slots__ = ()


@_event(EventType.INPROCESS_RANK_ASSIGNMENT)
class InprocessRankAssignment(Record, Cause):
    """Ranks re-assigned (rendezvous done)."""

    __slots__ = ()


@_event(EventType.INPROCESS_INITIALIZE)
class InprocessInitialize(Record):
    """Wrapper initialize; iter > 0: the restart is done."""

    __slots__ = ()


@_event(EventType.INPROCESS_COMPLETION)
class InprocessCompletion(Record):
    """The wrapped function finished."""

    __slots__ = ()


@_event(EventType.INPROCESS_TERMINATE)
class InprocessTerminate(Record, Cause):
    """The Wrapper gave up on this rank."""

    __slots__ = ()


@_event(EventType.WARNING)
class OperatorWarning(Record):
    """Something the operator should know (fallback restore, …)."""

    __slots__ = ()
    message: str


class StepTimerKind(str, Enum):
    """How a process times its steps (``step_timing.timer``)."""

    CUDA = "cuda"  # CUDA events on the stream of the rank's device: the GPU's time
    HOST = "host"  # host clocks: in a process that uses CUDA, they time kernel launches, not the work


@_event(EventType.STEP_TIMING)
class StepTiming(Record):
    """How this process times its steps from ``step`` on, written when the hooks choose (at the
    first step) and whenever that changes (CUDA initialised after the first step, a CUDA error)."""

    __slots__ = ()
    step: int  # the first step timed so
    timer: str  # a ``StepTimerKind``
    cuda: bool  # the process used CUDA then: host clocks time its kernel launches, not its work
    device: int | None  # the CUDA device whose stream is timed (timer "cuda"), else null
    reason: str  # why this timer: the ``timing`` asked for, what was found


@_event(EventType.LAUNCHER_START)
class LauncherStart(Record):
    """The launcher started. ``local_world_size``: the workers it starts (``--nproc-per-node``);
    ``world_size``: the job's ranks when its size is fixed (``--nnodes N`` or ``N:N``, times that):
    so a pod counts its ranks, and the job its world, from the launcher's start."""

    __slots__ = ()
    max_restarts: int | None
    local_world_size: int | None = None
    world_size: int | None = None


@_event(EventType.LAUNCHER_FAILURE_DETECTED)
class LauncherFailureDetected(Record):
    __slots__ = ()


@_event(EventType.LAUNCHER_WORKERS_TERMINATED)
class LauncherWorkersTerminated(Record):
    __slots__ = ()


@_event(EventType.LAUNCHER_RENDEZVOUS_START)
class LauncherRendezvousStart(Record):
    __slots__ = ()


@_event(EventType.LAUNCHER_RENDEZVOUS_DONE)
class LauncherRendezvousDone(Record):
    __slots__ = ()


@_event(EventType.LAUNCHER_WORKER_START)
class LauncherWorkerStart(Record):
    __slots__ = ()


@_event(EventType.LAUNCHER_WORKER_EXIT)
class LauncherWorkerExit(Record):
    """A worker process ended (the kernel's instant, via pidfd), and how, where it could be read
    before its launcher reaped it: the signal that ended it, else its exit code."""

    __slots__ = ()
    worker_pid: int
    signal: int | None = None
    exit_code: int | None = None


@_event(EventType.LAUNCHER_SIGNAL)
class LauncherSignal(Record):
    """The launcher was told to stop (SIGTERM: the kubelet stopping its pod; SIGINT, SIGHUP: a
    user): the workers it then stops ended for this."""

    __slots__ = ()
    signal: int


@_event(EventType.LAUNCHER_METRIC)
class LauncherMetric(Record):
    """A torchelastic metric."""

    __slots__ = ()
    name: str
    value: float


@_event(EventType.LAUNCHER_EXIT)
class LauncherExit(Record):
    __slots__ = ()
    code: int


# --- the field tables, derived from the declarations ---------------------------------------
# Python types accepted per field (``schema.validate``); ``None`` in a tuple means null is allowed.

def _accepted(hint: Any) -> tuple[type, ...]:
    """The JSON values a field's annotation admits: ``float`` is any number, ``X | None`` adds null."""
    out: list[type] = []
    for part in typing.get_args(hint) or (hint,):
        part = type(None) if part is None else part
        out += [int, float] if part is float else [str] if part is EventType else [part]
    return tuple(out)


def _fields(cls: type, below: type | None) -> tuple[dict[str, tuple[type, ...]], dict[str, tuple[type, ...]]]:
    """The required and the optional fields ``cls`` declares (less those of ``below``)."""
    skip = typing.get_type_hints(below) if below is not None else {}
    required: dict[str, tuple[type, ...]] = {}
    optional: dict[str, tuple[type, ...]] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if name not in skip:
            (optional if hasattr(cls, name) and name != "type" else required)[name] = _accepted(hint)
    return required, optional


COMMON_FIELDS: dict[str, tuple[type, ...]] = _fields(Record, None)[0]
# Required payload fields per event type. Writers may add extra fields; readers ignore them.
PAYLOAD_FIELDS: dict[EventType, dict[str, tuple[type, ...]]] = {kind: _fields(cls, Record)[0]
                                                                 for kind, cls in EVENTS.items()}
# Payload fields a writer may leave out: checked like the required ones when present (so they are
# nullable), ``None`` to a reader when absent.
OPTIONAL_FIELDS: dict[EventType, dict[str, tuple[type, ...]]] = {
    kind: optional for kind, cls in EVENTS.items() if (optional := _fields(cls, Record)[1])}
# Events that cover a stretch of time (``Span``), and the parts of one save (``CheckpointPart``).
SPAN_EVENTS = frozenset(kind.value for kind, cls in EVENTS.items() if issubclass(cls, Span))
CHECKPOINT_EVENTS = frozenset(kind.value for kind, cls in EVENTS.items() if issubclass(cls, CheckpointPart))

_TYPES = {t.value: t for t in EventType}

# Every number a reader accepts lies within ±MAX_NUMBER (2**53: the integers a float holds
# exactly), and every float is finite. Sums of many such values stay far inside int64 and
# float range, so counters and the persisted state (64-bit JSON) can always hold them.
MAX_NUMBER = 2**53


class RejectReason(str, Enum):
    """Why a journal line was not accounted: every reason the sidecar counts (the ``reason`` label
    of ``nvrx_exporter_rejected_events_total``), whichever part of it refused the line."""

    # the schema's (``validate``): the line is no record of this schema
    MALFORMED = "malformed"  # not valid UTF-8 JSON, or truncated
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_VERSION = "unknown_version"
    UNKNOWN_TYPE = "unknown_type"
    MISSING_FIELD = "missing_field"
    BAD_FIELD = "bad_field"  # a field of the wrong type
    OUT_OF_RANGE = "out_of_range"  # a number beyond ±MAX_NUMBER, or not finite (1e400, NaN)
    # the reader's: a journal file it could not read, or found cut under its read offset
    UNREADABLE = "unreadable"  # could not be opened or read (counted once per episode)
    FILE_TRUNCATED = "file_truncated"  # shrank under, or was rewritten past, its read offset (writers never truncate)
    # the engine's: a valid record it did not account
    # Rejected by its plausibility rules: a record whose times contradict themselves (a span ending
    # before it starts, a phase longer than its span), its process's other records (far before the
    # process's first record), or the sidecar's clock (in its future). One such record would skew
    # every rank's wall for good.
    IMPLAUSIBLE = "implausible"
    DUPLICATE = "duplicate"  # this (pid, seq, mono) was accounted already
    LATE = "late"  # older than the reorder window when it arrived
    ENGINE_ERROR = "engine_error"  # the engine raised on it: skipped (a bug; logged)


class JournalError(ValueError):
    """A journal line that does not satisfy this schema; ``reason`` says which rule it broke."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason


def _check(record: dict[str, Any], fields: dict[str, tuple[type, ...]]) -> None:
    for name, types in fields.items():
        if name not in record:
            raise JournalError(RejectReason.MISSING_FIELD, name)
        value = record[name]
        # bool is an int subclass: never accept it where a number is meant, nor a number for a bool.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise JournalError(RejectReason.BAD_FIELD, f"{name}={value!r:.40}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not (
                -MAX_NUMBER <= value <= MAX_NUMBER):  # NaN fails both comparisons
            raise JournalError(RejectReason.OUT_OF_RANGE, f"{name}={value!r:.40}")


def validate(record: Any) -> dict[str, Any]:
    """Return ``record`` if it is a valid v1 event, else raise ``JournalError``."""
    if not isinstance(record, dict):
        raise JournalError(RejectReason.NOT_AN_OBJECT, type(record).__name__)
    if record.get("v") != SCHEMA_VERSION:
        raise JournalError(RejectReason.UNKNOWN_VERSION, repr(record.get("v")))
    kind = record.get("type")
    event_type = _TYPES.get(kind) if isinstance(kind, str) else None  # a list or dict here is not a type
    if event_type is None:
        raise JournalError(RejectReason.UNKNOWN_TYPE, repr(record.get("type")))
    _check(record, COMMON_FIELDS)
    _check(record, PAYLOAD_FIELDS[event_type])
    optional = OPTIONAL_FIELDS.get(event_type)
    if optional:
        _check(record, {name: types for name, types in optional.items() if name in record})
    return record


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (writers use allow_nan=False)")


def decode(line: bytes | str) -> dict[str, Any]:
    """Parse and validate one journal line (with or without its trailing newline)."""
    try:
        text = line.decode() if isinstance(line, bytes) else line  # strict UTF-8: no lone surrogates
        record = json.loads(text, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise JournalError(RejectReason.MALFORMED, str(exc)[:80]) from None
    except RecursionError:
        raise JournalError(RejectReason.MALFORMED, "nested too deep") from None
    return validate(record)


def encode(record: dict[str, Any]) -> bytes:
    """Serialise one record to a full line. Compact, ASCII-safe, newline-terminated."""
    return (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()


def journal_file_name(pod: str, rank: int | None, pid: int, generation: int = 0) -> str:
    """The file a process writes; ``generation`` > 0 names a rotated-out file."""
    role = "launcher" if rank is None else f"rank-{rank}"
    rotated = f".{generation}" if generation else ""
    return f"{pod}.{role}.{pid}{rotated}{JOURNAL_SUFFIX}"
