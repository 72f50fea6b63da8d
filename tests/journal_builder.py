"""Hand-built journals for engine tests: a pod's processes writing schema-valid records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nvrx_slo.contracts.schema import SCHEMA_VERSION, validate

WALL_OFFSET = 1.7e9  # wall = mono + offset unless a test jumps the wall clock


@dataclass
class Proc:
    """One process (a rank incarnation or the launcher): stamps common fields and its own seq."""

    pod: Pod
    rank: int | None
    pid: int
    restart: int = 0
    iter: int = 0
    seq: int = 0

    def ev(self, event_type: str, mono: float, /, **payload: Any) -> dict[str, Any]:
        record = {"v": SCHEMA_VERSION, "type": event_type, "seq": self.seq, "mono": mono,
                  "wall": mono + self.pod.wall_offset, "job": "job", "pod": "pod-0", "node": "node-0",
                  "rank": self.rank, "local_rank": self.rank, "pid": self.pid, "restart": self.restart,
                  "iter": self.iter, **payload}
        self.seq += 1
        self.pod.records.append(validate(record))
        return record

    # the common events, with the payloads the schema requires
    def start(self, mono: float, world_size: int = 2, local_world_size: int | None = None) -> None:
        self.ev("process_start", mono, world_size=world_size, local_world_size=local_world_size)

    def end(self, mono: float) -> None:
        self.ev("process_end", mono)

    def step(self, step: int, start: float, end: float, data_s: float = 0.0) -> None:
        self.ev("step", end, step=step, start=start, data_s=data_s, compute_s=(end - start - data_s) * 0.8,
                optimizer_s=(end - start - data_s) * 0.1)

    def save(self, step: int, start: float, scheduled: float, written: float, observed: float,
             ok: bool = True, nbytes: int = 1000, mode: str = "async") -> None:
        """checkpoint_start/scheduled now; the end is written later with ``save_end``."""
        ckpt = f"step-{step:06d}"
        self.ev("checkpoint_start", start, ckpt=ckpt, step=step, mode=mode)
        self.ev("checkpoint_scheduled", scheduled, ckpt=ckpt, plan_s=0.0, stage_s=scheduled - start, bytes=nbytes)
        self._end = (ckpt, step, ok, written, observed)

    def save_end(self) -> None:
        ckpt, step, ok, written, observed = self._end
        self.ev("checkpoint_end", observed, ckpt=ckpt, step=step, ok=ok, written=written,
                error=None if ok else "OSError: disk full")

    def restore(self, step: int | None, start: float, end: float) -> None:
        self.ev("restore", end, start=start, step=step, path=None if step is None else f"/ckpt/step-{step:06d}",
                fallback=None)


@dataclass
class Pod:
    records: list[dict[str, Any]] = field(default_factory=list)
    wall_offset: float = WALL_OFFSET
    _next_pid: int = 100

    def proc(self, rank: int | None, restart: int = 0, iter: int = 0) -> Proc:
        self._next_pid += 1
        return Proc(self, rank, self._next_pid, restart, iter)

    def launcher(self, mono: float) -> Proc:
        launcher = self.proc(None)
        launcher.ev("launcher_start", mono, max_restarts=3)
        return launcher
