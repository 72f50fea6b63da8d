"""Helpers that write fixture journals for the exporter's tests: valid records, bad lines, stories on disk."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from journal_builder import Pod
from nvrx_slo.contracts import schema
from stories import EVIL, crash_and_restart_records

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


def write_per_process(records: Iterable[dict[str, Any]], directory: Path, pod: str) -> None:
    """``records`` as the writer leaves them: one file per process, named for ``pod``, in seq order."""
    files: dict[tuple[int | None, int], list[bytes]] = {}
    for rec in sorted(records, key=lambda r: (r["pid"], r["seq"])):
        files.setdefault((rec["rank"], rec["pid"]), []).append(schema.encode(rec))
    for (rank, pid), lines in files.items():
        (directory / schema.journal_file_name(pod, rank, pid)).write_bytes(b"".join(lines))


def _hostile(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` with every journal string a page shows made hostile."""
    rec = {**rec, "job": EVIL, "pod": EVIL, "node": EVIL}
    if "ckpt" in rec:
        rec["ckpt"] = EVIL + rec["ckpt"]
    if rec["type"] == "checkpoint_start":
        rec["mode"] = EVIL
    return rec


def ended_a_second_ago(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with their monotonic instants moved so that the newest lies a second before now
    on this machine's clock: a story for a live sidecar, which refuses records from its future
    (more than ``live.FUTURE_SLACK_S`` ahead), so that no test depends on how long the machine has
    been up (stories are stamped from 0 or 1000 s, a fresh CI machine's clock may be lower)."""
    shift = time.monotonic() - 1.0 - max(r["mono"] for r in records)
    return [{k: v + shift if k in ("mono", "start", "written") else v for k, v in r.items()} for r in records]


def write_journal(pod: Pod, directory: Path, evil: bool = True, *, live: bool = False) -> dict[str, int]:
    """Write ``pod``'s records as the writer would (one file per process), with every journal
    string made hostile when ``evil``; returns what the story holds, counted from the records.
    ``live``: for a sidecar on this machine's clock (``ended_a_second_ago``)."""
    directory.mkdir(parents=True, exist_ok=True)
    records = ended_a_second_ago(pod.records) if live else pod.records
    write_per_process((_hostile(r) if evil else r for r in records), directory, "pod-0")
    return {
        "ranks": len({r["rank"] for r in pod.records if r["rank"] is not None}),
        "checkpoints": len({(r["ckpt"], r["restart"],
                             r["iter"]) for r in pod.records if r["type"] == "checkpoint_start"}),
        "restarts": len({(r["restart"], r["iter"]) for r in pod.records if r["rank"] is not None}) - 1,
    }


def split_by_rank(pod: Pod, directory: Path) -> list[Path]:
    """``pod``'s journal as a job of one pod per rank: each rank's records, and a copy of the
    launcher's, in a directory of its own, with the pod's name in every record."""
    dirs = []
    for rank in sorted({r["rank"] for r in pod.records if r["rank"] is not None}):
        name = f"pod-{rank}"
        d = directory / name
        d.mkdir(parents=True)
        write_per_process(({**r, "pod": name} for r in pod.records if r["rank"] in (rank, None)), d, name)
        dirs.append(d)
    return dirs


def by_file(records: list[dict]) -> dict[str, list[dict]]:
    """``records`` grouped by the journal file their writer would put them in, in their order."""
    files: dict[str, list[dict]] = {}
    for r in records:
        files.setdefault(schema.journal_file_name(r["pod"], r["rank"], r["pid"]), []).append(r)
    return files


def write_clean(directory: Path) -> None:
    """``stories.crash_and_restart_records`` as pod-0's journal, undamaged."""
    directory.mkdir()
    write_per_process(crash_and_restart_records(), directory, "pod-0")


def make_unreadable(path: Path) -> None:
    """A journal file this process cannot read, root or not."""
    if os.geteuid() != 0:
        path.write_bytes(b"{}\n")
        path.chmod(0)
        return
    target = Path("/sys/bus/pci/rescan")  # write-only sysfs attribute: EACCES even for root
    if not target.exists():
        pytest.skip("needs /sys/bus/pci/rescan (a file root cannot read) or a non-root user")
    path.symlink_to(target)
