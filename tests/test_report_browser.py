"""The offline report of the real demo journal, made by the real CLI and rendered by headless
Chromium: one lane per rank, one marker per checkpoint and per restart, each counted from the
journal itself (not from the engine the report uses). A screenshot lands in ``test-artifacts/``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nvrx_slo.exporter.ingest.decode import Event
from nvrx_slo.exporter.ingest.tail import JournalTail
from test_report import assert_inert
from test_status_page_browser import ARTIFACTS, dump_dom, screenshot


def journal_facts(journal_dir) -> dict[str, int]:
    """Ranks, save attempts and restarts, counted straight from the records: each in-job restart
    starts processes with a new ``restart`` count, each in-process restart bumps ``iter``, and a
    checkpoint id saved again after a rollback is another attempt."""
    records: list[Event] = []
    tail = JournalTail(journal_dir)
    tail.poll(records.extend)
    tail.close()
    ranked = [r for r in records if r.rank is not None]
    return {
        "ranks": len({r.rank for r in ranked}),
        "checkpoints": len({(r.ckpt, r.restart, r.iter) for r in records if r.type == "checkpoint_start"}),
        "restarts": len({(r.restart, r.iter) for r in ranked}) - 1,
    }


@pytest.mark.slow
def test_the_report_of_the_demo_renders_its_timeline(demo_run, tmp_path):
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "nvrx_slo", "report", str(demo_run.journal_dir), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size < 500_000

    dom = dump_dom(out.as_uri(), tmp_path / "profile")
    screenshot(out.as_uri(), ARTIFACTS / "report.png", tmp_path / "profile", height=1300)
    assert_inert(dom)
    facts = journal_facts(demo_run.journal_dir)
    assert facts["ranks"] == 2 and facts["restarts"] >= 2 and facts["checkpoints"] >= 2  # the demo's story
    assert dom.count('class="tl-lane"') == facts["ranks"]
    assert dom.count('data-kind="checkpoint"') == facts["checkpoints"]
    assert dom.count('data-kind="restart"') == facts["restarts"]
    assert 'class="tl-lost"' in dom  # the crash rolled work back
    for kind in ("step", "blocking", "background", "restore"):
        assert f'class="tl-{kind}"' in dom, kind
