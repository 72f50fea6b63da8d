"""Which lane a record belongs to: one accelerator of the pod, paid for once.

A process's records go to the lane of the first rank it journaled. NVRx's ``inprocess.Wrapper``
renumbers the ranks above one it terminates (``ShiftRanks``), and a shifted process journals its
new rank: a rank that may be another pod's. Keyed by the record's own rank, the pod would count
that process twice (two lanes, two walls). Each process's file is read in order, so the first
rank seen of a pid is the one it started as.

A new process takes the lane of the accelerator it runs on, its ``local_rank``: after a
membership change torchelastic's rendezvous may hand a restarted worker another global rank (a
replacement pod joined first), and a pod of one accelerator still runs one lane. The engine and
the timeline both place records by this.
"""

from __future__ import annotations

from collections.abc import Mapping


class ProcessLanes:
    """pid -> the rank of the lane its records go to; local rank -> the lane of that accelerator."""

    __slots__ = ("_of", "_local")

    def __init__(self, known: Mapping[int, int] | None = None, local: Mapping[int, int] | None = None) -> None:
        self._of: dict[int, int] = dict(known or {})
        self._local: dict[int, int] = dict(local or {})

    def of(self, pid: int, rank: int, local_rank: int | None) -> int:
        """The lane of a record of process ``pid`` that journaled ``rank`` on ``local_rank``."""
        lane = self._of.get(pid)
        if lane is None:
            lane = self._of[pid] = rank if local_rank is None else self._local.setdefault(local_rank, rank)
        return lane

    def local(self) -> dict[int, int]:
        """Local rank -> lane, for a saved state."""
        return dict(self._local)
