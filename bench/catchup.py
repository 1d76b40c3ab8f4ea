"""Catch-up benchmark: a replica restarted after a long log, under a submission stream.

Three real replicas on loopback (mutual TLS, the benchmark calling as the admin by
certificate). The benchmark

1. fills the Raft log up to index ``--entries`` with submissions (``--window`` in
   flight, from this process; commands proposed together share one log entry),
2. stops one follower with ``kill -9`` and keeps a submission stream running for
   ``--down-s`` seconds (the log moves on without it),
3. restarts it, the stream still running, and measures the time until it **serves**:
   its applied index has reached the commit index the leader reported at its restart, and
   it answers ``GetClusterStatus`` naming the leader, healthy.

It also reports the sizes on disk (journal and snapshot of the restarted replica), the
log indexes involved and the count of elections while the log was filled (each would be
a leader that stopped sending heartbeats; there should be none). A busy machine may still
cost an election: the submissions follow the new leader, the run carries on with the
replica leading after the fill (a follower of it is the one stopped), and each replica's
own status is asked again while it is slow to answer. Prints one JSON object
(``--out`` also writes it to a file); ``--smoke`` runs a tiny version in seconds.
``--replica-arg`` passes a flag to the replicas (for instance
``--replica-arg=--compaction-entries=5000``). ``--replay N`` fills on past ``--entries``
until the replica to be stopped holds ``N`` entries beyond its newest snapshot, the most
it replays when restarted (the worst case is just before its next compaction: 20,000
entries or 300 s of entries by default, whichever comes first; the run stops with an
error when a compaction comes first). ``--profile DIR`` samples the restarted
replica with ``py-spy`` (GIL holder only) from its start until it serves, and adds the
summary to the report.
Target on a two-core machine: serves within 5 s after 100,000 entries.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import wait_for
from bench.quorum import LeaderStubs, Stream, pipelined, small_spec
from bench.report import emit
from bench.throughput import Profiler
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.raft.snapshot_file import read_snapshot_entries
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def status(cluster: LocalReplicas, replica: Any) -> pb.ReplicaStatus:
    """The replica's own status, asked again (bounded) while a busy machine delays it."""
    return wait_for(
        f"{replica.replica_id}'s status",
        lambda: cluster.local_status(replica, timeout_s=5.0),
        timeout_s=60,
    )


def serves(cluster: LocalReplicas, replica: Any, target: int) -> bool:
    """The replica applied the log up to ``target`` (what the leader had committed when
    the replica was restarted), and it answers GetClusterStatus with a healthy leader.

    A fixed target, not the leader's commit index at each look: under the submission
    stream that index moves on while the replica is asked, and a replica that keeps pace
    with the stream one round trip behind it would never be seen to serve."""
    if cluster.local_status(replica).last_applied < target:
        return False
    with cluster.channel(replica.grpc) as channel:
        answer = pb_grpc.SchedulerServiceStub(channel).GetClusterStatus(
            pb.GetClusterStatusRequest(), timeout=1.0
        )
    return bool(answer.leader_address) and all(
        r.healthy for r in answer.replicas if r.grpc_address == replica.grpc
    )


