"""Helpers that write fixture journals for the exporter's tests: valid records and bad lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nvrx_slo.contracts import schema

BASE = {"v": 1, "job": "job-a", "pod": "pod-0", "node": "node-0", "local_rank": 0, "restart": 0, "iter": 0}


def record(type_: str, seq: int, mono: float, *, rank: int | None = 0, pid: int = 100,
           wall_offset: float = 1.7e9, **payload: Any) -> dict[str, Any]:
    """A valid v1 record (``wall`` = ``mono`` + ``wall_offset`` unless given)."""
    rec = {**BASE, "type": type_, "seq": seq, "mono": mono, "wall": payload.pop("wall", mono + wall_offset),
           "rank": rank, "local_rank": rank, "pid": pid, **payload}
    return schema.validate(rec)


def step(seq: int, mono: float, step_no: int, dur: float = 0.1, **kw: Any) -> dict[str, Any]:
    return record("step", seq, mono, step=step_no, start=mono - dur, data_s=0.0, compute_s=dur * 0.8,
                  optimizer_s=dur * 0.1, **kw)


def write(path: Path, *lines: dict[str, Any] | bytes) -> None:
    """Append records (encoded) and raw byte lines (written as given) to ``path``."""
    with open(path, "ab") as f:
        for line in lines:
            f.write(schema.encode(line) if isinstance(line, dict) else line)


def file_name(rank: int | None = 0, pid: int = 100, generation: int = 0, pod: str = "pod-0") -> str:
    return schema.journal_file_name(pod, rank, pid, generation)
