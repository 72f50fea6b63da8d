"""The SLO targets the views judge a snapshot against, as plain numbers.

The spec (``alerts/slo.yaml``, loaded by ``nvrx_slo.alerts.spec``) is the one place they are set;
the alert rules are generated from it and the status page and SLO reports are handed these
numbers from it at start-up (``nvrx_slo/cli.py``). They live here, in the neutral contracts room,
because the exporter may not import ``alerts/``, and the spec's loader needs PyYAML, which the
base install does not carry: the views get the values, never the loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Price:
    """What an accelerator costs an hour (the spec's ``cost`` section): by model, else ``default``."""

    currency: str
    default: float | None  # any model without a price of its own; None: those are not priced
    by_model: Mapping[str, float] = field(default_factory=dict)

    def of(self, model: str | None) -> float | None:
        """The hourly price of one accelerator of ``model`` (None: the default's)."""
        return self.by_model.get(model, self.default) if model is not None else self.default


@dataclass(frozen=True)
class Targets:
    """Each SLO's target share of good over the period (``objectives.<slo>.target`` in the spec)."""

    efficiency: float  # productive / wall ≥ this
    recovery: float  # this share of restarts back to training within ``recovery_threshold_s``
    recovery_threshold_s: float  # a bound of catalogue.RESTART_BUCKETS
    checkpoint_blocking: float  # blocking ≤ 1 − this of wall
    checkpoint_overlap: float  # background / (blocking + background) ≥ this
    price: Price | None = None  # the spec's cost section: what badput costs (None: not priced)

    @property
    def blocking_max(self) -> float:
        """The largest share of wall a save may block training for."""
        return 1.0 - self.checkpoint_blocking
