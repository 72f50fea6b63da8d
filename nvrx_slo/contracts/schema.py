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
``restart`` int      ft_launcher restart count (``TORCHELASTIC_RESTART_COUNT``), 0 first
``iter``    int      NVRx ``inprocess.Wrapper`` iteration (0 before any in-process restart)
=========== ======== =========================================================================

Spans are written once, at their end, with their start on the same monotonic clock in a
``start`` field, so a crash mid-span leaves no half record (the time shows as unattributed or
restart, never as double-counted).
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

SCHEMA_VERSION = 1

JOURNAL_DIR_ENV = "NVRX_SLO_JOURNAL_DIR"
JOURNAL_SUFFIX = ".jsonl"


class EventType(str, Enum):
    # --- rank processes --------------------------------------------------------------------
    PROCESS_START = "process_start"  # hooks initialised in a rank process
    PROCESS_END = "process_end"  # clean exit of a rank process
    STEP = "step"  # one training step, written at its end
    STEP_FAILED = "step_failed"  # an exception left a step: written when it left (the fault instant)
    USER_SPAN = "user_span"  # planned work that is not training (evaluation, SDC checks), named by the user
    CHECKPOINT_START = "checkpoint_start"  # the save call began: training is now blocked
    CHECKPOINT_SCHEDULED = "checkpoint_scheduled"  # blocking part over, training resumes
    CHECKPOINT_FINALIZE = "checkpoint_finalize"  # a finalize span in the training thread
    CHECKPOINT_END = "checkpoint_end"  # save durable (ok) or failed; written when observed
    CHECKPOINT_WORKER = "checkpoint_worker"  # liveness of NVRx's persistent async worker
    RESTORE = "restore"  # state loaded after a (re)start, written at its end
    FAULT_INJECTED = "fault_injected"  # the reference job injected a fault (test/demo only)
    INPROCESS_ABORT = "inprocess_abort"  # Wrapper monitor thread: fault detected
    INPROCESS_FINALIZE = "inprocess_finalize"  # Wrapper main thread: teardown done
    INPROCESS_RANK_ASSIGNMENT = "inprocess_rank_assignment"  # ranks re-assigned (rendezvous done)
    INPROCESS_INITIALIZE = "inprocess_initialize"  # Wrapper initialize; iter > 0 = restart done
    INPROCESS_COMPLETION = "inprocess_completion"  # wrapped function finished
    INPROCESS_TERMINATE = "inprocess_terminate"  # Wrapper gave up on this rank
    WARNING = "warning"  # something the operator should know (fallback restore, …)
    # --- the ft_launcher process (rank and local_rank null) --------------------------------
    LAUNCHER_START = "launcher_start"
    LAUNCHER_FAILURE_DETECTED = "launcher_failure_detected"
    LAUNCHER_WORKERS_TERMINATED = "launcher_workers_terminated"
    LAUNCHER_RENDEZVOUS_START = "launcher_rendezvous_start"
    LAUNCHER_RENDEZVOUS_DONE = "launcher_rendezvous_done"
    LAUNCHER_WORKER_START = "launcher_worker_start"
    LAUNCHER_WORKER_EXIT = "launcher_worker_exit"  # a worker process ended (the kernel's instant, via pidfd)
    LAUNCHER_METRIC = "launcher_metric"  # a torchelastic metric (name, value)
    LAUNCHER_EXIT = "launcher_exit"


# Events that cover a stretch of time: besides ``mono`` (their end) they carry ``start``.
SPAN_EVENTS = frozenset(t.value for t in (EventType.STEP, EventType.STEP_FAILED, EventType.USER_SPAN, EventType.RESTORE,
                                          EventType.CHECKPOINT_FINALIZE))
# The parts of one save, as each rank journals them (checkpoint_worker is liveness, no save's part).
CHECKPOINT_EVENTS = frozenset(t.value for t in (EventType.CHECKPOINT_START, EventType.CHECKPOINT_SCHEDULED,
                                                EventType.CHECKPOINT_FINALIZE, EventType.CHECKPOINT_END))


# Python types accepted per field; ``None`` in a tuple means the field may be null.
_NUM = (int, float)
_OPT_STR = (str, type(None))
_OPT_INT = (int, type(None))
_OPT_NUM = (int, float, type(None))

COMMON_FIELDS: dict[str, tuple[type, ...]] = {
    "v": (int,),
    "type": (str,),
    "seq": (int,),
    "mono": _NUM,
    "wall": _NUM,
    "job": (str,),
    "pod": (str,),
    "node": (str,),
    "rank": _OPT_INT,
    "local_rank": _OPT_INT,
    "pid": (int,),
    "restart": (int,),
    "iter": (int,),
}