def run(
    root: Path,
    entries: int,
    down_s: float,
    window: int,
    extra: list[str],
    verbose: bool = False,
    profile: Path | None = None,
    replay: int = 0,
) -> dict[str, Any]:
    cluster = LocalReplicas(root / "cu", extra_args=extra)
    stream: Stream | None = None
    leaders = LeaderStubs(cluster)
    try:
        cluster.start()
        leader = cluster.serving_leader(timeout_s=60)
        first_term = status(cluster, leader).term
        fill_started = time.monotonic()
        submitted = 0
        victim = cluster.followers(leader)[0]

        def snapshot_index() -> int:
            """The log index of the victim's newest snapshot (0: none yet)."""
            dump = victim.data_dir / "raft.dump"
            return read_snapshot_entries(str(dump))[0][1] if dump.exists() else 0

        def settled_snapshot_index() -> int:
            """:func:`snapshot_index` once no snapshot is being written (the victim writes
            ``raft.dump.partial`` and renames it when done) and two reads a moment apart
            agree: a compaction in flight would otherwise move it just after it was read."""
            partial = victim.data_dir / "raft.dump.partial"
            for _ in range(600):  # bounded: a minute
                first = snapshot_index()
                time.sleep(0.1)
                if not partial.exists() and snapshot_index() == first:
                    return first
            raise RuntimeError("the victim's snapshot file never settled")

        replay_from: int | None = None  # the victim's snapshot the replay counts from
        compactions = 0  # snapshots the victim wrote during the replay phase
        with cluster.channel(leader.grpc) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)
            for _ in range(10_000):  # bounded: 2,000 submissions a round while filling
                commit = status(cluster, leader).commit_index
                since = settled_snapshot_index() if commit >= entries else snapshot_index()
                if commit < entries:
                    chunk = max(20, min(2_000, entries - commit))
                elif commit - since < replay:
                    if replay_from is not None and since != replay_from:
                        compactions += 1  # counting starts again from the new snapshot
                        if compactions > 2:
                            raise RuntimeError(
                                f"the victim wrote a snapshot before it held {replay} "
                                "entries past the previous one, three times (compaction "
                                "runs every 20,000 entries or 300 s, whichever comes "
                                "first): ask for a shorter --replay"
                            )
                    replay_from = since
                    # Small steps, so as not to run past the next compaction.
                    chunk = max(20, min(2_000, replay - (commit - since)))
                else:
                    break
                requests = [
                    pb.SubmitJobRequest(spec=small_spec(f"f{i}"), request_id=f"f{i}")
                    for i in range(submitted, submitted + chunk)
                ]
                pipelined(stub.SubmitJob, requests, window, follow=leaders.submit_call)
                submitted += len(requests)
            else:
                raise RuntimeError(f"the victim never held {replay} entries past its snapshot")
        fill_s = time.monotonic() - fill_started
        leader = cluster.serving_leader(timeout_s=60)
        if victim is leader:  # an election moved leadership to it while the log filled
            victim = cluster.followers(leader)[0]
        filled = status(cluster, leader)
        stream = Stream(cluster.grpc_addresses, cluster.transport)
        stream.start()
        wait_for("acks from the stream", lambda: stream.acks, timeout_s=30)
        # pysyncobj compacts by the length of its whole log, not by the entries past the
        # snapshot: a compaction may come just after the fill and leave too little to
        # replay. Top the log up again past the new snapshot (bounded).
        with cluster.channel(leader.grpc) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)
            for _ in range(3):
                since = settled_snapshot_index()
                commit = status(cluster, leader).commit_index
                if commit - since >= replay:
                    break
                requests = [
                    pb.SubmitJobRequest(spec=small_spec(f"f{i}"), request_id=f"f{i}")
                    for i in range(submitted, submitted + max(20, replay - (commit - since)))
                ]
                pipelined(stub.SubmitJob, requests, window, follow=leaders.submit_call)
                submitted += len(requests)
        held_at_kill = status(cluster, victim).last_applied
        cluster.kill(victim)
        time.sleep(down_s)
        acks_down = len(stream.acks)
        before = status(cluster, leader)
        data = victim.data_dir
        journal_bytes = _size(data / "raft.journal")
        dump_bytes = _size(data / "raft.dump")
        restored_at = snapshot_index()  # the file the restart loads (the victim is down)
        journal_past_snapshot = held_at_kill - restored_at
        restarted = time.monotonic()
        cluster.start(victim)
        target = status(cluster, leader).commit_index
        with Profiler(profile, "restart", victim) as profiler:
            wait_for(
                "the restarted replica to serve",
                lambda: serves(cluster, victim, target),
                timeout_s=600,
                every_s=0.05,
            )
            serve_s = time.monotonic() - restarted
        after = status(cluster, victim)
        replayed = after.last_applied - restored_at
        stream.stop.set()
        stream.join(timeout=20)
        if verbose:
            print(victim.log_tail(6000), file=sys.stderr)
        return {
            "log_entries_target": entries,
            "submissions_to_fill": submitted,
            "fill_window": window,
            "replica_args": extra,
            "fill_s": round(fill_s, 1),
            "raft_terms_during_fill": filled.term - first_term,
            "commit_index_after_fill": filled.commit_index,
            "victim_entries_past_snapshot_at_kill": journal_past_snapshot,
            "down_s": down_s,
            "acknowledged_while_down": acks_down,
            "commit_index_at_restart": before.commit_index,
            "victim_journal_bytes": journal_bytes,
            "victim_dump_bytes": dump_bytes,
            "restart_to_serving_s": round(serve_s, 3),
            "victim_applied_when_serving": after.last_applied,
            "stream_acks": len(stream.acks),
            "snapshot_index_restored": restored_at,
            "entries_applied_until_serving": replayed,
            "restart_profile": profiler.summary(replayed),
        }
    except (Exception, grpc.RpcError):
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        if stream is not None:
            stream.stop.set()
        leaders.close()
        cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run that takes seconds")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--down-s", type=float, default=10.0)
    parser.add_argument(
        "--window", type=int, default=4, help="submissions in flight while filling the log"
    )
    parser.add_argument("--replica-arg", action="append", default=[], help="a replica flag")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--profile", type=Path, help="sample the restarted replica into DIR")
    parser.add_argument(
        "--replay",
        type=int,
        default=0,
        help="after --entries, fill on until the victim holds this many entries past its "
        "newest snapshot (under what it compacts at: 20,000 entries or 300 s of them)",
    )
    parser.add_argument("--verbose", action="store_true", help="print the restarted replica's log")
    args = parser.parse_args()
    entries, down_s = (800, 1.0) if args.smoke else (args.entries, args.down_s)
    with tempfile.TemporaryDirectory(prefix="synapse-catchup-") as tmp:
        report = {
            "smoke": args.smoke,
            **run(
                Path(tmp),
                entries,
                down_s,
                args.window,
                args.replica_arg,
                args.verbose,
                args.profile,
                args.replay,
            ),
        }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
