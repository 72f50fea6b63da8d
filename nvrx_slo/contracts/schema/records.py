"""The journal's records, each declared once: a class per event type, whose annotations are its fields.

A field with a default (``None``) is optional (a writer may leave it out: a reader built later than
its writer still reads it), and ``float`` is any JSON number. The field tables (``fields``), the
stdlib validator (``validate``), the sidecar's msgspec structs (``nvrx_slo.exporter.events``) and the
typed writer (``nvrx_slo.trainer.journal``) are all derived from these classes; the structs subclass
them, which is why each holds no instance data of its own (``__slots__ = ()``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, TypeVar

SCHEMA_VERSION = 1


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


@dataclasses.dataclass(frozen=True)
class Writer:
    """Who writes a record: the identity fields every record carries after its stamp (see the module
    docstring of ``nvrx_slo.contracts.schema``), declared once, here, for the writer and the reader.
    The writer stamps its lines with one of these (``nvrx_slo.trainer.journal``); a record's own
    identity fields are these."""

    job: str
    pod: str
    node: str
    rank: int | None
    local_rank: int | None
    pid: int
    restart: int = 0
    iter: int = 0


if TYPE_CHECKING:
    _Identity = Writer  # a record's identity attributes are the writer's, for the type checker
else:
    class _Identity:  # and at run time nothing: the readers' structs take the fields from ``COMMON_FIELDS``
        __slots__ = ()


class Record(_Identity):
    """The common fields (see the module docstring): the stamp below, then the ``Writer``'s. Every
    record is one of the events below."""

    __slots__ = ()
    v: int
    type: EventType
    seq: int
    mono: float
    wall: float


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
