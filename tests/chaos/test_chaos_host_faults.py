"""The loss, freeze, disk and clock fault kinds: their schedules, the checker's rules for
them on hand-made histories, the summary line, and the host machinery that can run
without a cluster (the clock shim, a small disk filled and emptied)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from chaos import hosts, ledger, nemesis, net
from chaos.__main__ import configs, parse_kinds, summary_line
from chaos.checker import (
    THAW_KILL_BOUND_MS,
    EffectRecord,
    FaultRecord,
    History,
    MemberRecord,
    check_history,
    check_run,
    thaw_writes,
)
from chaos.nemesis import FaultTimeouts
from chaos.run import ScenarioResult
from tests.chaos.test_chaos_checker import MS, clean_history

CI_SKIPPED = ("clock-jump-forward", "clock-jump-back")


def kinds(history: History) -> set[str]:
    return {v.kind for v in check_history(history)}


# ------------------------------------------------------------------- schedules


def test_the_ci_configuration_plans_at_least_100_faults_of_at_least_14_kinds() -> None:
    usable = tuple(k for k in nemesis.ALL_FAULTS if k not in CI_SKIPPED)
    planned = configs([1], ["targeted", "random", "five-membership"], 300.0, usable)
    steps = [s for cfg in planned for s in cfg.steps]
    assert len(steps) >= 100
    assert len({s.kind for s in steps}) >= 14
    assert not {s.kind for s in steps} & set(CI_SKIPPED)


def test_every_new_kind_is_scheduled_and_crosses_its_threshold() -> None:
    t = FaultTimeouts()
    assert set(nemesis.HOST_FAULTS) <= set(nemesis.ALL_FAULTS)
    for seed in range(20):
        for step in nemesis.targeted_schedule(seed, t):
            if step.kind == nemesis.FREEZE_HOST:
                assert step.duration_s > t.dead_timeout_s
            if step.kind in (nemesis.CLOCK_JUMP_FORWARD, nemesis.CLOCK_JUMP_BACK):
                jump = nemesis.clock_jump_s(step.kind, step.pick)
                assert abs(jump) > 10 * t.dead_timeout_s
                assert (jump > 0) == (step.kind == nemesis.CLOCK_JUMP_FORWARD)


def test_skipped_kinds_are_never_scheduled_and_unknown_ones_are_refused() -> None:
    kept = tuple(k for k in nemesis.ALL_FAULTS if k != nemesis.FREEZE_HOST)
    assert nemesis.FREEZE_HOST not in {s.kind for s in nemesis.targeted_schedule(1, kinds=kept)}
    assert nemesis.FREEZE_HOST not in {
        s.kind for s in nemesis.random_schedule(1, 600.0, kinds=kept)
    }
    assert parse_kinds("packet-loss, freeze-host") == ["packet-loss", "freeze-host"]
    with pytest.raises(Exception, match="'nope' is not one of"):
        parse_kinds("nope")


def test_one_way_loss_names_only_one_direction() -> None:
    assert net.one_way(["a"], ["b", "c"]) == {("a", "b"), ("a", "c")}
    assert net.cut(["a"], ["b"]) == {("a", "b"), ("b", "a")}


# --------------------------------------------------------------------- checker


def frozen_history(write_ms: int, *, frozen: bool = True) -> History:
    """clean_history, where j2's first attempt (token 4, rank 1 on w2) was frozen with
    its host until 6,200 ms, after token 6 started at 6,000 ms, and wrote a heartbeat at
    ``write_ms``."""
    history = clean_history()
    history.members.append(MemberRecord("heartbeat", "j2", 1, 4, 1, "w2", write_ms * MS, 11))
    if frozen:
        history.faults.append(
            FaultRecord(
                "freeze-host", ("w2",), 800 * MS, 6_200 * MS, frozen=(("j2", 4),), frozen_node="w2"
            )
        )
    return history


def test_a_thawed_member_writing_at_once_is_counted_not_flagged() -> None:
    history = frozen_history(6_300)
    assert check_history(history) == []
    assert thaw_writes(history) == ["j2/4 rank 1: heartbeat"]
    # Its request to the sink, made before the supervisor killed it, is listed too; the
    # sink turned it away (it had seen token 6), so nothing stale was written.
    history.members.append(MemberRecord("effect", "j2", 1, 4, 1, "w2", 6_310 * MS, 11))
    history.effects.insert(-2, EffectRecord("j2", 4, 1, False, 6_320 * MS, highest_before=6))
    assert check_history(history) == []
    assert thaw_writes(history) == ["j2/4 rank 1: effect", "j2/4 rank 1: heartbeat"]
    # The same write without the freeze is an ordinary overlap.
    assert kinds(frozen_history(6_300, frozen=False)) == {"overlap"}


def test_a_thawed_member_still_writing_after_the_bound_is_a_thaw_overlap() -> None:
    late = 6_200 + THAW_KILL_BOUND_MS + 50
    found = check_history(frozen_history(late))
    assert [v.kind for v in found] == ["thaw-overlap"]
    assert "token 4" in found[0].detail and "token 6" in found[0].detail


def test_a_gang_frozen_on_two_hosts_at_once_has_a_thaw_window_on_each() -> None:
    # Two soak lanes froze two hosts of j2's first attempt at once; w3's thaw came later
    # and is listed last. The write on w2 right after w2's own thaw is inside w2's window.
    history = frozen_history(6_300)
    history.faults.append(
        FaultRecord(
            "freeze-host", ("w3",), 900 * MS, 9_000 * MS, frozen=(("j2", 4),), frozen_node="w3"
        )
    )
    assert check_history(history) == []
    # On w3 a write may come as late as w3's own thaw allows, not w2's.
    history.members.append(MemberRecord("heartbeat", "j2", 1, 4, 0, "w3", 9_500 * MS, 12))
    assert check_history(history) == []
    late = 9_000 + THAW_KILL_BOUND_MS + 50
    history.members.append(MemberRecord("heartbeat", "j2", 1, 4, 0, "w3", late * MS, 12))
    assert kinds(history) == {"thaw-overlap"}


def test_a_member_that_started_too_late_for_the_nemesis_list_is_frozen_all_the_same() -> None:
    # j2's first attempt started on w2 just before the freeze, after the nemesis had
    # listed the host's gangs: the fault names no gang, but the whole host was frozen.
    history = frozen_history(6_300)
    history.faults[-1] = dataclasses.replace(history.faults[-1], frozen=())
    assert check_history(history) == []
    assert thaw_writes(history) == ["j2/4 rank 1: heartbeat"]
    late = 6_200 + THAW_KILL_BOUND_MS + 50
    history = frozen_history(late)
    history.faults[-1] = dataclasses.replace(history.faults[-1], frozen=())
    assert kinds(history) == {"thaw-overlap"}
    # A freeze of another host excuses nothing on w2.
    history = frozen_history(6_300)
    history.faults[-1] = dataclasses.replace(history.faults[-1], frozen=(), frozen_node="w9")
    assert kinds(history) == {"overlap"}


def test_a_write_between_two_freezes_of_one_host_is_not_excused_by_the_second() -> None:
    # w2 was frozen with j2's first attempt twice; a write after the first thaw's bound
    # and before the second freeze, while token 6 ran, was made by a running member.
    between = 6_200 + THAW_KILL_BOUND_MS + 300
    history = frozen_history(between)
    history.faults.append(
        FaultRecord(
            "freeze-host", ("w2",), 9_000 * MS, 12_000 * MS, frozen=(("j2", 4),), frozen_node="w2"
        )
    )
    assert kinds(history) == {"thaw-overlap"}


def test_a_superseded_write_the_sink_accepted_is_a_stale_write() -> None:
    history = frozen_history(6_300)
    # Rank 1 of token 4, thawed, asks the sink; the sink had seen no token above 4 yet
    # and accepted, although token 6 had started at 6,000 ms.
    history.members.append(MemberRecord("effect", "j2", 1, 4, 1, "w2", 6_310 * MS, 11))
    history.effects.insert(-2, EffectRecord("j2", 4, 1, True, 6_320 * MS, highest_before=4))
    found = [v for v in check_history(history) if v.kind == "stale-write"]
    assert len(found) == 1
    assert "token 4" in found[0].detail and "token 6" in found[0].detail
    # The sink refusing it is fine.
    refused = frozen_history(6_300)
    refused.effects.insert(-2, EffectRecord("j2", 4, 1, False, 6_320 * MS, highest_before=4))
    assert check_history(refused) == []


def test_a_write_after_the_thaw_of_a_node_declared_dead_is_stale() -> None:
    history = clean_history()
    # j1 (token 3) was frozen on w1 from 500 to 1,900 ms; its node was declared dead at
    # 1,200 ms; rank 0's effect was accepted at 2,000 ms, after the thaw, with no newer
    # attempt started anywhere.
    freeze = FaultRecord(
        "freeze-host", ("w1",), 500 * MS, 1_900 * MS, frozen=(("j1", 3),), frozen_node="w1"
    )
    history.faults.append(freeze)
    assert check_history(history) == []  # the node was not declared dead: still current
    history.faults[-1] = FaultRecord(
        "freeze-host",
        ("w1",),
        500 * MS,
        1_900 * MS,
        frozen=(("j1", 3),),
        frozen_node="w1",
        declared_dead_ns=1_200 * MS,
    )
    found = check_history(history)
    assert {v.kind for v in found} == {"stale-write"}
    assert all("declared dead" in v.detail for v in found)
    # Thawed when the bound ran out with no newer attempt of j1 started: unfenced, so
    # nothing could refuse the resumed member's first write and the model allows it.
    history.faults[-1] = dataclasses.replace(history.faults[-1], unfenced=(("j1", 3),))
    assert check_history(history) == []


def test_a_node_declared_dead_during_a_clock_jump_is_early_dead() -> None:
    history = clean_history()
    history.faults.append(FaultRecord("clock-jump-forward", ("r1",), 0, 3_000 * MS))
    assert check_history(history) == []
    history.faults.append(
        FaultRecord("clock-jump-back", ("r1",), 4_000 * MS, 7_000 * MS, declared_dead=("w3",))
    )
    found = check_history(history)
    assert [v.kind for v in found] == ["early-dead"]
    assert "w3" in found[0].detail and "clock-jump-back" in found[0].detail


def test_a_node_silent_for_the_dead_timeout_may_die_during_a_clock_jump() -> None:
    """A node still silent after the fault before the jump (a cut that just healed) can
    reach the dead timeout for real during the jump: not early. Short of the timeout, it
    is early."""
    history = clean_history()
    history.faults.append(
        FaultRecord(
            "clock-jump-forward",
            ("r2",),
            0,
            3_000 * MS,
            declared_dead=("w3",),
            silence_bound_ms=(("w3", 4_000),),
            dead_timeout_ms=4_000,
        )
    )
    assert check_history(history) == []
    history.faults.append(
        FaultRecord(
            "clock-jump-back",
            ("r2",),
            4_000 * MS,
            7_000 * MS,
            declared_dead=("w1",),
            silence_bound_ms=(("w1", 3_999),),
            dead_timeout_ms=4_000,
        )
    )
    found = check_history(history)
    assert [v.kind for v in found] == ["early-dead"]
    assert "w1" in found[0].detail and "at most 3999 ms" in found[0].detail


def test_check_run_reads_the_fault_records(tmp_path: Path) -> None:
    from tests.chaos.test_chaos_checker import test_check_run_reads_a_saved_run_directory

    test_check_run_reads_a_saved_run_directory(tmp_path)  # writes a run with one overlap
    with ledger.Appender(tmp_path / ledger.FAULTS) as out:
        out.append(
            {
                "type": "fault",
                "kind": "freeze-host",
                "targets": ["w2"],
                "start_ns": 800 * MS,
                "end_ns": 6_500 * MS,
                "frozen": [["j2", 4]],
                "frozen_node": "w2",
            }
        )
        out.append(
            {
                "type": "fault",
                "kind": "clock-jump-forward",
                "targets": ["r1"],
                "start_ns": 9_000 * MS,
                "end_ns": 9_500 * MS,
                "declared_dead": ["w1"],
            }
        )
        out.append(
            {
                "type": "fault",
                "kind": "clock-jump-back",
                "targets": ["r1"],
                "start_ns": 10_000 * MS,
                "end_ns": 12_000 * MS,
                "declared_dead": ["w2"],
                "silence_bound_ms": {"w2": 5_200},
                "dead_timeout_ms": 4_000,
            }
        )
    # The heartbeat at 7,000 ms is inside the thaw window now; the dead node is not.
    assert [v.kind for v in check_run(tmp_path)] == ["early-dead"]


# ----------------------------------------------------------------- summary line


def test_the_summary_line_names_faults_kinds_jobs_violations_scenarios_and_time(
    tmp_path: Path,
) -> None:
    results = []
    for name, kinds_run in (("targeted", ["packet-loss", "freeze-host"]), ("random", ["bridge"])):
        run_dir = tmp_path / name
        run_dir.mkdir()
        with ledger.Appender(run_dir / ledger.FAULTS) as out:
            for kind in kinds_run:
                out.append({"type": "fault", "kind": kind})
        results.append(ScenarioResult(name, 1, run_dir, len(kinds_run), 5, [], False))
    line = summary_line(results, ["freeze-host: no freezer"], 123.4)
    assert line == (
        "chaos: 3 faults, 3 kinds, 10 jobs (0 sbatch: 0 steps, 0 tasks), 0 violations, "
        "1 kinds skipped "
        "(freeze-host: no freezer); random=1 targeted=2; 123 s"
    )


# --------------------------------------------------------------------- machinery


def test_the_clock_shim_moves_the_wall_clock_only(tmp_path: Path) -> None:
    clock = tmp_path / "r1.clock"
    env = {**os.environ, **hosts.clock_env(clock, os.environ.get("PYTHONPATH", ""))}
    hosts.set_clock(clock, 500.0)
    code = (
        "import json, time, datetime\n"
        "print(json.dumps([time.time() - datetime.datetime.now().timestamp(),"
        " time.time_ns() / 1e9 - datetime.datetime.now().timestamp()]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    offsets = json.loads(done.stdout)
    assert all(499.0 < o < 501.0 for o in offsets), offsets
    hosts.set_clock(clock, 0.0)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert all(abs(o) < 1.0 for o in json.loads(done.stdout))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_small_disk_fills_to_the_last_byte_and_empties(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    hosts.mount_disk(disk, size="1m")
    try:
        assert hosts.is_our_disk(disk)
        taken = hosts.fill(disk)
        assert taken > 512 * 1024
        with pytest.raises(OSError, match="No space left"):
            (disk / "more").write_bytes(b"x" * 8192)
        assert hosts.fill(disk) < 4096  # filling a full disk again is not an error
        hosts.unfill(disk)
        (disk / "more").write_bytes(b"x" * 8192)
    finally:
        # Only this test's disk: a chaos run may be using the machine's cgroups meanwhile.
        hosts.sweep_disks(tmp_path)
    assert not hosts.is_our_disk(disk)


def test_fault_kind_counts_come_from_the_fault_log(tmp_path: Path) -> None:
    from chaos.__main__ import fault_kinds

    with ledger.Appender(tmp_path / ledger.FAULTS) as out:
        for kind in ("packet-loss", "packet-loss", "one-way-loss"):
            out.append({"type": "fault", "kind": kind})
    assert fault_kinds(tmp_path) == Counter({"packet-loss": 2, "one-way-loss": 1})


def test_the_soak_plan_walks_the_seeds_with_the_targeted_scenario_every_tenth() -> None:
    import itertools

    from chaos.__main__ import soak_plan

    kept = tuple(k for k in nemesis.ALL_FAULTS if k not in CI_SKIPPED)
    plan = list(itertools.islice(soak_plan(1000, 300.0, kept), 12))
    assert [(c.name, c.seed) for c in plan[:3]] == [
        ("targeted", 1000),
        ("random", 1000),
        ("random", 1001),
    ]
    assert [c.seed for c in plan[2:]] == list(range(1001, 1011))[: len(plan) - 2]
    assert all(s.kind in kept for c in plan for s in c.steps)


def test_a_claimed_token_fences_an_older_attempt_at_the_sink(tmp_path: Path) -> None:
    from chaos.checker import load_history
    from chaos.sink import FencingSink

    with ledger.Appender(tmp_path / ledger.EFFECTS) as out:
        sink = FencingSink(out)
        base = {"job": "j1", "world": 1, "rank": 0}
        assert sink.decide({**base, "op": "claim", "token": 6})["claimed"]
        # A thawed member of token 4 asks before token 6 committed anything: refused.
        assert not sink.decide({**base, "token": 4})["accepted"]
        assert sink.decide({**base, "token": 6})["accepted"]
    history = load_history(tmp_path)  # claim records are not effects
    assert [(e.token, e.accepted, e.highest_before) for e in history.effects] == [
        (4, False, 6),
        (6, True, 6),
    ]


def test_a_replica_deleting_an_applied_entry_is_a_violation(tmp_path: Path) -> None:
    from tests.chaos.test_chaos_checker import test_check_run_reads_a_saved_run_directory

    test_check_run_reads_a_saved_run_directory(tmp_path)  # writes a run with one overlap
    before = [v.kind for v in check_run(tmp_path)]
    (tmp_path / "r2.log").write_text(
        "2026-11-22 20:44:02,727 INFO synapse.scheduler: lost leadership in term 10\n"
        "2026-11-22 20:44:02,742 CRITICAL pysyncobj.syncobj: truncating already-applied "
        "log entries from index 280 (last applied: 281) - state machine may have diverged\n",
        encoding="utf-8",
    )
    found = check_run(tmp_path)
    assert [v.kind for v in found] == [*before, "applied-truncated"]
    assert found[-1].detail.startswith("r2: ") and "index 280" in found[-1].detail
