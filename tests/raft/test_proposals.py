"""The proposal queue keeps the log's times in its order: a command stamped before
another but queued after it leaves with the later time, so that a rule judged at a
command's time (a bind on a node a failure report made unfit) is judged at the state the
command is applied to."""

from __future__ import annotations

from typing import Any

from pysyncobj.config import FAIL_REASON

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.versioned import decode_command
from synapse_ha.raft.batch import unframe
from synapse_ha.raft.proposals import ProposalBatcher


class Log:
    """A stand-in for the replicated append: keeps each entry's commands and settles it."""

    def __init__(self) -> None:
        self.commands: list[cmd.Command] = []

    def append(self, entry: bytes, callback: Any) -> None:
        items = [decode_command(i) for i in unframe(entry)]
        self.commands += items
        callback([cmd.ok() for _ in items], FAIL_REASON.SUCCESS)


def proposed(commands: list[cmd.Command]) -> list[cmd.Command]:
    log = Log()
    batcher = ProposalBatcher(log.append, batch_forget_s=5.0)
    batcher.start()
    try:
        futures = [batcher.propose(c) for c in commands]
        for f in futures:
            f.result(timeout=5.0)
    finally:
        batcher.stop()
    return log.commands


def test_a_command_stamped_earlier_but_queued_later_leaves_with_the_later_time() -> None:
    bind = cmd.Barrier(now_ms=1_069)
    report = cmd.CancelJob(job_id="job-000001", now_ms=1_050)
    out = proposed([bind, report, cmd.Barrier(now_ms=1_100)])
    assert [c.now_ms for c in out] == [1_069, 1_069, 1_100]
    assert out[1] == cmd.CancelJob(job_id="job-000001", now_ms=1_069)  # nothing else moved


def test_commands_in_time_order_are_left_as_they_are() -> None:
    commands: list[cmd.Command] = [cmd.Barrier(now_ms=t) for t in (5, 5, 7, 1_000)]
    assert proposed(commands) == commands
