"""The `nvrx-slo` commands' surfaces, as a user meets them: the flags (frozen), what `--help` says,
where the output goes, and nothing on stderr that the user did not cause.

The sidecar's own flags are frozen in ``test_sidecar_cli.py``; the inject command's refusals are in
``test_inject.py``.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from journal_fixtures import write_journal
from nvrx_slo import generate, inject
from nvrx_slo.exporter.offline import report
from pages import inventory
from snapshot_fixtures import TARGETS
from stories import inprocess_job

# The whole surface of each command, frozen: a new flag is a deliberate change to this list (and the README).
FLAGS = {
    "report": (report.parser, ["--help", "--format", "-o", "--output", "--price"]),
    "generate": (generate.parser, ["--help", "--spec", "--root"]),
    "inject": (inject.parser, ["--help", "--image", "--container"]),
}


def nvrx_slo(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nvrx_slo", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


@pytest.mark.parametrize("command", FLAGS)
def test_the_flag_surface_is_frozen(command):
    parser, flags = FLAGS[command]
    assert [s for a in parser()._actions for s in a.option_strings if s != "-h"] == flags


@pytest.mark.parametrize(("command", "says"), [
    ("report", ["--format {html,text,csv}", "-o FILE, --output FILE", "- for stdout", "default: report.html",
                "--price PRICE"]),
    ("generate", ["--spec SPEC", "default: alerts/slo.yaml", "--root ROOT", "default: ."]),
])
def test_help_shows_every_flag_and_its_default(command, says):
    done = nvrx_slo(command, "--help")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    text = re.sub(r"\s+", " ", done.stdout)
    for words in says:
        assert words in text, words


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("journal")
    write_journal(inprocess_job(), directory, evil=False)
    return directory


def test_report_dash_o_dash_writes_the_page_to_stdout_and_no_file(journal, tmp_path):
    done = nvrx_slo("report", str(journal), "-o", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<!doctype html>") and done.stdout.endswith("</html>")
    assert list(tmp_path.iterdir()) == []  # not a file named "-", and no report.html either


def test_report_as_text_prints_the_slo_report_with_the_pages_numbers(journal, tmp_path):
    done = nvrx_slo("report", str(journal), "--format", "text", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nvrx-slo SLO report — job job, pod pod-0, 2 rank(s), finished")
    assert list(tmp_path.iterdir()) == []
    page = inventory(report.build([journal], TARGETS))
    efficiency = float(page.by_id["efficiency"]["data-value"])
    assert f"Efficiency (productive / wall): {100 * efficiency:.2f}%" in done.stdout
    written = nvrx_slo("report", str(journal), "--format", "text", "-o", "slo.txt", cwd=tmp_path)
    assert written.returncode == 0 and written.stdout.strip() == str(tmp_path / "slo.txt")
    assert (tmp_path / "slo.txt").read_text() == done.stdout


def test_report_says_why_it_cannot_write(journal, tmp_path):
    done = nvrx_slo("report", str(journal), "-o", str(tmp_path / "missing" / "r.html"))
    assert done.returncode == 1 and done.stderr == f"nvrx-slo report: cannot write {tmp_path}/missing/r.html: " \
                                                   "No such file or directory\n"


def test_generate_takes_spec_and_root_before_or_after_what(tmp_path):
    spec = Path(__file__).resolve().parents[1] / "alerts" / "slo.yaml"
    before = nvrx_slo("generate", "--spec", str(spec), "--root", str(tmp_path / "a"), "all")
    after = nvrx_slo("generate", "all", "--root", str(tmp_path / "b"), "--spec", str(spec))
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    bad = nvrx_slo("generate", "alerts", "--sepc", "x")
    assert bad.returncode == 2 and "nvrx-slo generate: error: unrecognized arguments: --sepc" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", [pytest.param("train", marks=pytest.mark.torch),
                                     pytest.param("ft-launcher", marks=[pytest.mark.torch, pytest.mark.nvrx])])
def test_the_training_commands_help_prints_no_warning(command):
    """torch imports ``pynvml`` at import; the deprecated ``pynvml`` shim NVRx requires warns then."""
    done = nvrx_slo(command, "--help", timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]


def test_report_as_csv_is_the_cost_table_with_focus_columns(journal, tmp_path):
    """One row per row of the text report's cost table: accelerator-hours (ConsumedQuantity) and their
    price (EffectiveCost) at ``--price``, by category (x_Category) and cause (x_Cause)."""
    done = nvrx_slo("report", str(journal), "--format", "csv", "--price", "3.5", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert list(rows[0]) == ["ChargePeriodStart", "ChargePeriodEnd", "ResourceName", "ConsumedQuantity", "ConsumedUnit",
                             "BillingCurrency", "EffectiveCost", "x_Category", "x_Cause", "x_RankSeconds",
                             "x_AcceleratorsPerRank", "x_PricePerAcceleratorHour"]
    for row in rows:
        assert row["ConsumedUnit"] == "Accelerator-Hours" and row["BillingCurrency"] == "USD"
        assert float(row["EffectiveCost"]) == pytest.approx(float(row["ConsumedQuantity"]) * 3.5, abs=1e-6)
        assert float(row["ConsumedQuantity"]) == pytest.approx(float(row["x_RankSeconds"]) / 3600, abs=1e-6)
    text = nvrx_slo("report", str(journal), "--format", "text", "--price", "3.5", cwd=tmp_path).stdout
    total = re.search(r"^  total\s+([\d.]+)\s+([\d.]+)\s+", text.split("What badput cost")[1], re.M)
    assert sum(float(r["x_RankSeconds"]) for r in rows) == pytest.approx(float(total[1]), abs=0.01)
    assert {r["x_Category"] for r in rows} >= {"restart", "lost", "init"}
    # the story's in-process restart: the exception its rank raised
    assert {r["x_Cause"] for r in rows if r["x_Category"] in ("lost", "restart")} == {"exception"}


@pytest.mark.parametrize("price", ["-1", "nan", "inf", "cheap"])
def test_report_refuses_a_price_that_is_no_price(journal, price):
    done = nvrx_slo("report", str(journal), "--format", "csv", "--price", price)
    assert done.returncode == 2 and "--price" in done.stderr
