"""A node's name on every metric sample."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cadenza.edge.server.node_identity import with_node_label


def test_every_sample_gets_the_node_label_and_the_text_still_parses() -> None:
    registry = CollectorRegistry()
    Counter("requests", "r", ["route"], registry=registry).labels(route="/a{b} c").inc()
    Gauge("streams", "s", registry=registry).set(3)
    text = with_node_label(generate_latest(registry).decode(), "node-a:8000")
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert samples and all(s.labels["node"] == "node-a:8000" for s in samples)
    routes = {s.labels.get("route") for s in samples if s.name == "requests_total"}
    assert routes == {"/a{b} c"}
    assert any(s.name == "streams" and s.value == 3 for s in samples)
