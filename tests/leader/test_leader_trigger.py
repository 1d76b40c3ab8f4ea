"""When the leader plans: as soon as a command is applied (no timer tick, no hint from
the driver), one pass for a burst, and no pass while nothing changed."""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from tests.core.harness import job, node
from tests.leader.fakes import FakeLog
from tests.leader.test_leader import elected


class CountingTimer:
    """The loop's pass timer: two reads per scheduling pass, each pass costing 1 ms."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.reads * 0.0005

    @property
    def passes(self) -> int:
        return self.reads // 2


def test_a_submission_is_planned_at_the_next_step_without_any_hint() -> None:
    log = FakeLog()
    log.propose(cmd.RegisterNode(info=node("n1", gpus=8), now_ms=0))
    timer = CountingTimer()
    loop, _ = elected(log, now=1_000, timer=timer)
    loop.step(1_000)
    before = timer.passes
    log.propose(cmd.SubmitJob(spec=job("a", gpu=4), request_id="a", now_ms=1_010))
    # 10 ms later: well inside the 500 ms period, and note_state_changed was never called.
    assert "proposing to bind 1 gangs" in loop.step(1_010)
    assert timer.passes == before + 1


def test_a_burst_of_submissions_is_planned_in_one_pass() -> None:
    log = FakeLog()
    for n in ("n1", "n2"):
        log.propose(cmd.RegisterNode(info=node(n, gpus=8), now_ms=0))
    timer = CountingTimer()
    loop, _ = elected(log, now=1_000, timer=timer)
    loop.step(1_000)
    before = timer.passes
    for i in range(8):
        log.propose(cmd.SubmitJob(spec=job(f"j{i}", gpu=2), request_id=f"j{i}", now_ms=1_010))
    assert "proposing to bind 8 gangs (8 members)" in loop.step(1_020)
    assert timer.passes == before + 1
    binds = log.of_type(cmd.BindPlan)
    assert len(binds[-1].placements) == 8


def test_no_pass_runs_while_nothing_is_applied() -> None:
    log = FakeLog()
    log.propose(cmd.RegisterNode(info=node("n1", gpus=8), now_ms=0))
    log.propose(cmd.SubmitJob(spec=job("big", gpu=16), request_id="big", now_ms=0))
    timer = CountingTimer()
    loop, _ = elected(log, now=1_000, timer=timer)
    loop.step(1_000)
    loop.step(1_020)  # the reasons the first pass proposed are applied: planned once more
    settled = timer.passes
    for now in range(1_040, 1_400, 20):
        loop.step(now)
    assert timer.passes == settled  # the waiting gang's state did not change
    loop.step(1_600)  # the period: back-off timers expire without any command
    assert timer.passes == settled + 1
