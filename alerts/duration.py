"""Prometheus durations <-> whole seconds.

The spec, the burn-rate windows and the generated rules all speak in whole seconds; this module
is the one place that turns them into the text Prometheus reads (``30d``, ``1h30m``) and back.
Units are d, h, m, s: Prometheus also knows w and y, but ``30d`` reads better than ``4w2d``.
"""

from __future__ import annotations

import re

UNITS: tuple[tuple[str, int], ...] = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_PATTERN = re.compile("".join(rf"(?:(\d+){unit})?" for unit, _ in UNITS))


def parse(text: str) -> int:
    """``"1h30m"`` -> 5400. Raises ``ValueError`` naming the accepted form."""
    match = _PATTERN.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"{text!r} is not a duration like 30d, 6h, 90s or 1h30m (units d, h, m, s)")
    seconds = sum(int(n) * size for n, (_, size) in zip(match.groups(), UNITS, strict=True) if n)
    if seconds <= 0:
        raise ValueError(f"{text!r} must be longer than zero")
    return seconds


def format(seconds: int) -> str:
    """5400 -> ``"1h30m"``; the inverse of ``parse``."""
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, got {seconds}")
    parts = []
    for unit, size in UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
