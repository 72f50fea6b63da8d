"""A mutable histogram the engine fills; ``Buckets.frozen()`` gives the snapshot's ``Histogram``."""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from nvrx_slo.exporter.engine.snapshot import Histogram


class Buckets:
    """Per-bucket (not cumulative) counts; ``le`` semantics: a value equal to a bound falls in it."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def copy(self) -> Buckets:
        out = Buckets(self.bounds)
        out.counts = self.counts[:]
        out.sum, out.count = self.sum, self.count
        return out

    def frozen(self) -> Histogram:
        cumulative, running = [], 0
        for n in self.counts:
            running += n
            cumulative.append(running)
        return Histogram(self.bounds, tuple(cumulative), self.sum, self.count)

    def to_state(self) -> list[object]:
        return [self.counts, self.sum, self.count]

    @classmethod
    def from_state(cls, bounds: tuple[float, ...], state: list[Any]) -> Buckets:
        out = cls(bounds)
        counts, total, count = state
        if not isinstance(counts, list) or len(counts) != len(bounds) + 1:
            raise ValueError("histogram state does not match its buckets")
        out.counts = [int(n) for n in counts]
        out.sum, out.count = float(total), int(count)
        return out
