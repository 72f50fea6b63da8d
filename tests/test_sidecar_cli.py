"""The sidecar's command line: one typed config, validated at load; a wrong flag names the flag."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nvrx_slo.exporter import sidecar

# The whole surface, frozen: a new flag is a deliberate change to this list (and the README).
FLAGS = ["--help", "--journal-dir", "--state-file", "--host", "--port", "--poll-interval", "--state-interval",
         "--per-rank", "--no-per-rank", "--max-ranks", "--otlp-endpoint", "--otlp-interval", "--podinfo-dir",
         "--ft-cycle-info-dir", "--report-file"]


def test_the_flag_surface_is_frozen():
    assert [s for a in sidecar.parser()._actions for s in a.option_strings if s != "-h"] == FLAGS


def test_defaults_and_the_journal_dir_from_the_trainers_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("NVRX_SLO_JOURNAL_DIR", str(tmp_path))
    cfg = sidecar.parse_args([])
    assert cfg.journal_dir == tmp_path and cfg.port == 9400 and cfg.per_rank and cfg.max_ranks == 64
    assert cfg.state_file == tmp_path / ".nvrx-slo-sidecar-state.json" and cfg.otlp_endpoint is None


@pytest.mark.parametrize("argv, named", [
    (["--bogus"], "--bogus"),
    (["--port", "http"], "--port"),
    (["--port", "70000"], "--port"),
    (["--max-ranks", "0"], "--max-ranks"),
    (["--poll-interval", "0"], "--poll-interval"),
    (["--otlp-endpoint", "collector:4318"], "--otlp-endpoint"),
    (["--state-file", "JOURNAL/x.jsonl"], "--state-file"),
])
def test_a_wrong_flag_exits_2_naming_it(argv, named, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NVRX_SLO_JOURNAL_DIR", raising=False)
    argv = [a.replace("JOURNAL", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        sidecar.parse_args(["--journal-dir", str(tmp_path), *argv])
    assert exit_.value.code == 2 and named in capsys.readouterr().err


def test_no_journal_dir_names_the_flag_and_the_variable(capsys, monkeypatch):
    monkeypatch.delenv("NVRX_SLO_JOURNAL_DIR", raising=False)
    with pytest.raises(SystemExit):
        sidecar.parse_args([])
    err = capsys.readouterr().err
    assert "--journal-dir" in err and "NVRX_SLO_JOURNAL_DIR" in err


def test_the_installed_command_shows_help_and_rejects_a_wrong_flag():
    ok = subprocess.run([sys.executable, "-m", "nvrx_slo", "sidecar", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and all(f in ok.stdout for f in FLAGS)
    bad = subprocess.run([sys.executable, "-m", "nvrx_slo", "sidecar", "--journal-dir", "/tmp", "--per-rnak"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--per-rnak" in bad.stderr


def test_the_sidecar_never_imports_torch_or_nvrx():
    code = ("import sys, nvrx_slo.exporter.sidecar; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'nvidia_resiliency_ext')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
