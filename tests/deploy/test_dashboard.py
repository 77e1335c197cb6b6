"""The Grafana dashboard in deploy/grafana (issue 15): every query names only metrics the servers
export, and it has a panel for each figure an operator asked for."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import holdfast.agent.metrics
import holdfast.coordinator.metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "holdfast.json"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "summary": ("_sum", "_count", "_created")}


def exported() -> set[str]:
    """Every series name the two servers' metrics can expose, labelled or not."""
    assert holdfast.agent.metrics.PROBES and holdfast.coordinator.metrics.PROBES  # both registered
    return {family.name + suffix for family in REGISTRY.collect() if family.name.startswith("holdfast_")
            for suffix in SUFFIXES[family.type]}


def queries() -> dict[str, list[str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in panels}


def test_every_panel_query_names_an_exported_metric() -> None:
    names = exported()
    for title, exprs in queries().items():
        assert exprs, f"panel {title!r} has no query"
        for expr in exprs:
            used = set(re.findall(r"\bholdfast_[a-z_]+", expr))
            assert used, f"panel {title!r}: {expr!r} names no holdfast metric"
            assert used <= names, f"panel {title!r} queries {sorted(used - names)}, which no server exports"


def test_the_dashboard_shows_what_operators_asked_for() -> None:
    every = " ".join(e for exprs in queries().values() for e in exprs)
    for metric in ("holdfast_sessions", "holdfast_takeover_seconds_count", "holdfast_takeover_seconds_bucket",
                   "holdfast_refusals_total", "holdfast_session_indeterminate_seconds"):
        assert metric in every, f"no panel shows {metric}"
    per_host = r"by \(host, le\) \(rate\(holdfast_probe_seconds_bucket"
    assert re.search(per_host, every), "no panel shows probe latency per host"
