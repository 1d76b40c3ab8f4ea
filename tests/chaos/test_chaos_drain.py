"""The final wait of a scenario: it lasts while jobs keep finishing, and gives up when
none has for the stall bound or at the cap (a fake clock; no cluster)."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from chaos.run import drain


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run(
    progress: Callable[[float], tuple[int, int]], cap_s: float, stall_s: float
) -> tuple[str, float]:
    clock = Clock()
    said = drain(
        lambda: progress(clock.now), cap_s, stall_s, poll_s=1.0, clock=clock, sleep=clock.sleep
    )
    return said, clock.now


def test_a_slow_steady_drain_is_waited_for_past_the_stall_bound() -> None:
    # One job in 100 finishes every 5 s: 500 s in all, far beyond the 60 s stall bound.
    said, took = run(lambda t: (min(100, int(t // 5)), 100), cap_s=1_000, stall_s=60)
    assert said == "every job final"
    assert 500 <= took <= 501


def test_no_job_finishing_for_the_stall_bound_ends_the_wait() -> None:
    # 40 finish in the first 40 s, then nothing.
    said, took = run(lambda t: (min(40, int(t)), 100), cap_s=1_000, stall_s=60)
    assert said == "60 of 100 jobs not final: none became final for 60 s"
    assert 100 <= took <= 101


def test_the_cap_ends_a_drain_that_still_progresses() -> None:
    said, took = run(lambda t: (int(t // 5), 1_000), cap_s=300, stall_s=60)
    assert said == "940 of 1000 jobs not final after 300 s"
    assert took == 300


def test_an_unreachable_cluster_makes_no_progress() -> None:
    def unreachable(t: float) -> tuple[int, int]:
        raise grpc.RpcError()

    said, took = run(unreachable, cap_s=300, stall_s=60)
    assert said == "no answer from the cluster: none became final for 60 s"
    assert took == 60
