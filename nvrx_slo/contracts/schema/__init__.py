"""Journal schema v1: the one contract between the trainer hooks (writers) and the exporter (reader).

It lives in ``nvrx_slo.contracts``, in neither room, so the sidecar needs no trainer code and the
trainer no exporter code. Stdlib only: the base install (a training process) carries it. Each part
does one job, and every name is also here:

============== ================================================================================
``records``    the records, each declared once (``EventType``, ``Record``, ``Step`` …)
``fields``     the field tables derived from them (``COMMON_FIELDS``, ``PAYLOAD_FIELDS`` …)
``rejects``    why a line was not accounted (``RejectReason``, ``JournalError``)
``validate``   the stdlib validator a reader's answers are held to (``decode``, ``encode``)
``files``      where a journal lives (``journal_file_name``, ``JOURNAL_DIR_ENV``)
============== ================================================================================

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

from nvrx_slo.contracts.schema.fields import (
    CHECKPOINT_EVENTS,
    COMMON_FIELDS,
    OPTIONAL_FIELDS,
    PAYLOAD_FIELDS,
    SPAN_EVENTS,
)
from nvrx_slo.contracts.schema.files import (
    JOURNAL_DIR_ENV,
    JOURNAL_SUFFIX,
    journal_file_name,
)
from nvrx_slo.contracts.schema.records import (
    EVENTS,
    SCHEMA_VERSION,
    Blocked,
    Cause,
    CheckpointEnd,
    CheckpointFinalize,
    CheckpointPart,
    CheckpointScheduled,
    CheckpointStart,
    CheckpointWorker,
    EventType,
    FaultInjected,
    InprocessAbort,
    InprocessCompletion,
    InprocessFinalize,
    InprocessInitialize,
    InprocessRankAssignment,
    InprocessTerminate,
    LauncherExit,
    LauncherFailureDetected,
    LauncherMetric,
    LauncherRendezvousDone,
    LauncherRendezvousStart,
    LauncherSignal,
    LauncherStart,
    LauncherWorkerExit,
    LauncherWorkerStart,
    LauncherWorkersTerminated,
    OperatorWarning,
    ProcessEnd,
    ProcessStart,
    Record,
    Restore,
    Span,
    Step,
    StepFailed,
    StepTimerKind,
    StepTiming,
    UserSpan,
    Writer,
)
from nvrx_slo.contracts.schema.rejects import (
    JournalError,
    RejectReason,
)
from nvrx_slo.contracts.schema.validate import (
    MAX_NUMBER,
    decode,
    encode,
    validate,
)

__all__ = [
    "SCHEMA_VERSION",
    "EVENTS",
    "EventType",
    "Record",
    "Span",
    "Blocked",
    "CheckpointPart",
    "Cause",
    "StepTimerKind",
    "ProcessStart",
    "ProcessEnd",
    "Step",
    "StepFailed",
    "UserSpan",
    "CheckpointStart",
    "CheckpointScheduled",
    "CheckpointFinalize",
    "CheckpointEnd",
    "CheckpointWorker",
    "Restore",
    "FaultInjected",
    "InprocessAbort",
    "InprocessFinalize",
    "InprocessRankAssignment",
    "InprocessInitialize",
    "InprocessCompletion",
    "InprocessTerminate",
    "OperatorWarning",
    "StepTiming",
    "LauncherStart",
    "LauncherFailureDetected",
    "LauncherWorkersTerminated",
    "LauncherRendezvousStart",
    "LauncherRendezvousDone",
    "LauncherWorkerStart",
    "LauncherWorkerExit",
    "LauncherSignal",
    "LauncherMetric",
    "LauncherExit",
    "Writer",
    "COMMON_FIELDS",
    "PAYLOAD_FIELDS",
    "OPTIONAL_FIELDS",
    "SPAN_EVENTS",
    "CHECKPOINT_EVENTS",
    "RejectReason",
    "JournalError",
    "MAX_NUMBER",
    "validate",
    "decode",
    "encode",
    "JOURNAL_DIR_ENV",
    "JOURNAL_SUFFIX",
    "journal_file_name",
]
