"""Which records of one process were seen already, in bounded memory; and which never came.

A duplicate is a line read twice (a file re-read from its start, a copy of a file): the same
``(pid, seq, mono)``. The seqs of a process arrive nearly in order (its files are read in order,
the tail merges files by time), so ``Seqs`` keeps a *floor* (every seq below it seen) and, above
it, the seqs seen out of order (``ahead``, with their ``mono``). A record the floor already passed
is a duplicate unless what is remembered of it says otherwise: the monos of the newest
``DEDUPE_AHEAD`` seqs the floor moved over (``passed``), a second mono seen for a seq (``extra``:
a record claiming a seq its process also wrote is not the same record), and the seq ranges the
floor jumped over unseen (``holes``).

The floor jumps when more than ``DEDUPE_AHEAD`` seqs wait above a gap (a generation rotated away
unread: the seqs in between never come), and the gap is counted lost once, when it is open a
reorder window after the first record above it, or when the floor jumps over it. A jump keeps
the range it skipped as a hole: records of it that do come are not duplicates. So seqs forged
far ahead of a live process (a flood past the window) cannot make its real records duplicates;
they count as lost what they skipped (the journal claimed records that never came).
"""

from __future__ import annotations

from typing import Any

DEDUPE_AHEAD = 1024  # out-of-order seqs remembered per pid before a gap is taken as rotated away
MAX_HOLES = 8  # skipped seq ranges remembered per pid; the highest is forgotten (its seqs count as seen)
MAX_EXTRA = 1024  # second monos remembered per pid for seqs written twice


class Seqs:
    """The seqs of one process: ``seen(seq, mono)`` says whether a record is a duplicate."""

    __slots__ = ("floor", "ahead", "gap_mono", "declared", "passed", "holes", "extra")

    def __init__(self) -> None:
        self.floor = 0  # every seq below it was seen (or skipped: see holes)
        self.ahead: dict[int, float] = {}  # seq -> mono, seen above the floor
        self.gap_mono = float("inf")  # mono of the first record above the open gap
        self.declared = 0  # seqs below it were counted lost already
        self.passed: dict[int, float] = {}  # seq -> mono of the newest seqs the floor moved over from ahead
        self.holes: list[tuple[int, int]] = []  # [lo, hi): seqs the floor jumped over, not seen
        self.extra: dict[tuple[int, float], None] = {}  # (seq, mono) of records sharing a seq, oldest first

    def seen(self, seq: int, mono: float, window: float) -> tuple[bool, int]:
        """Whether ``(seq, mono)`` was seen already (remembering it if not), and how many seqs
        became known lost with it."""
        if (seq, mono) in self.extra:
            return True, 0
        if seq < self.floor:
            known = self.passed.get(seq)
            if known is None:
                return not self._fill(seq), 0
            return self._same(seq, mono, known), 0
        known = self.ahead.get(seq)
        if known is not None:
            return self._same(seq, mono, known), 0
        if seq == self.floor:
            self._raise(seq + 1)
            if not self.ahead:
                self.gap_mono = float("inf")
            return False, 0
        ahead = self.ahead
        if not ahead:
            self.gap_mono = mono
        ahead[seq] = mono
        lost = 0
        if len(ahead) > DEDUPE_AHEAD or mono > self.gap_mono + window:
            low = min(ahead)
            counted = max(self.floor, self.declared)
            if low > counted:
                lost, self.declared = low - counted, low
            if len(ahead) > DEDUPE_AHEAD:  # the seqs in between were rotated away unread, or never written
                if low > self.floor:
                    self._hole(self.floor, low)
                self._raise(low)
                self.gap_mono = mono if ahead else float("inf")
        return False, lost

    def _same(self, seq: int, mono: float, known: float) -> bool:
        """A record of a seq seen before: the same record if its mono is; else remembered as another."""
        if known == mono:
            return True
        self.extra[(seq, mono)] = None
        if len(self.extra) > MAX_EXTRA:
            del self.extra[next(iter(self.extra))]
        return False

    def _raise(self, floor: int) -> None:
        """Move the floor to ``floor`` and past the seqs seen that follow it, remembering their monos."""
        ahead, passed = self.ahead, self.passed
        while floor in ahead:
            passed[floor] = ahead.pop(floor)
            floor += 1
        while len(passed) > DEDUPE_AHEAD:
            del passed[next(iter(passed))]
        self.floor = floor

    def _hole(self, lo: int, hi: int) -> None:
        self.holes.append((lo, hi))
        self._bound()

    def _bound(self) -> None:
        """Forget the highest holes beyond ``MAX_HOLES``: the lowest is where a live process's own
        seqs continue (forged seqs far ahead make the holes above it)."""
        if len(self.holes) > MAX_HOLES:
            self.holes.remove(max(self.holes))

    def _fill(self, seq: int) -> bool:
        """Whether ``seq`` lies in a hole (then it is seen now)."""
        for i, (lo, hi) in enumerate(self.holes):
            if lo <= seq < hi:
                self.holes[i:i + 1] = [(a, b) for a, b in ((lo, seq), (seq + 1, hi)) if a < b]
                self._bound()
                return True
        return False

    # --- state ---------------------------------------------------------------------------------
    def to_state(self) -> list[Any]:
        return [self.floor, sorted(self.ahead.items()), None if self.gap_mono == float("inf") else self.gap_mono,
                self.declared, list(self.passed.items()), [list(h) for h in self.holes],
                [list(e) for e in self.extra]]

    @classmethod
    def from_state(cls, state: list[Any]) -> Seqs:
        floor, ahead, gap, declared, passed, holes, extra = state
        seqs = cls()
        seqs.floor, seqs.declared = int(floor), int(declared)
        seqs.ahead = {int(q): float(m) for q, m in ahead}
        seqs.gap_mono = float("inf") if gap is None else float(gap)
        seqs.passed = {int(q): float(m) for q, m in passed}
        seqs.holes = [(int(lo), int(hi)) for lo, hi in holes]
        seqs.extra = {(int(q), float(m)): None for q, m in extra}
        return seqs
