"""Journal strings made safe for a terminal or a log line.

Job, pod and node names, restart causes and file names come from the journal (or its
directory), which the sidecar does not control: written raw into the text SLO report or the log
they could move the cursor, recolour or clear a terminal (ANSI escapes), ring its bell, or forge
whole log lines (a newline). ``printable`` keeps every printable character, including non-ASCII
letters, and writes any other one — control characters (C0, DEL, C1), line and paragraph
separators, bidirectional overrides, lone surrogates — as a visible ``\\x..``/``\\u....`` escape.
"""

from __future__ import annotations

__all__ = ["printable"]


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (see the module docstring)."""
    if text.isprintable():  # the common case: one C call
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)
