"""The sidecar's persisted state: engine state and read offsets, in one file, replaced atomically.

Why one file: offsets and the engine state that already holds the lines before them must be
saved together, or a restart either re-counts lines (offsets older than the state) or forgets
them (offsets newer). The file is written to a temporary name, fsynced and renamed over the old
one (then the directory is fsynced), so a SIGKILL at any instant leaves the old or the new state,
never a torn one; the temporary file such a kill leaves is removed at the next ``load``.

``load`` returns ``None`` when there is nothing usable — no file, another format, another
journal directory, or a corrupt file (logged) — and the sidecar then rebuilds from the journal
from offset 0, which counts nothing twice because it starts from an empty engine. A file is not
trusted because it parses: a number no state of ours can hold (past ``MAX_STATE_NUMBER``, or not
finite: the journal's numbers are bounded by ``schema.MAX_NUMBER``) makes it corrupt too, and
the loaders of its parts check their shapes.

``save`` raises only ``OSError`` (the disk) and ``ValueError`` (a state that cannot be written as
JSON — never for records the reader accepted, whose numbers are bounded); the sidecar logs
either and goes on with the last good file in place.
"""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("nvrx_slo.state")

FORMAT = 1
MAX_STATE_NUMBER = 2**62  # far above any count or sum of bounded journal numbers, inside int64


def _bounded(value: Any) -> bool:
    """Every number in ``value`` (nested lists and dicts) is finite and within ±MAX_STATE_NUMBER."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, (int, float)) and not -MAX_STATE_NUMBER <= item <= MAX_STATE_NUMBER:
            return False  # NaN fails both comparisons
    return True


def save(path: str | os.PathLike[str], journal_dir: str | os.PathLike[str], parts: dict[str, Any], *,
         dry_run: bool = False) -> None:
    """Atomically replace ``path`` with ``parts`` (JSON-able), tagged with the journal directory.
    ``dry_run``: only check that ``parts`` can be saved (``ValueError`` if not); write nothing."""
    path = Path(path)
    try:
        body = orjson.dumps({"format": FORMAT, "journal_dir": str(Path(journal_dir).resolve()), **parts})
    except orjson.JSONEncodeError as exc:  # e.g. an integer past 64 bits
        raise ValueError(f"state not writable as JSON: {exc}") from None
    if dry_run:
        return
    tmp = path.with_name(f".{path.name}.tmp")  # one name: a save killed midway leaves one file, overwritten next
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_stale_temps(path: str | os.PathLike[str]) -> None:
    """Delete temporary files that saves killed midway left beside ``path`` (``.<name>.tmp``, and
    ``.<name>.<pid>.tmp`` as earlier versions named them, one per killed process)."""
    path = Path(path)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*tmp"):
        if stale.name == f".{path.name}.tmp" or stale.name[len(path.name) + 2:-4].isdigit():
            try:
                stale.unlink()
            except OSError as exc:
                log.warning("cannot remove stale temporary state file %s: %s", stale, exc)


def load(path: str | os.PathLike[str], journal_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The parts saved for ``journal_dir``, or ``None`` when there is no usable state (see module doc).
    Removes the temporary files of saves killed midway first."""
    path = Path(path)
    remove_stale_temps(path)
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        log.error("state file %s unusable (%s): rebuilding from the journal", path, exc)
        return None
    if not _bounded(data):
        log.error("state file %s holds a number out of range: rebuilding from the journal", path)
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        log.error("state file %s has an unknown format: rebuilding from the journal", path)
        return None
    if data.get("journal_dir") != str(Path(journal_dir).resolve()):
        log.warning("state file %s belongs to journal %s, not %s: rebuilding from the journal",
                    path, data.get("journal_dir"), journal_dir)
        return None
    return {k: v for k, v in data.items() if k not in ("format", "journal_dir")}
