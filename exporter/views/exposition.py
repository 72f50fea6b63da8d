"""Prometheus text format (0.0.4) for a registry's metric families, fast enough for 1024 ranks.

prometheus-client's ``generate_latest`` spends ~9 µs per sample (label-name escaping, sorting and
suffix checks for every sample); 1024 ranks with the full catalogue are ~31k samples, ~280 ms on
the development machine, against a 100 ms budget. This writer renders the same families to the
same format (checked by parsing both outputs with prometheus-client's parser, and by
``promtool check metrics``) at a fraction of the cost, by rendering each label set once and
reusing its text while the collector reuses the set (``TextRenderer``).

It handles what ``collector.SnapshotCollector`` emits: counters, gauges and classic histograms
with legacy-valid metric and label names (the catalogue's).
"""

from __future__ import annotations

from collections.abc import Iterable
from math import isfinite

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _label_text(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}" if labels else ""


class TextRenderer:
    """Renders families to text; remembers each label dict's text by identity across renders.

    Collectors that reuse label dict objects (``collector.LabelSets``) get each label set
    rendered once; any other dict is rendered on first sight. The cached dict is held, so its
    ``id`` cannot be reused by another object while its entry exists. Label dicts must not be
    mutated after they are handed to a sample (prometheus-client's own families never are).
    """

    MAX_ENTRIES = 1 << 18

    def __init__(self) -> None:
        self._texts: dict[int, tuple[dict[str, str], str]] = {}

    def render(self, families: Iterable[Metric]) -> bytes:
        texts = self._texts
        if len(texts) > self.MAX_ENTRIES:
            texts.clear()
        out: list[str] = []
        for family in families:
            name = family.name + "_total" if family.type == "counter" else family.name
            doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
            for sample in family.samples:
                labels = sample.labels
                entry = texts.get(id(labels))
                if entry is None or entry[0] is not labels:
                    entry = texts[id(labels)] = (labels, _label_text(labels))
                value = sample.value
                # repr is exact and parses everywhere; only non-finite floats need Prometheus' spelling
                text = repr(value) if type(value) is int or isfinite(value) else floatToGoString(value)
                out.append(f"{sample.name}{entry[1]} {text}\n")
        return "".join(out).encode()

    def generate(self, registry: Collector) -> bytes:
        """The text exposition of everything ``registry`` collects now."""
        return self.render(registry.collect())
