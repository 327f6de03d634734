"""Prometheus exposition text, parsed with prometheus-client's own parser into one dict:
``(sample name, sorted label pairs) -> value``."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
