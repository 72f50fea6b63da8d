"""The HTML pages under test (status page, report): what a browser's tokenizer finds in them, and
what Debian's headless Chromium renders of them (``test-artifacts/`` keeps its screenshots)."""

from __future__ import annotations

import subprocess
from html.parser import HTMLParser
from pathlib import Path

from needs import tool

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def chromium(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Debian's headless Chromium, offline and quiet, with a throwaway profile."""
    cmd = [tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", *args, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def dump_dom(url: str, profile: Path) -> str:
    """The DOM after Chromium parsed and laid out the page (what a person sees, not what was sent)."""
    return chromium(url, profile, "--dump-dom").stdout


def screenshot(url: str, path: Path, profile: Path, height: int = 900) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    chromium(url, profile, f"--screenshot={path}", f"--window-size=1366,{height}")
    assert path.stat().st_size > 10_000  # a blank page is a few kB


class _Inventory(HTMLParser):
    """Every element and attribute of a page, as a browser's tokenizer sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.by_id: dict[str, dict[str, str | None]] = {}
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += attrs
        attr = dict(attrs)
        if attr.get("id"):
            self.by_id[attr["id"]] = attr

    handle_startendtag = handle_starttag

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def inventory(document: str) -> _Inventory:
    inv = _Inventory()
    inv.feed(document)
    return inv


def assert_inert(document: str) -> _Inventory:
    """No script, no event handler, no javascript: URL, no external fetch in ``document``."""
    inv = inventory(document)
    assert "script" not in inv.tags and "img" not in inv.tags and "iframe" not in inv.tags
    assert not [name for name, _ in inv.attrs if name.startswith("on")]
    assert not [v for name, v in inv.attrs if name in ("href", "src") and v and ("javascript:" in v or "//" in v)]
    return inv
