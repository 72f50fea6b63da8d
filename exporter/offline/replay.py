"""The one journal replay: a journal directory read exactly as the sidecar reads it, into the engine.

``JournalTail`` (same decoding, same merge by time, same rejections) into an ``Engine``; given a
``TimelineBuilder``, the engine keeps its history and the builder takes every record the engine
accepted and every step verdict it made, so the report's picture and its numbers agree by
construction. The report, the demo (a lost pod's journal) and the progress line each read
journals through this, and so do the tests that check them.

"Now" for a journal read after the fact is its newest accepted record, so a journal that ends
mid-run (the node died) is accounted up to its last word, not up to the moment it was read; a
reader that reads once (the report) reads with ``read_all``, which holds nothing back. A refused
record dates nothing (``tests/test_rejected_records.py``).
"""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path

from nvrx_slo.exporter.engine.engine import REORDER_WINDOW_S, Engine
from nvrx_slo.exporter.events import Event
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.offline.timeline_builder import TimelineBuilder
from nvrx_slo.exporter.views.view import View

_MONO = attrgetter("mono")


class EmptyJournal(ValueError):
    """The directory holds no accepted journal event."""


class Replay:
    """Read ``journal_dir`` (``poll``, again for what is new since) and view it (``view``); close it after."""

    def __init__(self, journal_dir: str | Path, *, reorder_window_s: float = REORDER_WINDOW_S,
                 builder: TimelineBuilder | None = None) -> None:
        self.journal_dir = journal_dir
        self.tail = JournalTail(journal_dir)
        self.engine = Engine(reorder_window_s, keep_history=builder is not None)
        self.builder = builder
        self.newest: tuple[float, float] | None = None  # (mono, wall) of the newest accepted record

    def poll(self) -> int:
        """Read everything the journal holds that was not read yet; returns the records handed on
        (``tail.directory_ok`` says whether the directory could be read)."""
        return self.tail.poll(self._ingest)

    def read_all(self) -> int:
        """Read everything the journal holds, as a last read: nothing is held back for a record to
        come (``Engine.settle``), so a journal of a job that never journaled its end (killed) is
        accounted to its last word. Returns the records handed on."""
        handed = self.poll()
        self.engine.settle()
        return handed

    def _ingest(self, records: list[Event]) -> None:
        accepted = self.engine.ingest_many(records)  # a record refused draws nothing and dates nothing
        if not accepted:
            return
        newest = max(accepted, key=_MONO)  # the first of the newest
        if self.newest is None or newest.mono > self.newest[0]:
            self.newest = (newest.mono, newest.wall)
        if self.builder is not None:
            self.builder.add_many(accepted)
            self.builder.decide(self.engine.take_decisions())

    def view(self, at: tuple[float, float] | None = None) -> View:
        """What was read, as of ``at`` (monotonic, Unix seconds) or else of the newest accepted
        record; ``EmptyJournal`` if there is none and no ``at``."""
        if at is None:
            if self.newest is None:
                rejected = sum(self.tail.rejected.values())
                raise EmptyJournal(f"no journal events in {self.journal_dir}"
                                   + (f" ({rejected} lines rejected)" if rejected else ""))
            at = self.newest
        snap = self.engine.snapshot(*at)
        if self.builder is not None:  # what the snapshot settled, the reorder window's last records
            self.builder.decide(self.engine.take_decisions())
        return View.of(snap, self.tail.rejected)

    def close(self) -> None:
        self.tail.close()

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
