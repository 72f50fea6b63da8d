"""What a journal itself says happened, read apart from the exporter: the tests' truth.

``read_journal`` reads every valid record (by the schema's own validator, not the sidecar's reader);
``summarize`` says what they record — steps, each checkpoint's blocking and background seconds, each
restart and its latency — computed with none of the engine's code, so a test can hold the engine's
numbers against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nvrx_slo.contracts import schema
from nvrx_slo.contracts.schema import EventType


def read_journal(*journal_dirs: Path) -> list[dict[str, Any]]:
    """Every valid record of every process, in time order (invalid lines are skipped)."""
    records = []
    for path in sorted(p for d in journal_dirs for p in Path(d).glob(f"*{schema.JOURNAL_SUFFIX}")):
        for line in path.read_bytes().splitlines():
            try:
                records.append(schema.decode(line))
            except schema.JournalError:
                continue
    return sorted(records, key=lambda r: r["mono"])


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What happened, read back from the journal (job level: the slowest rank decides)."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_type.setdefault(r["type"], []).append(r)
    steps = by_type.get(EventType.STEP.value, [])
    checkpoints: dict[str, dict[str, Any]] = {}
    faults = [r["mono"] for r in by_type.get(EventType.FAULT_INJECTED.value, [])]
    keys: dict[tuple[int, int, str], str] = {}  # (pid, iter, ckpt) -> the save it is part of
    for r in records:
        if r["type"] in schema.CHECKPOINT_EVENTS:
            # a checkpoint id can recur after a rollback: a save is also keyed by the faults before
            # its start (ranks in other pods count restarts differently)
            key = keys.setdefault((r["pid"], r["iter"], r["ckpt"]),
                                  f"{r['ckpt']} after {sum(1 for f in faults if f < r['mono'])} faults")
            c = checkpoints.setdefault(key, {"blocking": {}, "background": {}, "ok": None})
            rank = r["rank"]
            if r["type"] == EventType.CHECKPOINT_START.value:
                c.setdefault("start", {})[rank] = r["mono"]
            elif r["type"] == EventType.CHECKPOINT_SCHEDULED.value:
                c["scheduled"] = {**c.get("scheduled", {}), rank: r["mono"]}
                c["blocking"][rank] = r["mono"] - c.get("start", {}).get(rank, r["mono"])
            elif r["type"] == EventType.CHECKPOINT_FINALIZE.value:
                c["blocking"][rank] = c["blocking"].get(rank, 0.0) + r["mono"] - r["start"]
            elif r["type"] == EventType.CHECKPOINT_END.value:
                c["blocking"][rank] = c["blocking"].get(rank, 0.0) + (r.get("waited_s") or 0.0)
                c["background"][rank] = r["written"] - c.get("scheduled", {}).get(rank, r["written"])
                c["ok"] = r["ok"] if c["ok"] is None else (c["ok"] and r["ok"])
    restarts = []
    for fault in by_type.get(EventType.FAULT_INJECTED.value, []):
        # the loops running at the fault (a process and its Wrapper iteration), in every pod
        running = {(s["pid"], s["iter"]) for s in steps if s["start"] <= fault["mono"]}
        after = sorted((s for s in steps if s["start"] > fault["mono"] and (s["pid"], s["iter"]) not in running),
                       key=lambda s: s["start"])
        firsts: dict[Any, dict[str, Any]] = {}
        for s in after:  # each rank's first step of the restarted loop; the last of them ends the restart
            firsts.setdefault(s["rank"], s)
        resumed = max(firsts.values(), key=lambda s: s["start"]) if firsts else None
        # in-process if every rank came back in a process that was stepping before the fault
        pids = {pid for pid, _ in running}
        level = "in-process" if firsts and all(s["pid"] in pids for s in firsts.values()) else "in-job"
        restores = [r for r in by_type.get(EventType.RESTORE.value, []) if r["mono"] > fault["mono"]]
        restarts.append({"kind": fault["kind"], "step": fault["step"], "level": level,
                         "latency": None if resumed is None else resumed["start"] - fault["mono"],
                         "resumed_from": restores[0]["step"] if restores else None})
    runs_per_rank: dict[Any, int] = {}
    for s in steps:
        runs_per_rank[s["rank"]] = runs_per_rank.get(s["rank"], 0) + 1
    return {
        "steps": len({s["step"] for s in steps}),
        "step_runs": max(runs_per_rank.values(), default=0),
        "last_step": max((s["step"] for s in steps), default=None),
        "checkpoints": [{"id": key.split()[0], "ok": c["ok"],
                         "blocking_s": max(c["blocking"].values(), default=0.0),
                         "background_s": max(c["background"].values(), default=0.0)}
                        for key, c in checkpoints.items()],
        "restarts": restarts,
    }
