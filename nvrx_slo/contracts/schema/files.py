"""Where a journal lives: one file per process in the journal directory, named for the process."""

from __future__ import annotations

JOURNAL_DIR_ENV = "NVRX_SLO_JOURNAL_DIR"
JOURNAL_SUFFIX = ".jsonl"


def journal_file_name(pod: str, rank: int | None, pid: int, generation: int = 0) -> str:
    """The file a process writes; ``generation`` > 0 names a rotated-out file."""
    role = "launcher" if rank is None else f"rank-{rank}"
    rotated = f".{generation}" if generation else ""
    return f"{pod}.{role}.{pid}{rotated}{JOURNAL_SUFFIX}"
