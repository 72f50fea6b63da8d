"""Bounded fuzzing (hypothesis, a few seconds) of what the sidecar reads from disk: journal lines
and its own state file. Whatever they hold, reading never raises, every line is accounted for
(accepted or rejected by reason), the state always saves again, and a state file either resumes
or means a rebuild — never a crash, a failing view or an unsavable state."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from journal_fixtures import by_file
from nvrx_slo.contracts import schema
from nvrx_slo.exporter import state_store
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live
from nvrx_slo.exporter.sidecar import Config, resume
from nvrx_slo.exporter.views.collector import SnapshotCollector
from nvrx_slo.exporter.views.exposition import TextRenderer
from sidecar_process import IDENT
from stories import crash_and_restart_records

RECORDS = crash_and_restart_records()
FILES = {name: b"".join(schema.encode(r) for r in records) for name, records in by_file(RECORDS).items()}

hostile = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([2**53, 2**53 + 1, -(2**63), 2**64 + 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e308, -1e308, 1e-308, 8000.0, -8000.0]),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=8), st.sampled_from(["\x1b[2J", "\n", "\ud7ff", "\x00"]),
    st.lists(st.integers(), max_size=2), st.recursive(st.just([]), lambda inner: st.lists(inner, max_size=1),
                                                      max_leaves=1500),
)


@st.composite
def journal_lines(draw: Any) -> bytes:
    record = dict(draw(st.sampled_from(RECORDS)))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from([*sorted(record), "extra"]))
        record[key] = draw(hostile)
    try:
        line = json.dumps(record, allow_nan=True).encode("utf-8", "surrogatepass")
    except RecursionError:
        line = b'{"v":1,"x":' + b"[" * 5000 + b"]" * 5000 + b"}"
    cut = draw(st.integers(0, 20))
    if cut == 0:
        line = line[: draw(st.integers(0, len(line)))]
    elif cut == 1:
        at = draw(st.integers(0, len(line)))
        line = line[:at] + draw(st.binary(min_size=1, max_size=4)) + line[at:]
    return line.replace(b"\n", b" ")


def render(live: Live) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(live.view, IDENT))
    return TextRenderer().generate(registry)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(journal_lines(), min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_hostile_journal_lines_never_break_reading_accounting_or_saving(lines, rnd):
    with tempfile.TemporaryDirectory() as tmp:
        journal = Path(tmp) / "journal"
        journal.mkdir()
        names = sorted(FILES)
        extra: dict[str, list[bytes]] = {}
        for line in lines:
            extra.setdefault(rnd.choice(names), []).append(line + b"\n")
        for name, body in FILES.items():
            chunks = body.splitlines(keepends=True)
            for line in extra.get(name, []):
                chunks.insert(rnd.randrange(len(chunks) + 1), line)
            (journal / name).write_bytes(b"".join(chunks))
        live = Live(Engine(), JournalTail(journal))
        live.poll()
        view = live.view()
        assert render(live)
        written = sum(1 for body in (journal / n for n in names) for ln in body.read_bytes().split(b"\n") if ln)
        # a late record is accepted (counted) and then left out of the accounting (counted again as late)
        assert view.snapshot.events_accepted + sum(view.rejected.values()) - view.rejected["late"] == written
        state = Path(tmp) / "state.json"
        state_store.save(state, journal, live.to_state())  # never raises for what was accepted
        resumed = resume(Config(journal_dir=journal, state_file=state), lambda: Live(Engine(), JournalTail(journal)))
        assert resumed.view().snapshot.events_accepted == view.snapshot.events_accepted


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))] or [path]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))] or [path]
    return [path]


def _saved_state(tmp: str) -> tuple[Path, Path, dict]:
    """A journal of ``FILES`` in ``tmp`` and the state a sidecar saves for it: (journal, state file, state)."""
    journal = Path(tmp) / "journal"
    journal.mkdir()
    for name, body in FILES.items():
        (journal / name).write_bytes(body)
    state = Path(tmp) / "state.json"
    live = Live(Engine(), JournalTail(journal))
    live.poll()
    state_store.save(state, journal, live.to_state())
    return journal, state, orjson.loads(state.read_bytes())


def _set(document: Any, path: tuple, value: Any) -> None:
    """Set the leaf at ``path`` (keys and indexes) of ``document`` to ``value``."""
    for key in path[:-1]:
        document = document[key]
    document[path[-1]] = value


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_hostile_state_files_resume_or_rebuild_never_crash(data):
    with tempfile.TemporaryDirectory() as tmp:
        journal, state, saved = _saved_state(tmp)
        for _ in range(data.draw(st.integers(1, 3))):
            path = data.draw(st.sampled_from(_leaves(saved)))
            if not path:
                break
            _set(saved, path, data.draw(hostile))
        try:
            body = json.dumps(saved, allow_nan=True).encode("utf-8", "surrogatepass")
        except RecursionError:
            body = b"[" * 100_000
        if data.draw(st.booleans()):
            body = body[: data.draw(st.integers(0, len(body)))]
        state.write_bytes(body)
        live = resume(Config(journal_dir=journal, state_file=state), lambda: Live(Engine(), JournalTail(journal)))
        live.poll()
        assert render(live)
        state_store.save(state, journal, live.to_state())


WRONG = ("x", None, True, 0.5, [], {})  # one value of each JSON type (an int is everywhere valid somewhere)


def _shapes(saved: Any) -> list[tuple]:
    """One leaf per place in the state's shape: list items past the first are the same field again."""
    seen: dict[tuple, tuple] = {}
    for path in _leaves(saved):
        seen.setdefault(tuple("*" if isinstance(k, int) else k for k in path), path)
    return list(seen.values())


@pytest.mark.slow  # ~30 s: 265 fields x 6 types, each a resume, a poll, a render and a save
def test_every_state_field_with_every_wrong_type_resumes_or_rebuilds():
    """Exhaustive where the property test samples: each field of a real state file, in turn, set to
    each JSON type. Every combination must resume or rebuild, then render and save."""
    with tempfile.TemporaryDirectory() as tmp:
        journal, state, saved = _saved_state(tmp)
        failures = []
        for path in _shapes(saved):
            for wrong in WRONG:
                edited = json.loads(json.dumps(saved))
                if path:
                    _set(edited, path, wrong)
                state.write_bytes(json.dumps(edited).encode())
                try:
                    live = resume(Config(journal_dir=journal, state_file=state),
                                  lambda: Live(Engine(), JournalTail(journal)))
                    try:
                        live.poll()
                        render(live)
                        state_store.save(state, journal, live.to_state())
                    finally:
                        live.tail.close()
                except Exception as exc:  # collected: one run names every hole
                    failures.append(f"{path} = {wrong!r}: {type(exc).__name__}: {exc}")
        assert not failures, "\n".join(failures[:40]) + f"\n({len(failures)} in all)"
