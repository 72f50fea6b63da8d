"""Mutable histograms the engine fills, one class per bucket layout of the catalogue;
``Buckets.frozen()`` gives the snapshot's ``Histogram``."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from nvrx_slo.contracts.catalogue import CHECKPOINT_BUCKETS, RESTART_BUCKETS, STEP_BUCKETS
from nvrx_slo.exporter.engine.snapshot import Histogram

_B = TypeVar("_B", bound="Buckets")


@dataclass(slots=True)
class Buckets:
    """Per-bucket (not cumulative) counts; ``le`` semantics: a value equal to a bound falls in it.
    The bounds are the class's, never part of a saved state: a state's counts must fit them."""

    bounds: ClassVar[tuple[float, ...]] = ()
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        elif len(self.counts) != len(self.bounds) + 1:
            raise ValueError("histogram state does not match its buckets")

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def copy(self: _B) -> _B:
        return type(self)(self.counts[:], self.sum, self.count)

    def frozen(self) -> Histogram:
        cumulative, running = [], 0
        for n in self.counts:
            running += n
            cumulative.append(running)
        return Histogram(self.bounds, tuple(cumulative), self.sum, self.count)


@dataclass(slots=True)
class StepBuckets(Buckets):
    bounds: ClassVar[tuple[float, ...]] = STEP_BUCKETS


@dataclass(slots=True)
class CheckpointBuckets(Buckets):
    bounds: ClassVar[tuple[float, ...]] = CHECKPOINT_BUCKETS


@dataclass(slots=True)
class RestartBuckets(Buckets):
    bounds: ClassVar[tuple[float, ...]] = RESTART_BUCKETS
