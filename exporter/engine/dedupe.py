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

from dataclasses import dataclass, field

DEDUPE_AHEAD = 1024  # out-of-order seqs remembered per pid before a gap is taken as rotated away
MAX_HOLES = 8  # skipped seq ranges remembered per pid; the highest is forgotten (its seqs count as seen)
MAX_EXTRA = 1024  # second monos remembered per pid for seqs written twice


@dataclass(slots=True)
class Seqs:
    """The seqs of one process: ``seen(seq, mono)`` says whether a record is a duplicate."""

    floor: int = 0  # every seq below it was seen (or skipped: see holes)
    ahead: dict[int, float] = field(default_factory=dict)  # seq -> mono, seen above the floor
    gap_mono: float | None = None  # mono of the first record above the open gap (None: no gap open)
    declared: int = 0  # seqs below it were counted lost already
    # seq -> mono of the newest seqs the floor moved over from ahead
    passed: dict[int, float] = field(default_factory=dict)
    holes: list[tuple[int, int]] = field(default_factory=list)  # [lo, hi): seqs the floor jumped over, not seen
    # seq -> the other monos seen for it (records sharing a seq), MAX_EXTRA in all, oldest seq first
    extra: dict[int, list[float]] = field(default_factory=dict)
    extras: int = 0  # monos in ``extra``

    def seen(self, seq: int, mono: float, window: float) -> tuple[bool, int]:
        """Whether ``(seq, mono)`` was seen already (remembering it if not), and how many seqs
        became known lost with it."""
        if self.extras and mono in self.extra.get(seq, ()):
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
                self.gap_mono = None
            return False, 0
        ahead = self.ahead
        if not ahead or self.gap_mono is None:
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
                self.gap_mono = mono if ahead else None
        return False, lost

    def _same(self, seq: int, mono: float, known: float) -> bool:
        """A record of a seq seen before: the same record if its mono is; else remembered as another."""
        if known == mono:
            return True
        self.extra.setdefault(seq, []).append(mono)
        self.extras += 1
        if self.extras > MAX_EXTRA:
            oldest = next(iter(self.extra))
            monos = self.extra[oldest]
            del monos[0]
            if not monos:
                del self.extra[oldest]
            self.extras -= 1
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
