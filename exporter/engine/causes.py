"""Why a fault happened, from what was journaled about it: one ``FaultCause`` per fault, decided here.

Every record that dates a fault says something of its cause, and each maps to one value of the
catalogue's small vocabulary: a ``step_failed`` is an exception; a worker's exit, as its launcher
saw it, is the signal that ended it (SIGTERM: the pod was stopped from outside; SIGINT or SIGHUP: a
user; any other: killed) or its exit code (non-zero: Python exits 1 on an exception no step saw);
the Wrapper's interruption records name a timeout (a hang) or an exception. An exception that says
the connection to a peer broke (the peer's process or node went: gloo's reset or closed socket,
NCCL's remote exit, torch's ``DistNetworkError``) is that peer's fault, not this rank's: the rank was
healthy (``peer_fault``), and a restart takes a rank's own fault first. A restart that no rank
journaled a fault for is classed by who restarted it (``Restarts.record``): its launcher after
finding the workers unhealthy (a hang), or its launcher for another pod's fault (a peer's).

The ``exception`` a fault carries as text (``RestartRecord.cause``) stays text, for the report: its
type is no label, so the label keeps a handful of values.
"""

from __future__ import annotations

import signal as signals

from nvrx_slo.contracts.catalogue import FaultCause

CAUSES: tuple[FaultCause, ...] = tuple(FaultCause)
INDEX = {cause: i for i, cause in enumerate(CAUSES)}
_STOP = {int(signals.SIGTERM): FaultCause.PREEMPTED, int(signals.SIGINT): FaultCause.STOPPED,
         int(signals.SIGHUP): FaultCause.STOPPED}
# NVRx inprocess ``Interruption`` names that mean a rank stopped answering
_TIMEOUTS = ("SOFT_TIMEOUT", "HARD_TIMEOUT", "UNRESPONSIVE")
# what a collective raises on a healthy rank when its peer's process or node went
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "remote process exited", "DistNetworkError")


def of_exit(signal: int | None, exit_code: int | None) -> FaultCause:
    """A worker process that ended on its own (its launcher was not stopping it)."""
    if signal:
        return _STOP.get(signal, FaultCause.KILLED)
    if exit_code:
        return FaultCause.EXCEPTION
    return FaultCause.UNKNOWN  # how it ended was not read (reaped first), or it exited 0 without its end record


def of_error(text: str) -> FaultCause:
    """An exception that left a step (``step_failed``), as ``type: message``."""
    return FaultCause.PEER_FAULT if any(words in text for words in _PEER_GONE) else FaultCause.EXCEPTION


def of_interruption(text: str) -> FaultCause:
    """The Wrapper's view of an in-process restart: its interruption records (``rank 1: SOFT_TIMEOUT``)
    or the exception the wrapped function raised (``RuntimeError: …``)."""
    return FaultCause.HANG if any(name in text for name in _TIMEOUTS) else of_error(text)


def zeros() -> list[float]:
    """Seconds by cause, indexed by ``INDEX``."""
    return [0.0] * len(CAUSES)
