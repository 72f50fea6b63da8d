"""What every step timer offers a training loop, whatever clock it times by: the step's three phases,
each a context manager (``with s.data(): ...``), and two calls the hooks make between steps."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

P = TypeVar("P", bound=AbstractContextManager[Any])


class StepPhases(Generic[P]):
    """The phases of a step, timed by ``P`` (host clocks, CUDA events); the accounting books
    ``data`` as data wait, the rest of the step as work."""

    __slots__ = ()
    _data: P
    _compute: P
    _optimizer: P

    def data(self) -> P:
        """Waiting for input (the data loader): ``data_wait`` in the accounting."""
        return self._data

    def compute(self) -> P:
        """Forward and backward."""
        return self._compute

    def optimizer(self) -> P:
        """The optimizer step (and gradient clipping, zeroing)."""
        return self._optimizer

    def settle(self) -> None:
        """Journal every step the host has left that still waits on its clock (host clocks: none)."""

    def interrupted(self, why: str) -> None:
        """A fault (``why``): journal every step still waiting, without waiting (host clocks: none)."""
