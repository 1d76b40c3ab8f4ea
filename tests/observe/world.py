"""A small real cluster for the observability tests: three replicas and workers with
mock GPUs in two racks, all over mutual TLS, plus an HTTPS scraper that presents a
certificate of the cluster CA (as Prometheus' ``tls_config`` does)."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import TlsFiles
from tests.integration.cluster import LocalCluster, wait_for
from tests.worker.workers import LocalWorkers

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def tls_context(ca: Path, client: TlsFiles | None) -> ssl.SSLContext:
    """Trusts the cluster CA; presents ``client``'s certificate when given."""
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


def fetch(url: str, context: ssl.SSLContext, timeout_s: float = 10.0) -> tuple[int, str]:
    """(status, body) of a GET; an HTTP error status is returned, not raised."""
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(url: str, credentials: ClusterCredentials) -> Samples:
    """Every sample at ``url``, parsed with prometheus_client's parser."""
    status, body = fetch(url, tls_context(credentials.ca, credentials.client_tls()))
    assert status == 200, body
    out: Samples = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def gang(name: str, replicas: int, gpu: int) -> pb.JobSpec:
    """A gang whose members run until stopped and print a line first."""
    return pb.JobSpec(
        name=name,
        replicas=replicas,
        resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=gpu),
        shell_command="echo hello from rank $RANK; exec sleep 600",
        topology_required="rack",
    )


@contextmanager
def world(root: Path, racks: dict[str, str]) -> Iterator[tuple[LocalCluster, LocalWorkers]]:
    """A TLS cluster and one worker per ``racks`` item (node id → rack), 4 mock GPUs
    each, all ready; everything is stopped on the way out, also on failure."""
    cluster = LocalCluster(root / "cluster")
    workers: LocalWorkers | None = None
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=60)
        workers = LocalWorkers(root / "workers", cluster.grpc_addresses, cluster.credentials)
        # The scrape test reads each worker's /metrics at the port it was given.
        workers.launcher.fixed_metrics_ports = True
        workers.root.mkdir(parents=True)
        for node_id, rack in racks.items():
            workers.start(
                node_id,
                "--cpu",
                "2",
                "--memory",
                "2Gi",
                "--mock-gpus",
                "4",
                "--topology",
                f"rack={rack}",
            )
        with cluster.client() as client:
            wait_for(
                f"{len(racks)} ready nodes",
                lambda: len([n for n in client.list_nodes() if n.status == "ready"]) == len(racks),
                timeout_s=60,
            )
        yield cluster, workers
    finally:
        if workers is not None:
            workers.close()
        cluster.close()


def wait_running(client: ClusterClient, job_id: str, timeout_s: float = 60) -> pb.Job:
    def probe() -> pb.Job | None:
        job = client.get_job(job_id)
        running = job.state == "RUNNING" and all(m.state == "running" for m in job.attempt.members)
        return job if running else None

    return wait_for(f"job {job_id} running", probe, timeout_s=timeout_s)