# Required payload fields per event type. Writers may add extra fields; readers ignore them.
PAYLOAD_FIELDS: dict[EventType, dict[str, tuple[type, ...]]] = {
    EventType.PROCESS_START: {"world_size": (int,)},
    EventType.PROCESS_END: {},
    # step: the span [start, mono]; data_s/compute_s/optimizer_s are the measured phases inside it
    # (the rest of the span is loop overhead and counts with compute).
    EventType.STEP: {"step": (int,), "start": _NUM, "data_s": _NUM, "compute_s": _NUM, "optimizer_s": _NUM},
    # step_failed: the step that never completed, [start, mono]; error: the exception that left it.
    EventType.STEP_FAILED: {"step": (int,), "start": _NUM, "error": (str,)},
    # user_span: the span [start, mono] of work the user named (``Hooks.span(name)``).
    EventType.USER_SPAN: {"name": (str,), "start": _NUM},
    # ckpt: an id unique within the job for one save (e.g. "step-000120"); step: the training step it holds.
    EventType.CHECKPOINT_START: {"ckpt": (str,), "step": (int,), "mode": (str,)},  # mode: "async" | "sync"
    EventType.CHECKPOINT_SCHEDULED: {"ckpt": (str,), "plan_s": _NUM, "stage_s": _NUM, "bytes": (int,)},
    EventType.CHECKPOINT_FINALIZE: {"ckpt": (str,), "start": _NUM},
    # written: monotonic instant the write actually finished (<= mono); background = written - scheduled.
    EventType.CHECKPOINT_END: {"ckpt": (str,), "step": (int,), "ok": (bool,), "written": _NUM, "error": _OPT_STR},
    EventType.CHECKPOINT_WORKER: {"alive": (bool,), "worker_pid": _OPT_INT},
    # step: the step resumed from (its work is kept); null = fresh start. fallback: why an older
    # checkpoint (or a fresh start) was used instead of the newest, else null.
    EventType.RESTORE: {"start": _NUM, "step": _OPT_INT, "path": _OPT_STR, "fallback": _OPT_STR},
    EventType.FAULT_INJECTED: {"kind": (str,), "step": (int,)},
    EventType.INPROCESS_ABORT: {},
    EventType.INPROCESS_FINALIZE: {"cause": _OPT_STR},
    EventType.INPROCESS_RANK_ASSIGNMENT: {"cause": _OPT_STR},
    EventType.INPROCESS_INITIALIZE: {},
    EventType.INPROCESS_COMPLETION: {},
    EventType.INPROCESS_TERMINATE: {"cause": _OPT_STR},
    EventType.WARNING: {"message": (str,)},
    EventType.LAUNCHER_START: {"max_restarts": _OPT_INT},
    EventType.LAUNCHER_FAILURE_DETECTED: {},
    EventType.LAUNCHER_WORKERS_TERMINATED: {},
    EventType.LAUNCHER_RENDEZVOUS_START: {},
    EventType.LAUNCHER_RENDEZVOUS_DONE: {},
    EventType.LAUNCHER_WORKER_START: {},
    EventType.LAUNCHER_WORKER_EXIT: {"worker_pid": (int,)},
    EventType.LAUNCHER_METRIC: {"name": (str,), "value": _NUM},
    EventType.LAUNCHER_EXIT: {"code": (int,)},
}

# Payload fields a writer may leave out (a reader built later than its writer still reads it);
# checked like the required ones when present (so they are nullable), ``None`` to a reader when absent.
OPTIONAL_FIELDS: dict[EventType, dict[str, tuple[type, ...]]] = {
    # local_world_size: the worker processes of this rank's pod (``LOCAL_WORLD_SIZE``), so a pod
    # knows of ranks whose records it has not read yet.
    EventType.PROCESS_START: {"local_world_size": _OPT_INT},
    # local_world_size: the workers this launcher starts (``--nproc-per-node``), and world_size the
    # job's ranks when its size is fixed (``--nnodes N`` or ``N:N``, times that): so a pod counts
    # its ranks, and the job its world, from the launcher's start, before any worker journaled.
    EventType.LAUNCHER_START: {"local_world_size": _OPT_INT, "world_size": _OPT_INT},
    # blocked_s: seconds the loop waited on saves between steps, outside any span of its own (polls
    # of an async writer: ``Hooks.checkpoint_wait``) since the rank's previous record: checkpoint
    # blocking within the stretch before this record (for a step, also within its span). Written by
    # the next record the loop writes, so a wait needs no record of its own.
    **{event: {"blocked_s": _OPT_NUM} for event in (
        EventType.STEP, EventType.STEP_FAILED, EventType.CHECKPOINT_START, EventType.USER_SPAN,
        EventType.FAULT_INJECTED, EventType.PROCESS_END)},
    # waited_s: the loop's waits charged to this save after its block (its share of blocked_s).
    EventType.CHECKPOINT_END: {"waited_s": _OPT_NUM},
}

_TYPES = {t.value: t for t in EventType}

# Every number a reader accepts lies within ±MAX_NUMBER (2**53: the integers a float holds
# exactly), and every float is finite. Sums of many such values stay far inside int64 and
# float range, so counters and the persisted state (64-bit JSON) can always hold them.
MAX_NUMBER = 2**53


class RejectReason(str, Enum):
    """Why a journal line was rejected; the exporter counts rejections by this value."""

    MALFORMED = "malformed"  # not valid UTF-8 JSON, or truncated
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_VERSION = "unknown_version"
    UNKNOWN_TYPE = "unknown_type"
    MISSING_FIELD = "missing_field"
    BAD_FIELD = "bad_field"  # a field of the wrong type
    OUT_OF_RANGE = "out_of_range"  # a number beyond ±MAX_NUMBER, or not finite (1e400, NaN)
    # Rejected by the reader's plausibility rules, not by ``validate``: a record whose times
    # contradict themselves (a span ending before it starts, a phase longer than its span), its
    # process's other records (far before the process's first record), or the sidecar's clock
    # (in its future). One such record would skew every rank's wall for good.
    IMPLAUSIBLE = "implausible"


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
