"""The desired members a heartbeat answers with: remembered per node across snapshots,
recomputed as soon as a record they came from changed (the node's jobs, or an address
of one of their nodes), and equal to a scan of every job."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as c
from synapse_ha.core.snapshot import SnapshotBuilder, apply_tracked
from synapse_ha.core.views import desired_by_node
from synapse_ha.service.heartbeat import DesiredMembers
from tests.core.harness import Cluster, job, node


class Tracked(Cluster):
    """A test cluster whose commands go through the copy-on-write snapshots, as on a
    replica."""

    def __post_init__(self) -> None:
        self.builder = SnapshotBuilder()
        super().__post_init__()

    def do(self, command: c.Command) -> c.Result:
        result = apply_tracked(self.state, command, self.builder.changes)
        self.log.append(command)
        return result


def test_an_answer_is_kept_until_a_record_it_came_from_changes() -> None:
    cl = Tracked()
    cl.add(node("n1"), node("n2"), node("n3"))
    first = cl.submit(job(replicas=2, gpu=8))
    cl.run_pass()
    desired = DesiredMembers()
    snap = cl.builder.take(cl.state)
    on_node = {n: desired.of(snap, n) for n in ("n1", "n2", "n3")}
    assert on_node == {n: desired_by_node(snap).get(n, []) for n in ("n1", "n2", "n3")}
    placed = [n for n, members in on_node.items() if members]
    assert len(placed) == 2 and all(len(on_node[n]) == 1 for n in placed)

    # A command elsewhere (a new pending job) leaves the answers as they were: the same
    # lists, not recomputed.
    cl.submit(job(replicas=3, gpu=8))
    later = cl.builder.take(cl.state)
    for n in placed:
        assert desired.of(later, n) is on_node[n]

    # Rank 0's node comes back at another address: every member's rendezvous changes.
    rank0 = on_node[placed[0]][0]
    master = next(n for n in placed if on_node[n][0].rank == 0)
    info = dataclasses.replace(cl.state.nodes[master].info, address="10.9.9.9")
    assert cl.do(c.RegisterNode(info, cl.now)).ok
    moved = cl.builder.take(cl.state)
    for n in placed:
        assert desired.of(moved, n)[0].master_addr == "10.9.9.9"
    assert rank0.master_addr != "10.9.9.9"

    # The job is cancelled: its nodes want nothing of it any more.
    assert cl.do(c.CancelJob(first, now_ms=cl.now)).ok
    cancelled = cl.builder.take(cl.state)
    for n in ("n1", "n2", "n3"):
        assert desired.of(cancelled, n) == desired_by_node(cancelled).get(n, [])
        assert all(d.job_id != first for d in desired.of(cancelled, n))
    # A heartbeat holding an older snapshot gets the newer answer, never an older one.
    assert desired.of(snap, placed[0]) == []
    # A fresh cache answers an old snapshot from that snapshot.
    assert DesiredMembers().of(snap, placed[0]) == on_node[placed[0]]


def test_a_node_answered_from_the_same_state_again_costs_no_walk(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cl = Tracked()
    cl.add(node("n1"), node("n2"))
    cl.submit(job(replicas=2, gpu=8))
    cl.run_pass()
    snap = cl.builder.take(cl.state)
    walks: list[str] = []
    real = type(snap).jobs_on_node

    def counted(self, node_id: str) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
        walks.append(node_id)
        return real(self, node_id)

    monkeypatch.setattr(type(snap), "jobs_on_node", counted)
    desired = DesiredMembers()
    first = desired.of(snap, "n1")
    assert walks and set(walks) == {"n1"} and len(first) == 1
    walked = len(walks)
    # The steady case: heartbeats while nothing changed.
    assert desired.of(snap, "n1") is first
    assert len(walks) == walked
