"""examples/elastic_train.py as the members of an elastic gang on real processes (one
replica, three workers of one mock GPU each): the gang starts with its ``min`` when only
that many nodes are free, grows by a new top rank when a node is freed, and gives that
rank back to a gang waiting for the node. A new member starts with the gang's size as
``WORLD_SIZE``; the others get a line in their membership file and the signal at each
change and are never restarted; the member given back is stopped by its worker."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.client.specfile import load_job_spec_file
from synapse_ha.core.spec.document import parse_job_spec
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.to_proto import spec_to_proto
from tests.integration.cluster import wait_for
from tests.worker.one_replica import OneReplica, one_replica
from tests.worker.workers import LocalWorkers

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE = EXAMPLES / "elastic_train.py"
# One GPU per member and per node: every member has a node of its own.
MEMBER = {"gpu": 1, "cpu": "100m", "memory": "64Mi"}
HOSTS = "['127.0.0.1', '127.0.0.1', '127.0.0.1']"
TWO_HOSTS = "['127.0.0.1', '127.0.0.1']"


@pytest.fixture
def one(tmp_path: Path) -> Iterator[OneReplica]:
    """The replica and three ready workers ``w1``..``w3``; every process stopped on the
    way out."""
    with one_replica(tmp_path) as one:
        for node in ("w1", "w2", "w3"):
            one.workers.start(node, "--cpu", "1", "--memory", "1Gi", "--mock-gpus", "1")
        wait_for(
            "3 ready nodes",
            lambda: len([n for n in one.client.list_nodes() if n.status == "ready"]) == 3,
            timeout_s=30,
        )
        yield one


def submit(client: ClusterClient, name: str, command: list[str], replicas: object = 1) -> str:
    """A job as its spec file would give it."""
    doc = {"name": name, "replicas": replicas, "resources": MEMBER, "command": command}
    return client.submit_job(spec_to_proto(parse_job_spec(doc).spec)).job_id


def running(client: ClusterClient, job_id: str, size: int, timeout_s: float = 20) -> pb.Job:
    """The job once it runs with ``size`` members, every one of them running."""

    def probe() -> pb.Job | None:
        job = client.get_job(job_id)
        members = job.attempt.members
        if job.state != "RUNNING" or len(members) != size:
            return None
        return job if all(m.state == "running" for m in members) else None

    return wait_for(f"{job_id} running with {size} members", probe, timeout_s=timeout_s)


def member_dirs(workers: LocalWorkers, job_id: str, rank: int) -> list[Path]:
    """Every directory a worker made for ``rank`` of ``job_id`` (attempt, generation)."""
    return sorted(
        d
        for w in workers.workers
        for d in (w.data_dir / "members" / job_id).glob(f"a*.t*.r{rank}*")
        if re.fullmatch(rf"a\d+\.t\d+\.r{rank}(\.g\d+)?", d.name)
    )


def said(workers: LocalWorkers, job_id: str, rank: int, last: str) -> list[str]:
    """What ``rank``'s one member printed, once its last line starts with ``last``."""

    def probe() -> list[str] | None:
        dirs = member_dirs(workers, job_id, rank)
        assert len(dirs) <= 1, f"rank {rank} was started more than once: {dirs}"
        try:
            lines = (dirs[0] / "output.log").read_text().splitlines() if dirs else []
        except FileNotFoundError:
            return None
        return lines if lines and lines[-1].startswith(last) else None

    return wait_for(f"rank {rank} of {job_id} saying {last!r}", probe, timeout_s=20)


