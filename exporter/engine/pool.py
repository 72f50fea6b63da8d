"""A rank's undecided work: the steps done since its last decision, each waiting for a durable save
(productive) or a restore from an older step (lost) to decide it (``accounting.Ledger``)."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import le, not_

POOL_MAX = 4096  # undecided steps kept one by one before neighbours are merged

# A decided entry: the steps that ended in [first, last] (mono), productive or not.
Verdict = tuple[float, float, bool]


@dataclass(slots=True)
class Pool:
    """Undecided steps, oldest first, as parallel lists (a long job holds one entry per step since
    its last durable save); ``sum``: their work."""

    steps: list[int] = field(default_factory=list)  # the step of each entry (the higher, once merged)
    work: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)  # end (mono) of each entry's first step ...
    last: list[float] = field(default_factory=list)  # ... and of its last (they differ once merged)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not len(self.steps) == len(self.work) == len(self.first) == len(self.last):
            raise ValueError("ledger pool lists differ in length")

    def take(self, keep_upto: int | None, drop_rest: bool) -> tuple[list[float], list[float], list[Verdict]]:
        """Take out the entries decided: those of a step ≤ ``keep_upto`` (productive), and the rest
        too if ``drop_rest`` (lost). Returns their work, productive and lost, and each one's verdict,
        in pool order: whoever adds them up adds them in that order."""
        steps = self.steps
        if not all(map(le, steps, steps[1:])):
            return self._take_any(keep_upto, drop_rest)
        # steps in order (a process's loop): the productive ones are a prefix, decided by slicing
        k = 0 if keep_upto is None else bisect_right(steps, keep_upto)
        kept = self.work[:k]
        verdicts = list(zip(self.first[:k], self.last[:k], repeat(True)))
        if not drop_rest:
            lost: list[float] = []
            del steps[:k], self.work[:k], self.first[:k], self.last[:k]
        else:
            lost = self.work[k:]
            verdicts += zip(self.first[k:], self.last[k:], repeat(False))
            self.steps, self.work, self.first, self.last = [], [], [], []
        self.sum = sum(self.work)
        return kept, lost, verdicts

    def _take_any(self, keep_upto: int | None, drop_rest: bool) -> tuple[list[float], list[float], list[Verdict]]:
        """``take``, whatever the order of the steps."""
        productive = [keep_upto is not None and step <= keep_upto for step in self.steps]
        gone = list(repeat(True, len(productive))) if drop_rest else productive
        kept = list(compress(self.work, productive))
        lost = list(compress(self.work, map(not_, productive))) if drop_rest else []
        verdicts = list(compress(zip(self.first, self.last, productive, strict=True), gone))
        stays = list(map(not_, gone))
        self.steps = list(compress(self.steps, stays))
        self.work = list(compress(self.work, stays))
        self.first = list(compress(self.first, stays))
        self.last = list(compress(self.last, stays))
        self.sum = sum(self.work)
        return kept, lost, verdicts

    def compact(self) -> None:
        """Halve a pool that no save has drained: merge neighbours, keeping the higher step.

        Memory stays bounded when a job runs long without a durable save; a merged pair is
        decided as one (a save must cover both steps), so at most one pair's work waits for
        the next save, or is counted lost with its partner."""
        steps, work = self.steps, self.work
        odd = len(steps) % 2
        self.steps = [max(steps[i], steps[i + 1]) for i in range(0, len(steps) - odd, 2)] + steps[len(steps) - odd:]
        self.work = [work[i] + work[i + 1] for i in range(0, len(work) - odd, 2)] + work[len(work) - odd:]
        self.first = self.first[0:len(steps) - odd:2] + self.first[len(steps) - odd:]
        self.last = self.last[1:len(steps):2] + self.last[len(steps) - odd:]

    def copy(self) -> Pool:
        return Pool(self.steps[:], self.work[:], self.first[:], self.last[:], self.sum)
