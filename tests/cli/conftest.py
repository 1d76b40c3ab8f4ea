from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from click.testing import CliRunner, Result

from synapse_ha.cli.main import cli
from synapse_ha.client.cluster import ClusterClient
from tests.integration.cluster import LocalCluster, wait_for
from tests.worker.workers import LocalWorkers

# Short timeouts keep the suite quick; they satisfy dead_timeout > lease_ttl + step-down.
TIMEOUTS = [
    "--heartbeat-interval",
    "200ms",
    "--lease-ttl",
    "2s",
    "--leader-step-down",
    "1s",
    "--dead-timeout",
    "5s",
    "--log-level",
    "WARNING",
]
# Two workers in two racks, 8 mock GPUs and 8 CPUs each.
WORKERS = {"w1": "zone=z1,block=b1,rack=r1", "w2": "zone=z1,block=b1,rack=r2"}


CREDENTIAL_VARIABLES = (
    "SYNAPSE_CA",
    "SYNAPSE_CERT",
    "SYNAPSE_KEY",
    "SYNAPSE_TOKEN",
    "SYNAPSE_TOKEN_FILE",
)


def exported(lines: list[str]) -> dict[str, str]:
    """``export NAME=value`` lines as a mapping."""
    return dict(line.removeprefix("export ").split("=", 1) for line in lines)


@dataclass
class Synctl:
    """Runs synctl in-process against one cluster, with the environment ``synctl dev up``
    prints (the CA, the transport-only client certificate, the admin token file)."""

    cluster: LocalCluster
    workers: LocalWorkers
    client: ClusterClient

    @property
    def addresses(self) -> str:
        return ",".join(self.cluster.grpc_addresses)

    @property
    def admin_env(self) -> dict[str, str]:
        assert self.cluster.credentials is not None
        return exported(self.cluster.credentials.exports())

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> Result:
        """synctl ``args`` as the admin, or with exactly ``env`` (plus an empty config
        directory and no token variable unless ``env`` sets them)."""
        base: dict[str, str | None] = {"XDG_CONFIG_HOME": "/nonexistent"}
        for name in CREDENTIAL_VARIABLES:
            base[name] = None  # unset
        runner = CliRunner()
        return runner.invoke(
            cli,
            ["--cluster", self.addresses, "--timeout", "10", *args],
            catch_exceptions=False,
            env={**base, **(self.admin_env if env is None else env)},
        )

    def diagnostics(self) -> str:
        return self.cluster.logs() + "\n" + self.workers.logs()


@pytest.fixture(scope="module")
def synctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synctl]:
    """Three real replicas and two mock-GPU workers, shared by one module's tests (which
    must leave the nodes ready)."""
    root = tmp_path_factory.mktemp("cli")
    cluster = LocalCluster(root / "cluster", extra_args=TIMEOUTS)
    # The workers' certificates come from the cluster's credentials (secure by default).
    workers = LocalWorkers(root / "workers", cluster.grpc_addresses, cluster.credentials)
    workers.root.mkdir()
    try:
        cluster.start()
        cluster.serving_leader()
        for node_id, topology in WORKERS.items():
            workers.start(
                node_id,
                "--mock-gpus",
                "8",
                "--cpu",
                "8",
                "--memory",
                "16Gi",
                "--topology",
                topology,
                "--log-level",
                "WARNING",
            )
        with cluster.client(timeout_s=10.0) as client:
            wait_for(
                "both workers ready",
                lambda: (
                    sorted(n.node_id for n in client.list_nodes() if n.status == "ready")
                    == sorted(WORKERS)
                ),
                timeout_s=30,
            )
            yield Synctl(cluster, workers, client)
    finally:
        workers.close()
        cluster.close()
