"""The sidecar's command line: one typed config, validated at load; a wrong flag names the flag."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from nvrx_slo.exporter import flags

# The whole surface, frozen: a new flag is a deliberate change to this list (and the README).
FLAGS = ["--help", "--journal-dir", "--state-file", "--host", "--port", "--poll-interval", "--state-interval",
         "--per-rank", "--no-per-rank", "--max-ranks", "--otlp-endpoint", "--otlp-interval", "--podinfo-dir",
         "--ft-cycle-info-dir", "--report-file", "--final-scrape-timeout", "--reorder-window",
         "--accelerator", "--accelerators-per-rank", "--accelerators-per-pod"]


def test_the_flag_surface_is_frozen():
    assert [s for a in flags.parser()._actions for s in a.option_strings if s != "-h"] == FLAGS


def test_defaults_and_the_journal_dir_from_the_trainers_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("NVRX_SLO_JOURNAL_DIR", str(tmp_path))
    cfg = flags.parse_args([])
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
    (["--poll-interval", "inf"], "--poll-interval"),
    (["--poll-interval", "1e308"], "--poll-interval"),
    (["--poll-interval", "nan"], "--poll-interval"),
    (["--state-interval", "-inf"], "--state-interval"),
    (["--otlp-interval", "1e9"], "--otlp-interval"),
    (["--max-ranks", "99999999999999999999"], "--max-ranks"),
    (["--otlp-endpoint", "http://"], "--otlp-endpoint"),
    (["--otlp-endpoint", "http://collector:99999"], "--otlp-endpoint"),
    (["--otlp-endpoint", "ftp://collector:4318"], "--otlp-endpoint"),
    (["--state-file", "JOURNAL"], "--state-file"),
    (["--podinfo-dir", "JOURNAL/missing"], "--podinfo-dir"),
    (["--podinfo-dir", "FILE"], "--podinfo-dir"),
    (["--ft-cycle-info-dir", "FILE"], "--ft-cycle-info-dir"),
    (["--report-file", "JOURNAL"], "--report-file"),
    (["--report-file", "JOURNAL/missing/report.txt"], "--report-file"),
    (["--final-scrape-timeout", "-1"], "--final-scrape-timeout"),
    (["--final-scrape-timeout", "nan"], "--final-scrape-timeout"),
    (["--reorder-window", "-1"], "--reorder-window"),
    (["--reorder-window", "inf"], "--reorder-window"),
    (["--accelerators-per-rank", "0"], "--accelerators-per-rank"),
    (["--accelerators-per-rank", "nan"], "--accelerators-per-rank"),
    (["--accelerators-per-pod", "-8"], "--accelerators-per-pod"),
    (["--accelerators-per-pod", "8", "--accelerators-per-rank", "1"], "not both"),
    (["--accelerator", ""], "--accelerator"),
    (["--journal-dir", ""], "--journal-dir"),  # the working directory, silently
    (["--state-file", ""], "--state-file"),
    (["--podinfo-dir", ""], "--podinfo-dir"),
    (["--ft-cycle-info-dir", ""], "--ft-cycle-info-dir"),
    (["--report-file", ""], "--report-file"),
])
def test_a_wrong_flag_exits_2_naming_it(argv, named, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NVRX_SLO_JOURNAL_DIR", raising=False)
    (tmp_path / "file").write_text("")
    argv = [a.replace("JOURNAL", str(tmp_path)).replace("FILE", str(tmp_path / "file")) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        flags.parse_args(["--journal-dir", str(tmp_path), *argv])
    assert exit_.value.code == 2 and named in capsys.readouterr().err


def test_a_state_file_in_a_directory_that_does_not_exist_exits_2_at_start(tmp_path):
    """Every save failed (logged each --state-interval) and a restart rebuilt from the journal; the
    sidecar ran and answered /readyz 200 meanwhile. Checked at start, not with the flags: in a pod
    the directory is a volume, mounted by the time the sidecar starts (tests/test_deploy_images.py
    parses the manifests' flags here, where it is not)."""
    bad = subprocess.run([sys.executable, "-m", "nvrx_slo", "sidecar", "--journal-dir", str(tmp_path),
                          "--state-file", str(tmp_path / "missing" / "state.json"), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--state-file" in bad.stderr and "no such directory" in bad.stderr, bad.stderr


def test_a_journal_dir_that_does_not_exist_yet_keeps_its_state_file_in_it(tmp_path, monkeypatch):
    """The journal directory may appear after the sidecar starts (the trainer creates it), and the
    default state file with it: only a state file elsewhere must have its directory at start."""
    monkeypatch.delenv("NVRX_SLO_JOURNAL_DIR", raising=False)
    cfg = flags.parse_args(["--journal-dir", str(tmp_path / "later")])
    assert cfg.state_file.parent == tmp_path / "later"


def test_a_journal_dir_that_is_a_file_names_the_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NVRX_SLO_JOURNAL_DIR", raising=False)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exit_:
        flags.parse_args(["--journal-dir", str(tmp_path / "file")])
    assert exit_.value.code == 2 and "--journal-dir" in capsys.readouterr().err


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("host, port", [
    ("127.0.0.1", "IN_USE"),  # another process has the port
    ("192.0.2.1", "0"),  # TEST-NET-1: an address this machine does not have
    ("no-such-host.invalid", "0"),
])
def test_an_address_the_sidecar_cannot_listen_on_exits_2_naming_the_flags(tmp_path, host, port):
    with _listening() as busy:
        port = port.replace("IN_USE", str(busy.getsockname()[1]))
        bad = subprocess.run([sys.executable, "-m", "nvrx_slo", "sidecar", "--journal-dir", str(tmp_path),
                              "--host", host, "--port", port], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--host/--port" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_an_ipv6_host_is_served(tmp_path):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no ::1 here")
    log = tmp_path / "log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "nvrx_slo", "sidecar", "--journal-dir", str(tmp_path),
                                 "--host", "::1", "--port", "0"], stderr=err)
    try:
        deadline = time.monotonic() + 60
        while not (match := re.search(r"serving http://::1:(\d+)/", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        with urllib.request.urlopen(f"http://[::1]:{match.group(1)}/healthz", timeout=10) as resp:
            assert resp.read() == b"ok\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_no_journal_dir_names_the_flag_and_the_variable(capsys, monkeypatch):
    monkeypatch.delenv("NVRX_SLO_JOURNAL_DIR", raising=False)
    with pytest.raises(SystemExit):
        flags.parse_args([])
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
