"""The time-accounting engine: journal events in, a ``Snapshot`` out. Pure: no I/O, no threads,
no globals, no clock reads — the caller passes the clock to ``snapshot``.

Usage (one engine per pod journal)::

    engine = Engine()
    for record in validated_records:          # trainer.schema.validate()d dicts, any order
        engine.ingest(record)
    snap = engine.snapshot(time.monotonic(), time.time())
    state = engine.to_state()                 # JSON-safe; persist it with the reader's offsets
    engine = Engine.from_state(state)         # resume after a crash: nothing lost or counted twice

Arrival order: records may arrive in any order within ``reorder_window_s`` of monotonic time per
rank (files read round-robin, threads writing slightly out of order); they are accounted exactly
as if they had arrived sorted. A record older than that, relative to the newest record of its
rank, is counted in ``Snapshot.late`` and not accounted, because the time it would change is
already settled in counters that must never go down. A reader that catches up on a backlog must
therefore feed each rank's files oldest first (merging by ``mono`` is best). Duplicates by
(pid, seq) are counted and ignored. See docs/accounting.md for the model.
"""

from __future__ import annotations

from typing import Any

from exporter.snapshot import Snapshot

__all__ = ["Engine", "Snapshot"]

REORDER_WINDOW_S = 10.0


class Engine:
    """Accounts one pod's journal. ``ingest`` costs a few µs per step event."""

    def __init__(self, reorder_window_s: float = REORDER_WINDOW_S) -> None:
        raise NotImplementedError

    def ingest(self, record: dict[str, Any]) -> None:
        """Account one validated journal record (``trainer.schema.validate``)."""
        raise NotImplementedError

    def snapshot(self, now_mono: float, now_wall: float) -> Snapshot:
        """Everything known at ``now_mono`` (the journal's monotonic clock); does not change the engine."""
        raise NotImplementedError

    def to_state(self) -> dict[str, Any]:
        """A JSON-safe copy of the engine's state."""
        raise NotImplementedError

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Engine:
        """The engine ``to_state`` saved; raises ``ValueError`` if the state is not one."""
        raise NotImplementedError
