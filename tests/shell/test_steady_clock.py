"""The replica's clock: wall time at start plus monotonic time since, so a stepped system
clock moves none of the leader's durations (dead declarations, time limits, back-offs)."""

from __future__ import annotations

from synapse_ha.programs.scheduler import SteadyClock


class FakeClocks:
    def __init__(self) -> None:
        self.wall_ns = 1_700_000_000_000 * 1_000_000
        self.monotonic_ns = 5_000 * 1_000_000

    def wall(self) -> int:
        return self.wall_ns

    def monotonic(self) -> int:
        return self.monotonic_ns


def test_starts_at_the_wall_clock_and_advances_with_monotonic_time() -> None:
    clocks = FakeClocks()
    clock = SteadyClock(clocks.wall, clocks.monotonic)
    assert clock() == 1_700_000_000_000
    clocks.monotonic_ns += 1_500 * 1_000_000
    clocks.wall_ns += 1_500 * 1_000_000
    assert clock() == 1_700_000_001_500


def test_a_step_of_the_wall_clock_forward_or_back_does_not_move_it() -> None:
    clocks = FakeClocks()
    clock = SteadyClock(clocks.wall, clocks.monotonic)
    clocks.monotonic_ns += 2_000 * 1_000_000
    clocks.wall_ns += 389_000 * 1_000_000  # stepped forward 387 s more than elapsed
    assert clock() == 1_700_000_002_000
    clocks.wall_ns -= 800_000 * 1_000_000  # then far back
    clocks.monotonic_ns += 1_000 * 1_000_000
    assert clock() == 1_700_000_003_000
