"""How every generated file is written: one YAML dumper, one JSON form, one "do not edit" note.

The rule files, the Alertmanager config, the PrometheusRule, the dashboards and their ConfigMaps, the
deploy overlays and what `nvrx-slo inject` prints all come out of here, so they read alike and
regenerate byte for byte: keys in the order the builders wrote them (a rule reads record, expr,
labels, as people write it), multi-line strings (PromQL, a ``bash -c`` script, a dashboard's JSON)
as literal ``|`` blocks, no line folding (a long PromQL line stays one line, so a diff shows what
changed), UTF-8 as is, and every document of a stream opened by ``---``. A committed file starts
with ``# generated — do not edit: `COMMAND` from SOURCE``; a dashboard, being JSON, carries that
note in its description instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, as people write them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)

_OPTIONS: dict[str, Any] = {"Dumper": _Dumper, "sort_keys": False, "width": float("inf"), "allow_unicode": True}


def note(command: str, source: str) -> str:
    """What marks a file generated: the command that writes it and what it is written from."""
    return f"generated — do not edit: `{command}` from {source}"


def header(command: str, source: str) -> str:
    """``note`` as the comment line a generated YAML file starts with."""
    return f"# {note(command, source)}\n"


def yaml_document(document: Any) -> str:
    """One YAML document (a rule file, a config)."""
    return yaml.dump(document, **_OPTIONS)


def yaml_documents(documents: Iterable[Any]) -> str:
    """A stream of YAML documents (manifests), each opened by ``---``."""
    return yaml.dump_all(documents, explicit_start=True, **_OPTIONS)


def json_document(data: Any, encoder: type[json.JSONEncoder]) -> str:
    """JSON with sorted keys, indented, ending in a newline; ``encoder`` turns what JSON lacks into JSON."""
    return json.dumps(data, cls=encoder, sort_keys=True, indent=2) + "\n"
