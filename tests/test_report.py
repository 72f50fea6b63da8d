"""``nvrx-slo report``: hostile journals (huge, truncated, HTML in every string) and the CLI's errors.

The real demo journal in a real browser is in ``test_report_browser.py``. Here the journal is a
hand-built story (``stories.inprocess_job``) with known totals, written to disk and read back through the real
reader, engine and renderer.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
import time
import tracemalloc
from html.parser import HTMLParser
from pathlib import Path

import pytest

from journal_fixtures import split_by_rank, write_journal
from nvrx_slo.contracts import schema
from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.exporter.offline import report
from nvrx_slo.exporter.views import timeline
from pages import assert_inert, inventory
from snapshot_fixtures import TARGETS
from stories import EVIL, inprocess_job

SYNTHETIC = Path(__file__).resolve().parents[1] / "bench" / "synthetic_journal.py"


def test_a_hostile_journal_renders_a_correct_escaped_report(tmp_path):
    expected = write_journal(inprocess_job(), tmp_path / "journal")
    with open(tmp_path / "journal" / schema.journal_file_name("pod-0", 0, 101), "ab") as f:
        f.write(b'{"v":1,"type":"step","seq"\n')  # truncated by a crash mid-write
        f.write(b"\xff\xfe not utf-8\n")
        f.write(b"<script>alert(3)</script>\n")
        f.write(schema.encode({"v": 99, "type": "step"}))
        f.write(b'{"v":1,"type":"step","seq":9')  # a torn last line, no newline: never read
    document = report.build([tmp_path / "journal"], TARGETS)

    inv = assert_inert(document)
    text = "".join(inv.text)
    assert EVIL in text  # the strings are shown, as text
    assert html.escape(EVIL) in document
    # one lane per rank, one marker per checkpoint and per restart
    assert document.count('class="tl-lane"') == expected["ranks"] == 2
    assert document.count('data-kind="checkpoint"') == expected["checkpoints"] == 3
    assert document.count('data-kind="restart"') == expected["restarts"] == 1
    assert inv.by_id["restarts-inprocess"]["data-value"] == "1"
    assert inv.by_id["checkpoint-saves"]["data-value"] == "3"
    assert inv.by_id["rejected"]["data-value"] == "4"
    # the breakdown adds up to the wall, and work rolled back by the restart shows as lost
    wall = float(inv.by_id["wall-seconds"]["data-value"])
    parts = [float(v["data-value"]) for k, v in inv.by_id.items() if k.startswith("seconds-")]
    assert len(parts) == len(Category) - 1 and sum(parts) == pytest.approx(wall, rel=1e-9)  # no absent: one pod
    assert float(inv.by_id["seconds-lost"]["data-value"]) > 0
    assert 'class="tl-lost"' in document


@pytest.mark.slow
def test_a_huge_journal_gives_a_small_report_quickly(tmp_path):
    expected = write_journal(inprocess_job(ranks=4, steps=12_500, ckpt_every=250, fault_after=12_400, dt=0.01),
                             tmp_path / "journal", evil=False)
    size = sum(f.stat().st_size for f in (tmp_path / "journal").iterdir())
    t0 = time.perf_counter()
    document = report.build([tmp_path / "journal"], TARGETS)
    elapsed = time.perf_counter() - t0
    print(f"report of {size / 1e6:.1f} MB journal: {elapsed:.2f} s, {len(document) / 1e3:.0f} kB HTML")
    assert size > 10e6
    assert len(document) < 1_000_000
    assert document.count('class="tl-lane"') == 4
    assert document.count('data-kind="checkpoint"') == min(expected["checkpoints"], timeline.MAX_MARKERS)
    assert document.count('data-kind="restart"') == 1
    assert_inert(document)


def _peak_bytes(directory: Path) -> int:
    """What ``report.build`` of ``directory`` allocated at most at once (Python's allocations)."""
    tracemalloc.start()
    try:
        report.build([directory], TARGETS)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_a_longer_journal_costs_the_report_a_few_dozen_bytes_a_step(tmp_path):
    """A report of a month-long journal must fit a laptop: each step more may cost the timeline a few
    arrays' entries, not a tuple per step or a list of them all (the slope between two lengths of
    ``bench/synthetic_journal.py``'s journal, so the reader's fixed buffers do not count)."""
    peaks = {}
    for steps in (20_000, 60_000):
        directory = tmp_path / str(steps)
        subprocess.run([sys.executable, str(SYNTHETIC), str(directory), "--ranks", "1", "--steps", str(steps),
                        "--restart-at", str(steps // 2)], check=True, capture_output=True, timeout=120)
        peaks[steps] = _peak_bytes(directory)
    per_step = (peaks[60_000] - peaks[20_000]) / 40_000
    print(f"report: {per_step:.0f} bytes a step more (peaks {peaks[20_000] / 1e6:.1f}, {peaks[60_000] / 1e6:.1f} MB)")
    assert per_step < 100  # 38 here; 160 when the timeline kept a tuple per step and listed a lane's steps


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nvrx_slo", "report", *args], capture_output=True, text=True,
                          timeout=60)


def test_the_cli_writes_the_report_and_prints_its_path(tmp_path):
    write_journal(inprocess_job(), tmp_path / "journal")
    out = tmp_path / "r.html"
    done = _cli(str(tmp_path / "journal"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out.resolve())
    assert out.read_text().startswith("<!doctype html>")


def test_the_cli_names_what_is_wrong(tmp_path):
    missing = _cli(str(tmp_path / "nope"), "-o", str(tmp_path / "r.html"))
    assert missing.returncode == 2 and "JOURNAL_DIR" in missing.stderr
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.rank-0.1.jsonl").write_bytes(b"garbage\n")
    empty = _cli(str(tmp_path / "empty"), "-o", str(tmp_path / "r.html"))
    assert empty.returncode == 1 and "no journal events" in empty.stderr and "1 lines rejected" in empty.stderr
    assert not (tmp_path / "r.html").exists()
    flag = _cli(str(tmp_path / "empty"), "--output-file", "x")
    assert flag.returncode == 2 and "--output-file" in flag.stderr


def test_a_job_of_several_pods_is_one_report_that_equals_the_same_ranks_in_one_pod(tmp_path):
    """Each rank of the story in a pod of its own: the job's accounting (every category), its one
    restart and its saves (counted, listed and marked) equal the single pod's that ran the same
    records; the timeline has a lane per rank labelled with its pod, on one time axis."""
    pod = inprocess_job(ranks=3)
    write_journal(pod, tmp_path / "one", evil=False)
    one = report.build([tmp_path / "one"], TARGETS)
    whole = inventory(one)
    dirs = split_by_rank(pod, tmp_path / "job")
    document = report.build(dirs, TARGETS)
    saves = re.compile(r'<tr data-ckpt="([^"]+)"><td class="cause">[^<]*</td><td class="num">(\d+)</td>.*?'
                       r'<td class="(pass|fail|na)">')
    assert saves.findall(document) == saves.findall(one) == [(f"step-{n:06d}", str(n), "pass") for n in (60, 40, 20)]
    assert document.count('data-kind="checkpoint"') == one.count('data-kind="checkpoint"') == 3
    assert "node <b>node-0</b>" in document  # each pod's, once
    job = assert_inert(document)
    for cat in Category:
        if f"seconds-{cat.value}" in whole.by_id:
            assert float(job.by_id[f"seconds-{cat.value}"]["data-value"] or 0) == pytest.approx(
                float(whole.by_id[f"seconds-{cat.value}"]["data-value"] or 0), abs=1e-6), cat
    for key in ("efficiency", "restarts-total", "checkpoint-saves", "steps-total", "ranks"):
        assert float(job.by_id[key]["data-value"]) == pytest.approx(float(whole.by_id[key]["data-value"])), key
    assert job.by_id["restarts-total"]["data-value"] == "1"
    lanes = [(a["data-rank"], a["data-pod"]) for a in (dict(attrs) for attrs in _lanes(document))]
    assert lanes == [("0", "pod-0"), ("1", "pod-1"), ("2", "pod-2")]
    assert document.count('data-kind="restart"') == 1


def _lanes(document: str) -> list[list[tuple[str, str | None]]]:
    """The attributes of each timeline lane, top to bottom."""
    found: list[list[tuple[str, str | None]]] = []

    class Lanes(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "g" and ("class", "tl-lane") in attrs:
                found.append(attrs)
    Lanes().feed(document)
    return found


def test_the_cli_takes_several_journal_directories_once_each(tmp_path):
    dirs = split_by_rank(inprocess_job(), tmp_path / "job")
    out = tmp_path / "r.html"
    done = _cli(*map(str, dirs), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "2 journals" in out.read_text()
    twice = _cli(str(dirs[0]), str(dirs[0]), "-o", str(tmp_path / "x.html"))
    assert twice.returncode == 2 and "named twice" in twice.stderr
