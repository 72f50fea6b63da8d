"""``View``: what every view renders, taken at one instant: the engine's snapshot and what was
counted beside it.

/metrics, OTLP, the status page and the reports each render a ``View`` and read nothing else, so
their numbers agree by construction. Two things make one: the sidecar's ``Live``
(``nvrx_slo.exporter.live``), under its lock, and the offline replay of a journal
(``nvrx_slo.exporter.offline.replay``); both through ``View.of``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nvrx_slo.contracts.schema import RejectReason
from nvrx_slo.exporter.engine.snapshot import Snapshot

UNKNOWN_ACCELERATOR = "unknown"


@dataclass(frozen=True)
class Accelerators:
    """What each rank of the pod holds: the model its cost is priced by, and how many."""

    model: str = UNKNOWN_ACCELERATOR
    per_rank: float = 1.0


@dataclass(frozen=True)
class AcceleratorsSaid:
    """What the sidecar was told its pod holds: accelerators per rank, or per pod (its containers'
    GPU resources, as ``nvrx-slo inject`` reads them from the pod template), shared by the ranks the
    pod accounts. Neither: one per rank."""

    model: str = UNKNOWN_ACCELERATOR
    per_rank: float | None = None
    per_pod: float | None = None

    def of(self, ranks: int) -> Accelerators:
        if self.per_rank is not None:
            return Accelerators(self.model, self.per_rank)
        if self.per_pod is not None and ranks > 0:
            return Accelerators(self.model, self.per_pod / ranks)
        return Accelerators(self.model)


@dataclass(frozen=True)
class View:
    snapshot: Snapshot
    rejected: Mapping[str, int]  # journal lines not accounted, by reason (``schema.RejectReason`` values)
    gpu_idle_nvml: Mapping[int, float]  # idle seconds by NVML device index; empty when NVML is off
    pod_restarts: Mapping[tuple[str, str], int]  # (container, reason) -> restarts seen by the pod watcher
    accelerators: Accelerators = field(default_factory=Accelerators)

    @classmethod
    def of(cls, snapshot: Snapshot, read_rejected: Mapping[str, int], *, engine_errors: int = 0,
           gpu_idle_nvml: Mapping[int, float] | None = None,
           pod_restarts: Mapping[tuple[str, str], int] | None = None,
           accelerators: AcceleratorsSaid | None = None) -> View:
        """``snapshot`` with the lines the reader rejected (``read_rejected``, by reason) and those
        the engine refused (its snapshot counts them) or raised on (``engine_errors``); what each of
        its ranks holds, from what the sidecar was told (``accelerators``)."""
        rejected = {**read_rejected, RejectReason.DUPLICATE.value: snapshot.duplicates,
                    RejectReason.LATE.value: snapshot.late, RejectReason.IMPLAUSIBLE.value: snapshot.implausible,
                    RejectReason.ENGINE_ERROR.value: engine_errors}
        return cls(snapshot, rejected, dict(gpu_idle_nvml or {}), dict(pod_restarts or {}),
                   (accelerators or AcceleratorsSaid()).of(snapshot.rank_count))
