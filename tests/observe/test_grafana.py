"""The Grafana dashboard and the example scrape configuration match what is exported."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from synapse_ha.observe.metrics import ReplicaMetrics, WorkerMetrics
from tests.core.harness import Cluster, job, node
from tests.observe.test_metrics import FakeNvml, FakeReplica

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"


def exported_names() -> set[str]:
    cluster = Cluster()
    cluster.add(node("a1"))
    cluster.submit(job("pending", replicas=4, gpu=8, wait_for_nodes=True))
    cluster.run_pass()
    names: set[str] = set()
    for registry in (
        ReplicaMetrics("r1", FakeReplica(cluster.state)).registry,
        WorkerMetrics("n1", nvml=FakeNvml()).registry,
    ):
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            names.update(s.name for s in family.samples)
    return names


def test_every_series_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads((GRAFANA / "synapse.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"\bsynapse_[a-z_]+", e)}
    assert len(used) >= 15
    missing = sorted(used - exported_names())
    assert not missing, missing


def test_the_scrape_configuration_uses_mutual_tls_for_replicas_and_workers() -> None:
    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"synapse-replicas", "synapse-workers"}
    assert len(jobs["synapse-replicas"]["static_configs"][0]["targets"]) == 3
    for j in jobs.values():
        assert j["scheme"] == "https"
        assert set(j["tls_config"]) >= {"ca_file", "cert_file", "key_file"}