def grow_then_shrink(one: OneReplica) -> tuple[str, str, str]:
    """An elastic gang of 2 to 3 started while 2 nodes are free, grown into the node
    a job freed and shrunk back for a job that waits for that node, with what its
    members said and were told at each step checked; (the gang, the waiting job, the
    node)."""
    client, workers = one.client, one.workers
    sleeper = ["sleep", "600"]
    holder = submit(client, "holder", sleeper)
    held = running(client, holder, 1).attempt.members[0].node_id
    # Two nodes free: the gang starts with its min.
    argv = [sys.executable, str(EXAMPLE), "--steps", "0", "--step-s", "0.02"]
    gang = submit(client, "elastic", argv, replicas={"min": 2, "max": 3})
    job = running(client, gang, 2)
    assert held not in {m.node_id for m in job.attempt.members}
    first = [said(workers, gang, rank, f"rank {rank}: started") for rank in (0, 1)]
    for rank, lines in enumerate(first):
        assert re.fullmatch(rf"rank {rank}: started with WORLD_SIZE=2 \(pid \d+\)", lines[0])
    # The holder ends: the gang grows into its node by rank 2.
    client.cancel_job(holder)
    job = running(client, gang, 3)
    assert job.attempt.members[2].node_id == held
    grown = said(workers, gang, 2, "rank 2: started")
    assert re.fullmatch(r"rank 2: started with WORLD_SIZE=3 \(pid \d+\)", grown[0])
    for rank in (0, 1):
        said(workers, gang, rank, f"rank {rank}: membership 1: world size 3, hosts {HOSTS}")
    # A gang waits for that node: the elastic gang gives rank 2 back.
    needy = submit(client, "needy", sleeper)
    assert running(client, needy, 1).attempt.members[0].node_id == held
    job = running(client, gang, 2)
    assert job.attempt.number == 1 and job.attempts_made == 1
    assert [m.generation for m in job.attempt.members] == [0, 0]
    stopped = said(workers, gang, 2, "rank 2: stopped at step")
    assert stopped[:1] == grown[:1] and len(stopped) == 2  # told of nothing, then stopped
    (rank_2_dir,) = member_dirs(workers, gang, 2)
    assert (rank_2_dir / "exit.json").exists()
    for rank in (0, 1):
        lines = said(workers, gang, rank, f"rank {rank}: membership 2")
        assert lines == [
            first[rank][0],
            f"rank {rank}: membership 1: world size 3, hosts {HOSTS}",
            f"rank {rank}: membership 2: world size 2, hosts {TWO_HOSTS}",
        ]
        (member_dir,) = member_dirs(workers, gang, rank)
        assert not (member_dir / "exit.json").exists()
        told = [json.loads(x) for x in (member_dir / "membership").read_text().splitlines()]
        assert [(t["membership"], t["world_size"], t["rank"]) for t in told] == [
            (0, 2, rank),
            (1, 3, rank),
            (2, 2, rank),
        ]
    return gang, needy, held


def test_an_elastic_gang_grows_into_a_freed_node_and_gives_it_back_to_a_waiting_gang(
    one: OneReplica,
) -> None:
    for job_id in grow_then_shrink(one)[:2]:
        one.client.cancel_job(job_id)


def test_a_rank_given_back_grows_again_when_its_node_is_freed(one: OneReplica) -> None:
    client, workers = one.client, one.workers
    gang, needy, held = grow_then_shrink(one)
    client.cancel_job(needy)
    job = running(client, gang, 3, timeout_s=10)
    assert job.attempt.members[2].node_id == held
    for rank in (0, 1):
        said(workers, gang, rank, f"rank {rank}: membership 3: world size 3, hosts {HOSTS}")
    dirs = member_dirs(workers, gang, 2)
    # A member of its own: a generation above the one given back (a1.t2.r2.g1, then .g3).
    dirs.sort(key=lambda d: int(d.name.rpartition(".g")[2]))
    generations = [int(d.name.rpartition(".g")[2]) for d in dirs]
    assert len(dirs) == 2 and generations[0] < generations[1], dirs

    def first_line() -> str | None:
        log = dirs[-1] / "output.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return lines[0] if lines else None

    line = wait_for("rank 2's new member to start", first_line, timeout_s=20)
    assert re.fullmatch(r"rank 2: started with WORLD_SIZE=3 \(pid \d+\)", line)
    client.cancel_job(gang)


def test_the_torchrun_example_lets_its_rendezvous_admit_the_gangs_min_to_max() -> None:
    spec = load_job_spec_file(EXAMPLES / "elastic.yaml")
    assert spec.elastic is not None
    (command,) = spec.command
    assert f"--nnodes={spec.elastic.min_replicas}:{spec.replicas} " in command
    for flag in ("--rdzv-backend=c10d", "--rdzv-id=$SYNAPSE_JOB_ID", "--max-restarts="):
        assert flag in command
    # torchrun follows its peers by itself: a signal it does not handle would end it.
    assert spec.elastic.signal == ""
