"""Which lane a record belongs to: the rank its process first journaled.

A lane is one accelerator of the pod, paid for once. NVRx's ``inprocess.Wrapper`` renumbers the
ranks above one it terminates (``ShiftRanks``), and a shifted process journals its new rank: a
rank that may be another pod's. Keyed by the record's own rank, the pod would count that process
twice (two lanes, two walls). Each process's file is read in order, so the first rank seen of a
pid is the one it started as. The engine and the timeline both place records by this.
"""

from __future__ import annotations

from collections.abc import Mapping


class ProcessLanes:
    """pid -> the rank of the lane its records go to."""

    __slots__ = ("_of",)

    def __init__(self, known: Mapping[int, int] | None = None) -> None:
        self._of: dict[int, int] = dict(known or {})

    def of(self, pid: int, rank: int) -> int:
        """The lane of a record of process ``pid`` that journaled ``rank``."""
        return self._of.setdefault(pid, rank)
