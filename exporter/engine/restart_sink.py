"""What a rank's ledger and the pod's restarts exchange: the ``RestartSink`` a ledger reports each
restart to, the seconds it hands over in a fault's wake (``Held``) and what it gets back (``Credit``).
Apart from ``restarts`` so that a ledger depends on this contract only."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from nvrx_slo.contracts.catalogue import FaultCause, RestartLevel, RestartPhase
from nvrx_slo.exporter.engine import causes


class RestartSink(Protocol):
    """Receives each rank's view of a restart; ``key`` is the same on every rank of the pod."""

    def began(self, rank: int, key: str, level: RestartLevel, fault: float, fault_wall: float,
              injected: bool, cause: str | None, why: FaultCause | None) -> None: ...

    def mark(self, rank: int, key: str, phase: RestartPhase, mono: float) -> None: ...

    def cause(self, rank: int, key: str, cause: str) -> None: ...

    def hold(self, rank: int, key: str, held: list[Held]) -> bool:
        """Seconds the rank would book lost in the restart's wake, for the restart to split at its
        fault instant; False when it cannot (it is not open, or the rank did not join it)."""

    def split_late(self, rank: int, key: str, held: list[Held]) -> Credit | None:
        """What the restart, folded before the rank joined it, decides at once of what the rank
        would have held (None: it is not a folded restart)."""

    def ended(self, rank: int, key: str, end: float, restart: float) -> None:
        """The rank's part of the restart is over at ``end``; it booked ``restart`` seconds in it."""

    def relaunch(self, since: float, until: float) -> float | None:
        """The instant the pod's own launcher last started workers in (``since``, ``until``], if it
        did and was not itself started again in that stretch; else None."""

    def stopped_by(self, at: float) -> int | None:
        """The signal the pod's launcher was told to stop by before ``at`` (None: it was not)."""


class Held(NamedTuple):
    """Seconds of work a rank did up to ``end`` (mono) that a restart rolls back: lost up to the
    restart's fault instant, the restart's after it."""

    end: float
    seconds: float
    cause: FaultCause | None  # the rank's own fault's (its unfinished step); None: its restore rolled it back


class Folded(NamedTuple):
    """A folded restart, for a rank whose records are read after it folded: its fault instant and
    the cause its seconds were charged to."""

    fault: float
    cause: FaultCause


class Credit(NamedTuple):
    """What a restart decided of one rank's held seconds, for its ledger: ``lost`` and ``restart``
    seconds, and where its unfinished steps that lost work ended (mono; for the views that draw steps)."""

    rank: int
    lost: float
    restart: float
    failed: tuple[float, ...]


def split(rank: int, held: list[Held], fault: float, lost_by: list[float]) -> tuple[Credit, float]:
    """Split what ``rank`` held at the fault instant: lost before it, restart after. The lost part
    of its unfinished steps is charged to their own faults' causes here (``lost_by``); returns the
    credit and the lost seconds its restores rolled back, or a peer's going failed, which are the
    restart's to charge."""
    lost = restart = rolled_back = 0.0
    failed = []
    for end, seconds, cause in held:
        after = min(seconds, max(0.0, end - fault))
        if cause is not None and seconds > after:
            failed.append(end)
        if cause is None or cause is FaultCause.PEER_FAULT:  # a peer's going failed it: the restart's cause
            rolled_back += seconds - after
        else:
            lost_by[causes.INDEX[cause]] += seconds - after
        lost += seconds - after
        restart += after
    return Credit(rank, lost, restart, tuple(failed)), rolled_back
