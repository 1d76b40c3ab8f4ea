"""Backup and restore on real processes: `synctl cluster snapshot save`, then
`synapse-scheduler --restore` on the first replica of a new cluster, which grows by
`add-replica`; a corrupt backup is refused with a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from synapse_ha.cli.main import cli
from synapse_ha.core.codec.backup import decode_backup
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.programs.scheduler import ConfigError, load_config, restore_into
from tests.integration.cluster import (
    LocalCluster,
    job_spec,
    membership_change,
    register_request,
    wait_for,
)

pytestmark = pytest.mark.integration


def synctl(cluster: LocalCluster, *args: str) -> Result:
    creds = cluster.credentials
    assert creds is not None
    client = creds.client_tls()
    env = {
        "SYNAPSE_CA": str(client.ca),
        "SYNAPSE_CERT": str(client.cert),
        "SYNAPSE_KEY": str(client.key),
        "SYNAPSE_TOKEN_FILE": str(creds.admin_token_file),
    }
    addresses = ",".join(r.grpc for r in cluster.replicas if r.alive)
    return CliRunner().invoke(cli, ["--cluster", addresses, "--timeout", "20", *args], env=env)


def test_save_then_restore_into_a_new_cluster_finds_every_job_and_node(tmp_path: Path) -> None:
    backup = tmp_path / "cluster.snap"
    old = LocalCluster(tmp_path / "old")
    try:
        old.start()
        old.serving_leader()
        with old.client(timeout_s=30.0) as client:
            nodes = ["n1", "n2", "n3"]
            for node_id in nodes:
                client.register_node(register_request(node_id, "127.0.0.1", gpu=8))
            jobs = [client.submit_job(job_spec(f"job-{i}", gpu=1)).job_id for i in range(25)]
        saved = synctl(old, "-o", "json", "cluster", "snapshot", "save", str(backup))
        assert saved.exit_code == 0, saved.output
        answer = json.loads(saved.stdout)
        assert answer["raft_index"] > 0 and len(answer["sha256"]) == 64
        checked = synctl(old, "cluster", "snapshot", "check", str(backup))
        assert checked.exit_code == 0, checked.output
        assert "intact: 25 jobs, 3 nodes" in checked.stdout
    finally:
        old.close()
    content = decode_backup(backup.read_bytes())
    assert content.header.raft_index == answer["raft_index"]

    new = LocalCluster(tmp_path / "new", size=1, extra_args=["--restore", str(backup)])
    try:
        new.start()
        first = new.serving_leader(timeout_s=30.0)
        with new.client(timeout_s=30.0) as client:
            state = decode_state(client.replica_state(first.grpc).encoded_state)
            assert set(jobs) <= set(state.jobs)
            assert set(nodes) <= set(state.nodes)
            # The new cluster grows one replica at a time; the others catch up from it.
            for replica_id in ("r2", "r3"):
                added = new.add_replica(replica_id, extra=["--join"])
                new.start(added)  # first: a cluster of one commits nothing without it
                membership_change(
                    lambda r=replica_id, a=added: client.add_replica(r, a.raft, a.grpc)
                )
            job = client.submit_job(job_spec("after-restore")).job_id

            def converged() -> bool:
                digests = {client.replica_state(r.grpc).state_sha256 for r in new.replicas}
                return len(digests) == 1

            wait_for("the restored cluster converges", converged, timeout_s=60.0)
            last = decode_state(client.replica_state(new.replica("r3").grpc).encoded_state)
            assert set(jobs) | {job} <= set(last.jobs)
            assert set(nodes) <= set(last.nodes)
    finally:
        new.close()


def test_a_corrupt_or_truncated_backup_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "good.snap"
    old = LocalCluster(tmp_path / "old")
    try:
        old.start()
        old.serving_leader()
        with old.client() as client:
            client.register_node(register_request("n1", "127.0.0.1", gpu=8))
        assert synctl(old, "cluster", "snapshot", "save", str(good)).exit_code == 0
        data = good.read_bytes()
        flipped = tmp_path / "flipped.snap"
        flipped.write_bytes(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
        truncated = tmp_path / "truncated.snap"
        truncated.write_bytes(data[:-10])
        for bad, why in ((flipped, "corrupt: SHA-256"), (truncated, "truncated")):
            result = synctl(old, "cluster", "snapshot", "check", str(bad))
            assert result.exit_code != 0 and why in result.output, result.output
            argv = [
                "--id",
                "r1",
                "--replica",
                "r1=127.0.0.1:1,127.0.0.1:2",
                "--data-dir",
                str(tmp_path / f"data-{bad.stem}"),
                "--insecure",
                "--restore",
                str(bad),
            ]
            config = load_config(
                argv, {"SYNAPSE_RAFT_PASSWORD": "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI="}
            )
            with pytest.raises(ConfigError, match=why):
                restore_into(config)
            assert not (tmp_path / f"data-{bad.stem}" / "raft.dump").exists()
        # A good backup is not restored over existing data either.
        argv = ["--id", "r1", "--replica", "r1=127.0.0.1:1,127.0.0.1:2", "--insecure"]
        used = old.replica("r1").data_dir
        config = load_config(
            [*argv, "--data-dir", str(used), "--restore", str(good)],
            {"SYNAPSE_RAFT_PASSWORD": "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI="},
        )
        with pytest.raises(ConfigError, match="already holds a replica's data"):
            restore_into(config)
    finally:
        old.close()
