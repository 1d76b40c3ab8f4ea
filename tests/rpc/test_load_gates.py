"""The read gate: concurrency and CPU share of heavy reads, refusal after the wait limit."""

from __future__ import annotations

import threading

import pytest

from synapse_ha.rpc.load_gates import (
    Overloaded,
    ReadGate,
    ReadLimits,
    StreamRefusal,
    StreamSlots,
)


class Clocks:
    """A fake wall clock and a fake CPU clock of the calling thread."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 0.0

    def now(self) -> float:
        return self.wall

    def thread_cpu(self) -> float:
        return self.cpu


def gate(clocks: Clocks, **kw: float) -> ReadGate:
    options = {"concurrency": 2, "cpu_share": 0.25, "burst_s": 0.5, "max_wait_s": 0.0}
    options.update(kw)
    limits = ReadLimits(
        concurrency=int(options["concurrency"]),
        cpu_share=options["cpu_share"],
        burst_s=options["burst_s"],
        max_wait_s=options["max_wait_s"],
    )
    return ReadGate(
        limits,
        clock=clocks.now,
        cpu_clock=clocks.thread_cpu,
    )


def test_reads_pay_their_cpu_and_the_bucket_refills_at_the_share() -> None:
    clocks = Clocks()
    g = gate(clocks)
    with g.admit():
        clocks.cpu += 0.6  # more than the burst: the bucket goes negative
    assert g.stats().credit_s == pytest.approx(-0.1)
    with pytest.raises(Overloaded, match="CPU share"), g.admit():
        pass
    clocks.wall += 0.3  # refills 0.3 s x 0.25 = 0.075 s: still short
    with pytest.raises(Overloaded), g.admit():
        pass
    clocks.wall += 0.2  # now +0.025 s
    with g.admit():
        clocks.cpu += 0.01
    stats = g.stats()
    assert (stats.admitted, stats.refused, stats.running) == (2, 2, 0)


def test_the_bucket_never_holds_more_than_the_burst() -> None:
    clocks = Clocks()
    g = gate(clocks)
    clocks.wall += 3600
    assert g.stats().credit_s == pytest.approx(0.5)


def test_at_most_concurrency_reads_run_at_once() -> None:
    clocks = Clocks()
    g = gate(clocks, concurrency=2)
    with g.admit(), g.admit():
        with pytest.raises(Overloaded, match="2 heavy reads running"), g.admit():
            pass
        assert g.stats().running == 2
    with g.admit():
        assert g.stats().running == 1


def test_a_waiting_read_starts_when_a_running_one_ends() -> None:
    g = ReadGate(ReadLimits(concurrency=1, cpu_share=1.0, burst_s=10.0, max_wait_s=30.0))
    entered = threading.Event()
    release = threading.Event()
    second_ran = threading.Event()

    def first() -> None:
        with g.admit():
            entered.set()
            release.wait(30)

    def second() -> None:
        with g.admit():
            second_ran.set()

    a = threading.Thread(target=first)
    b = threading.Thread(target=second)
    a.start()
    assert entered.wait(30)
    b.start()
    try:
        assert not second_ran.wait(0.2)  # held back while the first runs
    finally:
        release.set()
        a.join(30)
        b.join(30)
    assert second_ran.is_set()
    assert g.stats().refused == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        ReadLimits(concurrency=0)
    with pytest.raises(ValueError, match="cpu_share"):
        ReadLimits(cpu_share=0)


def test_stream_slots_bound_each_identity_and_all_and_free_on_release() -> None:
    slots = StreamSlots(unlimited_slots=1)
    assert slots.acquire("u", True, 2, 3) is None
    assert slots.acquire("u", True, 2, 3) is None
    assert slots.acquire("u", True, 2, 3) == StreamRefusal("watch_streams_per_identity", 2, 2)
    assert slots.acquire("v", True, 2, 3) is None
    assert slots.acquire("w", True, 2, 3) == StreamRefusal("watch_streams_total", 3, 3)
    assert slots.acquire("admin", False, 2, 3) is None  # beside the limited ones
    assert slots.acquire("admin", False, 2, 3) == StreamRefusal("unlimited_streams", 1, 1)
    slots.release("u", True)
    slots.release("v", True)
    slots.release("admin", False)
    assert (slots.held("u"), slots.held("v")) == (1, 0)
    assert slots.acquire("w", True, 2, 3) is None
    assert slots.acquire("w", True, 2, 3) is None
    assert slots.acquire("admin", False, 2, 3) is None
