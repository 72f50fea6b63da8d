"""Every relative link and image in README.md and docs/**/*.md resolves in a clone: the file is tracked
by git and, for a ``#anchor``, a heading of the target renders to that anchor as GitHub writes it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"#{1,6} (.+)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation and backticks dropped, spaces to hyphens."""
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return h.replace(" ", "-")


def _outside_fences(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of every line of ``path`` outside a fenced code block."""
    lines, fence = [], False
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            lines.append((no, line))
    return lines


def anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings; a repeated heading's get ``-1``, ``-2``... as on GitHub."""
    out, seen = set(), {}
    for _, line in _outside_fences(path):
        if m := HEADING.match(line):
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(root: Path, tracked: set[str]) -> list[str]:
    """``file:line: target`` for each link of README.md and docs/ that a clone of ``root`` (holding
    ``tracked``) would not resolve. URLs with a scheme (https:, mailto:) are not followed."""
    bad = []
    for f in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        for no, line in _outside_fences(f):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                path, _, frag = target.partition("#")
                dest = (f.parent / path).resolve() if path else f
                rel = dest.relative_to(root).as_posix() if dest.is_relative_to(root) else str(dest)
                ok = rel in tracked or any(t.startswith(rel + "/") for t in tracked)
                if ok and frag and dest.is_file() and frag not in anchors(dest):
                    ok = False
                if not ok:
                    bad.append(f"{f.relative_to(root)}:{no}: {target}")
    return bad


def test_every_relative_link_and_anchor_in_the_readme_and_docs_resolves_in_a_clone():
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True,
                                 timeout=60).stdout.split())
    assert "README.md" in tracked and any(t.startswith("docs/") for t in tracked)
    assert broken_links(ROOT, tracked) == []


def test_the_checker_finds_a_missing_file_a_missing_anchor_and_an_untracked_file(tmp_path):
    (tmp_path / "docs" / "img").mkdir(parents=True)
    (tmp_path / "docs" / "img" / "a.png").write_bytes(b"")
    (tmp_path / "docs" / "new.md").write_text("# New\n")
    (tmp_path / "docs" / "guide.md").write_text(
        "# Guide\n## The `sidecar`: setup\n## Step\n## Step\n```\n[not a link](nowhere.md)\n# not a heading\n```\n"
        "[self](#step-1) [up](../README.md#top) [gone](#not-a-heading) [dir](img) [pic](img/a.png)\n")
    (tmp_path / "README.md").write_text(
        "# Top\n[ok](docs/guide.md#the-sidecar-setup) [web](https://example.com/x.md) [mail](mailto:a@b.c)\n"
        "[missing](docs/missing.md) [anchor](docs/guide.md#no-such-heading) ![untracked](docs/new.md)\n")
    tracked = {"README.md", "docs/guide.md", "docs/img/a.png"}
    assert broken_links(tmp_path, tracked) == [
        "README.md:3: docs/missing.md", "README.md:3: docs/guide.md#no-such-heading", "README.md:3: docs/new.md",
        "docs/guide.md:9: #not-a-heading"]
