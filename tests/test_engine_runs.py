"""``Engine.ingest_many`` accounts runs of plain steps and saves together (``exporter/engine/runs.py``): it
must leave exactly the state, snapshot and history that ``ingest`` one record at a time leaves, to
the bit, whatever the journal and however it is cut into batches."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import stories
from bench import synthetic_journal
from journal_builder import Pod
from nvrx_slo.contracts.schema import CheckpointPart
from nvrx_slo.exporter.engine import runs
from nvrx_slo.exporter.engine.engine import Engine, IngestFailed
from nvrx_slo.exporter.events import Event, as_event
from nvrx_slo.exporter.ingest.decode import decode_batch
from nvrx_slo.exporter.ingest.tail import JournalTail
from test_engine_properties import SETTINGS, journals


def _one_by_one(events: list[Event], keep_history: bool, not_after: float, window: float = 10.0) -> Engine:
    engine = Engine(window, keep_history=keep_history)
    for event in events:
        engine.ingest(event, not_after)
    return engine


def _in_batches(events: list[Event], keep_history: bool, not_after: float, cuts: list[int],
                window: float = 10.0) -> Engine:
    engine = Engine(window, keep_history=keep_history)
    for lo, hi in zip([0, *cuts], [*cuts, len(events)], strict=True):
        engine.ingest_many(events[lo:hi], not_after)
    return engine


def _same(a: Engine, b: Engine) -> None:
    """Both engines hold the same, and show the same (a snapshot may settle: compare each once)."""
    assert json.dumps(a.to_state(), sort_keys=True) == json.dumps(b.to_state(), sort_keys=True)
    assert a.snapshot(10_000.0, 2e9) == b.snapshot(10_000.0, 2e9)
    if a.keep_history:
        assert a.take_decisions() == b.take_decisions()
        assert a.history() == b.history()


def _merged(pod: Pod, rng: random.Random) -> list[Event]:
    """The pod's records merged by time as the reader hands them on, a few nudged out of order."""
    events = sorted((as_event(r) for r in pod.records), key=lambda e: (e.mono, e.pid, e.seq))
    for _ in range(len(events) // 20):
        i = rng.randrange(len(events) - 1)
        events[i], events[i + 1] = events[i + 1], events[i]
    return events


@given(journals(), st.integers(0, 2**32), st.booleans())
@SETTINGS
def test_batches_of_any_cut_account_as_record_by_record(pod: Pod, seed: int, keep_history: bool) -> None:
    rng = random.Random(seed)
    events = _merged(pod, rng)
    not_after = rng.choice([float("inf"), max(e.mono for e in events) - rng.uniform(0, 5)])
    cuts = sorted(rng.sample(range(1, len(events)), min(len(events) - 1, rng.randrange(0, 6))))
    window = rng.choice([0.0, 0.3, 1.0, 3.0, 10.0])  # short ones: the random journals are short
    _same(_one_by_one(events, keep_history, not_after, window),
          _in_batches(events, keep_history, not_after, cuts, window))


STORIES = [stories.healthy, stories.crash_with_rollback, stories.inprocess_restart, stories.failed_save,
           stories.pod_restart, stories.killed_from_outside, stories.survivor_of_another_pods_fault,
           stories.inprocess_job]


@pytest.mark.parametrize("story", STORIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("window", [0.0, 1.0, 10.0])
def test_every_story_accounts_the_same_in_batches(story: Any, window: float) -> None:
    events = sorted((as_event(r) for r in story().records), key=lambda e: (e.mono, e.pid, e.seq))
    for keep_history in (False, True):
        for cuts in ([], [len(events) // 2], list(range(7, len(events), 7))):
            _same(_one_by_one(events, keep_history, float("inf"), window),
                  _in_batches(events, keep_history, float("inf"), cuts, window))


def _synthetic(tmp_path: Path, ranks: int, steps: int) -> list[Event]:
    synthetic_journal.write(tmp_path, ranks, steps, restart_at=steps // 2)
    lines = [line for path in sorted(tmp_path.glob("*.jsonl")) for line in path.read_bytes().splitlines()]
    events: list[Any] = list(decode_batch(lines))
    return sorted(events, key=lambda e: (e.mono, e.pid, e.seq))


@pytest.mark.parametrize("window", [0.0, 10.0])
@pytest.mark.parametrize("ranks", [1, 4])
def test_a_long_journal_is_mostly_runs_and_accounts_the_same(tmp_path: Path, ranks: int, window: float) -> None:
    events = _synthetic(tmp_path, ranks, 1200)
    in_runs = parts = folds = i = 0
    engine = Engine(window)

    def fold() -> None:
        nonlocal folds
        folds += 1
        engine._fold_checkpoints()

    while i < len(events):  # how much of it the runs take, saves included: the point of them
        found = runs.scan(engine._s, events, i, float("inf"))
        end = found.end
        if end > i:
            runs.account(engine._s, events, i, found, fold)
            in_runs, parts = in_runs + end - i, parts + len(found.parts)
        else:
            engine.ingest(events[i])
            end = i + 1
        i = end
    assert in_runs > 0.95 * len(events)
    assert parts > 0.95 * sum(isinstance(e, CheckpointPart) for e in events)
    assert folds > 0
    for keep_history in (False, True):
        for cuts in (list(range(1000, len(events), 1000)), [len(events) // 3]):
            _same(_one_by_one(events, keep_history, float("inf"), window),
                  _in_batches(events, keep_history, float("inf"), cuts, window))


def test_a_record_accounting_raises_on_is_named_and_nothing_after_it_is_accounted(tmp_path: Path) -> None:
    events = _synthetic(tmp_path, 1, 300)
    bad = next(e for e in events if e.type == "restore" and e.restart == 1)  # the restarted worker's: on its own

    class Buggy(Engine):  # stands in for an engine bug on one record
        def ingest(self, record: Event, not_after: float = float("inf")) -> bool:
            if record is bad:
                raise ZeroDivisionError("a bug")
            return super().ingest(record, not_after)

    buggy = Buggy()
    with pytest.raises(IngestFailed) as failed:
        buggy.ingest_many(events)
    assert isinstance(failed.value.__cause__, ZeroDivisionError)
    assert events[failed.value.start] is bad and failed.value.end == failed.value.start + 1
    _same(_one_by_one(events[:failed.value.start], False, float("inf")), buggy)


@pytest.mark.parametrize("round_bytes", [1, 1 << 21])
def test_the_journal_read_in_chunks_of_any_size_accounts_as_record_by_record(tmp_path: Path, round_bytes: int) -> None:
    """The sidecar's path (the reader's chunks decoded at once, each chunk's runs accounted together) against
    its records ingested one at a time: in the smallest chunks the reader reads (``MIN_CHUNK``, a few
    lines each) and in its default rounds (thousands)."""
    events = _synthetic(tmp_path, 2, 600)
    for keep_history in (False, True):
        engine = Engine(keep_history=keep_history)
        assert JournalTail(tmp_path, round_bytes=round_bytes).poll(engine.ingest_many) == len(events)
        _same(_one_by_one(events, keep_history, float("inf")), engine)
