"""scripts/compat.sh runs its own list of test files once per NVRx release: every file holding a test
that needs NVRx (marked ``nvrx``) and no external tool must be on it, or a release's break there
would reach CI only on the Debian whose pip resolves that release."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_file_with_an_nvrx_test_runs_in_the_compatibility_matrix():
    listed = set(re.findall(r"tests/test_\w+\.py", (ROOT / "scripts" / "compat.sh").read_text()))
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                "-m", "nvrx and not external", "tests"], cwd=ROOT, capture_output=True, text=True,
                               timeout=300)
    needing = {line.split("::")[0] for line in collected.stdout.splitlines() if "::" in line}
    assert needing, collected.stdout[-2000:] + collected.stderr[-2000:]
    assert needing <= listed, sorted(needing - listed)
