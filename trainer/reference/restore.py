"""Restore from the newest complete checkpoint, falling back past ones that fail to load.

A checkpoint is complete when DCP's ``.metadata`` exists (``checkpoint.METADATA``). A load that
fails on any rank fails on all of them (they agree by an all-reduce), so every rank falls back to
the same older checkpoint — never a crash loop on a corrupt one, never ranks resuming from
different steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from nvrx_slo import Hooks
from nvrx_slo.trainer.reference.checkpoint import METADATA

# DCP's CheckpointException derives from BaseException, not Exception.
_LOAD_ERRORS = (Exception, dcp.CheckpointException)


def complete_checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under ``root``, newest first."""
    found = []
    for path in Path(root).glob("step-*"):
        suffix = path.name.removeprefix("step-")
        if suffix.isdigit() and (path / METADATA).is_file():
            found.append((int(suffix), path))
    return sorted(found, reverse=True)


def _agree(ok: bool) -> bool:
    """True only if ``ok`` on every rank (a load that failed anywhere failed everywhere)."""
    if not dist.is_initialized():
        return ok
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def restore(hooks: Hooks, root: str | os.PathLike[str], load: Callable[[Path], None]) -> int | None:
    """Load the newest complete checkpoint with ``load(path)``; journal a ``restore`` span.

    A checkpoint that fails to load on any rank is skipped for the previous one, with a journaled
    warning; if none loads, training starts fresh. Returns the restored step, or None. Collective.
    """
    with hooks.restore() as restored:
        reasons = []
        for step, path in complete_checkpoints(root):
            try:
                load(path)
                error = None
            except _LOAD_ERRORS as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
            if _agree(error is None):
                restored.step, restored.path = step, str(path)
                break
            reasons.append(f"{path.name}: {error or 'failed on another rank'}")
            hooks.warning(f"checkpoint {path.name} could not be loaded; trying an older one", path=str(path))
        restored.fallback = "; ".join(reasons) or None
    return restored.step
