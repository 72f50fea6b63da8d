"""A rejected record has no effect at all, and a forged flood cannot stretch the job (issue 25).

Ground truth is the same journal without the records the sidecar refused: every series of the
exposition (the rejection counts aside) must be the same, whatever the refused records claim and
wherever they lie. Records the engine accepts are kept in that reference, at the same place: a
record that claims another's (pid, seq) or a time the reader's merge order depends on is part of
the input, and only the refused ones must vanish without a trace.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from journal_fixtures import by_file
from nvrx_slo.contracts import schema
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.events import Event
from nvrx_slo.exporter.ingest.decode import decode
from nvrx_slo.exporter.ingest.tail import ROUND_BYTES, JournalTail
from nvrx_slo.exporter.live import Live
from nvrx_slo.exporter.offline import report
from nvrx_slo.exporter.views.collector import SnapshotCollector
from nvrx_slo.exporter.views.exposition import TextRenderer
from sidecar_process import IDENT
from stories import crash_and_restart_records

NOW = 100.0  # the sidecar's monotonic clock: the story's records lie before it
FINISHED = crash_and_restart_records()
RUNNING = [r for r in FINISHED if r["mono"] < 30]  # cut mid-run: wall counts to NOW
REJECTED_COUNTS = "nvrx_exporter_rejected_events_total"


def _key(event: Event) -> bytes:
    return msgspec.json.encode(event)


class _Watched(Engine):
    """Notes which events it accepted (by content), to tell the refused forgeries from the others."""

    def __init__(self) -> None:
        super().__init__()
        self.accepted: list[bytes] = []

    def ingest(self, record: Event, not_after: float = float("inf")) -> bool:
        took = super().ingest(record, not_after)
        if took:
            self.accepted.append(_key(record))
        return took


def _exposition(journal: Path, round_bytes: int) -> tuple[list[str], list[bytes]]:
    """Every line of /metrics but the rejection counts, and the events the engine accepted."""
    engine = _Watched()
    live = Live(engine, JournalTail(journal, round_bytes=round_bytes), mono=lambda: NOW, wall=lambda: NOW + 1.7e9)
    live.poll()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(live.view, IDENT))
    text = TextRenderer().generate(registry).decode()
    return [line for line in text.splitlines() if not line.startswith(REJECTED_COUNTS)], engine.accepted


def _write(directory: Path, records: list[dict[str, Any]], inserted: list[tuple[bytes, str, float]]) -> None:
    """The journal of ``records``, with each inserted line put at its fraction of its file (a file
    of its own where its name is none of the journal's)."""
    directory.mkdir()
    files = by_file(records)
    for name, recs in {**{target: [] for _, target, _ in inserted}, **files}.items():
        lines = [schema.encode(r) for r in recs]
        for line, target, where in inserted:
            if target == name:
                lines.insert(int(where * len(lines)), line + b"\n")
        (directory / name).write_bytes(b"".join(lines))


NUMBERS = st.one_of(st.sampled_from([1e300, -1e300, 2**53 + 1, 1e15, -1e15, 8000.0, -8000.0, 0.0, -1.0, 650.0,
                                     599.0, 50.0, 20.0]), st.floats(-1e4, 1e4))
INTS = ("seq", "pid", "rank", "local_rank", "restart", "iter", "step", "world_size", "local_world_size",
        "worker_pid", "code", "max_restarts", "bytes")
FIELDS = ("mono", "start", "written", "data_s", "compute_s", "plan_s", "stage_s", *INTS)
PAYLOAD = dict(world_size=2, step=5, data_s=0.0, compute_s=0.0, optimizer_s=0.0, code=0, max_restarts=3, path=None,
               fallback=None, ckpt="step-000020", ok=True, error=None, worker_pid=101, mode="async", plan_s=0.0,
               stage_s=0.0, bytes=10, kind="crash", message="m", cause=None, alive=True, name="eval", value=1.0)


@st.composite
def forgeries(draw: Any, records: list[dict[str, Any]]) -> bytes:
    """A record of the journal with one to three fields changed (its type too, sometimes)."""
    record = dict(draw(st.sampled_from(records)))
    if draw(st.booleans()):
        record["type"] = draw(st.sampled_from([t.value for t in schema.EventType]))
        record = {**PAYLOAD, "start": record["mono"] - 0.1, "written": record["mono"], **record}
    for _ in range(draw(st.integers(1, 3))):
        field, value = draw(st.sampled_from(FIELDS)), draw(NUMBERS)
        record[field] = min(int(value), 2**64) if field in INTS and abs(value) < 1e300 else value
    return json.dumps(record).encode()


def _identity(line: bytes) -> tuple[bytes, tuple[int, int, float] | None]:
    try:
        event = decode(line)
    except schema.JournalError:
        return line, None
    return _key(event), (event.pid, event.seq, event.mono)


def distinct(records: list[dict[str, Any]], inserted: list[tuple[bytes, str, float]]) -> bool:
    """Whether the inserted lines are distinct records: two records with one (pid, seq, mono) are
    one record twice, and which copy is kept is the input's order, not a refusal."""
    real = {(r["pid"], r["seq"], r["mono"]) for r in records}
    identities = [_identity(line) for line, _, _ in inserted]
    return (len({key for key, _ in identities}) == len(identities)
            and not any(ident in real for _, ident in identities))


def refused_leave_no_trace(records: list[dict[str, Any]], inserted: list[tuple[bytes, str, float]],
                           round_bytes: int) -> tuple[bool, list[tuple[str, str]]]:
    """(whether every inserted line was refused, the exposition lines that differ from the
    journal's without the refused ones: reference, with them)."""
    with tempfile.TemporaryDirectory() as tmp:
        _write(Path(tmp) / "dirty", records, inserted)
        dirty, accepted = _exposition(Path(tmp) / "dirty", round_bytes)
        kept = [item for item in inserted if _identity(item[0])[0] in accepted]
        _write(Path(tmp) / "reference", records, kept)
        reference, _ = _exposition(Path(tmp) / "reference", round_bytes)
    return not kept, [(a, b) for a, b in zip(reference, dirty, strict=True) if a != b]


PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@PROPERTY
@given(st.data(), st.sampled_from([FINISHED, RUNNING]))
def test_the_journal_without_its_refused_records_renders_the_same_exposition(data, records):
    """One poll reads the whole journal (the live case): refused records of any kind, anywhere."""
    names = sorted(by_file(records))
    inserted = data.draw(st.lists(st.tuples(forgeries(records), st.sampled_from(names), st.floats(0, 1)),
                                  min_size=1, max_size=3))
    assume(distinct(records, inserted))
    _, differ = refused_leave_no_trace(records, inserted, ROUND_BYTES)
    assert differ == []


@PROPERTY
@given(st.data(), st.sampled_from([FINISHED, RUNNING]))
def test_refused_records_do_not_reorder_a_backlog_read_in_rounds(data, records):
    """A backlog read a few KB per file per round, merged by time across files: a refused
    record's time must not hold its file's later lines back (they would arrive late)."""
    names = sorted(by_file(records))
    inserted = data.draw(st.lists(st.tuples(forgeries(records), st.sampled_from(names), st.floats(0, 1)),
                                  min_size=1, max_size=3))
    assume(distinct(records, inserted))
    all_refused, differ = refused_leave_no_trace(records, inserted, 2048)
    assume(all_refused)  # an accepted forgery's place in the merge depends on where the rounds end
    assert differ == []


def _name(records: list[dict[str, Any]], pid: int) -> str:
    return next(n for n in by_file(records) if n.split(".")[-2] == str(pid))


def test_a_forged_future_record_in_a_rank_file_no_longer_makes_its_process_late():
    """Found by the property above on main f824713: a launcher record claiming the launcher's seq 0
    650 s later, put first in rank 0's file, was refused (a duplicate) but moved that file's merge
    key: rank 0's first process was handed on after its restart's and its records were late."""
    rank0 = next(r for r in FINISHED if r["rank"] == 0)
    launcher = next(r for r in FINISHED if r["type"] == "launcher_start")
    inserted = [(json.dumps({**launcher, "mono": 650.0}).encode(), _name(FINISHED, rank0["pid"]), 0.0)]
    assert distinct(FINISHED, inserted)
    assert refused_leave_no_trace(FINISHED, inserted, ROUND_BYTES) == (True, [])


def test_a_forged_future_record_claiming_its_writers_first_seq_no_longer_holds_its_file_back():
    """Found by the backlog property above on main 136d642: rank 0's process_start copied 650 s
    later, put first in its own file and read in rounds. It was refused (a duplicate of the real
    seq 0) but set the file's merge time: every later line of the file waited for 650 s, behind
    every other file, and the accounting changed (24 series, productive 2.25 s against 9.0)."""
    first = next(r for r in FINISHED if r["type"] == "process_start" and r["rank"] == 0)
    inserted = [(json.dumps({**first, "mono": 650.0}).encode(), _name(FINISHED, first["pid"]), 0.0)]
    assert distinct(FINISHED, inserted)
    for records in (FINISHED, RUNNING):
        assert refused_leave_no_trace(records, inserted, 2048) == (True, [])


END_TYPES = ("process_end", "launcher_exit", "launcher_worker_exit", "step_failed", "step", "checkpoint_end")


def test_a_far_future_end_of_any_type_moves_no_series_at_the_end_of_a_job_too():
    """A process_end dated 1e300 (out of range) moved a finished demo's wall from 57.6 to 4,495
    rank-s at b0d0197 in a run of the hostile-input checks (not reproduced since): whether it is
    refused by the reader (out of range) or by the engine (a schema-valid instant far ahead of the
    clock), a forged record that would end a process or the job leaves every series as it was, in
    the newest rank file, after the last record, or in a file of its own."""
    rank0 = [r for r in FINISHED if r["rank"] == 0]
    newest = max(rank0, key=lambda r: r["mono"])
    for records in (FINISHED, RUNNING):
        for kind in END_TYPES:
            for mono in (1e300, NOW + 1e6):
                forged = {**PAYLOAD, **newest, "type": kind, "seq": newest["seq"] + 1, "mono": mono,
                          "start": mono - 0.1, "written": mono, "worker_pid": newest["pid"]}
                line = json.dumps(forged).encode()
                alone = json.dumps({**forged, "pid": 9999, "seq": 0}).encode()
                for inserted in ([(line, _name(records, newest["pid"]), 1.0)],
                                 [(alone, schema.journal_file_name("pod-0", 0, 9999), 0.0)]):
                    assert refused_leave_no_trace(records, inserted, ROUND_BYTES) == (True, []), (kind, mono)


def test_the_report_dates_a_running_journal_by_its_accepted_records():
    """The offline report took "now" from every record it read: one refused as implausible (a step
    ending before it starts, a million seconds ahead) made a running job's wall a million seconds."""
    step = next(r for r in RUNNING if r["type"] == "step")
    forged = json.dumps({**step, "seq": 10**6, "mono": 1e6, "start": 1e6 + 1}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        _write(Path(tmp) / "clean", RUNNING, [])
        _write(Path(tmp) / "dirty", RUNNING, [(forged, _name(RUNNING, step["pid"]), 0.5)])
        clean, dirty = (report._read(Path(tmp) / name) for name in ("clean", "dirty"))
    assert dirty.rejected == {} and dirty.snap.implausible == 1
    assert [r.wall_s for r in dirty.snap.ranks] == [r.wall_s for r in clean.snap.ranks]
    assert dirty.snap.now_mono == clean.snap.now_mono


# --- item 7: a flood of records of a real process -----------------------------------------------

def _flood(pid_records: list[dict[str, Any]], count: int, monos: list[float]) -> list[bytes]:
    """``count`` copies of the process's first step with seqs far past the dedupe window, at ``monos``."""
    step = next(r for r in pid_records if r["type"] == "step")
    return [schema.encode({**step, "seq": 10**6 + i, "mono": m, "start": m - 0.5})[:-1]
            for i, m in zip(range(count), monos, strict=True)]


def _accounted(journal: Path) -> tuple[float, float, bool]:
    live = Live(Engine(), JournalTail(journal), mono=lambda: NOW, wall=lambda: NOW + 1.7e9)
    live.poll()
    snap = live.view().snapshot
    wall = sum(r.wall_s for r in snap.ranks)
    return wall, sum(r.seconds["productive"] for r in snap.ranks) / wall, snap.finished


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(where=st.sampled_from([0.0, 0.5, 1.0]), spread=st.sampled_from(["one instant", "after its end", "its life",
                                                                       "to the future", "before its start"]))
def test_a_flood_past_the_dedupe_window_cannot_stretch_the_job_beyond_its_processes_lives(where, spread):
    """1,100 records of rank 0's restarted process with seqs past the 1,024-seq window took the
    finished job's wall from 59.3 rank-s to 200-2,352 and its efficiency from 30.4% to 0.8-9.0% on
    main f824713 (the dedupe floor jumped past the process's real seqs: its later records, its end
    included, became "duplicates"; records 1 s earlier each walked its start back). Records dated
    after a process ended, or more than a reorder window before its first record, are refused;
    the ones within its life are accepted, and the job's wall stays its processes' span."""
    pid = next(r["pid"] for r in FINISHED if r["rank"] == 0 and r["restart"] == 1)
    mine = [r for r in FINISHED if r["pid"] == pid]
    begin, end = mine[0]["mono"], mine[-1]["mono"]
    count = 1100
    monos = {"one instant": [begin + 1.0] * count,
             "after its end": [end + 1 + 0.5 * i for i in range(count)],
             "its life": [begin + (end - begin) * i / count for i in range(count)],
             "to the future": [begin + (NOW + 500 - begin) * i / count for i in range(count)],
             "before its start": [begin + 5 - i for i in range(count)]}[spread]
    with tempfile.TemporaryDirectory() as tmp:
        _write(Path(tmp) / "clean", FINISHED, [])
        _write(Path(tmp) / "dirty", FINISHED, [(line, _name(FINISHED, pid), where)
                                               for line in _flood(mine, count, monos)])
        clean_wall, clean_efficiency, _ = _accounted(Path(tmp) / "clean")
        wall, efficiency, finished = _accounted(Path(tmp) / "dirty")
    assert finished
    assert wall == clean_wall  # the job's span: its first record to its processes' last end
    if spread in ("after its end", "one instant"):  # refused, or one instant of work claimed
        assert efficiency >= clean_efficiency - 1e-9
