"""Member replacement in the chaos checker (chaos/replace_rules.py): records in,
violations out. A rank placed again is the same attempt in a new generation: the rules
must let a clean replacement through, and catch two generations at once, a replaced
member's write taken after its replacement started, and what the attempt rules would
miss or invent when they ignore generations."""

from __future__ import annotations

from dataclasses import replace

from chaos.checker import EffectRecord, History, MemberRecord, check_history
from chaos.history import (
    THAW_KILL_BOUND_MS,
    AttemptHistory,
    FaultRecord,
    GpuUnhealthy,
    JobHistory,
    UnfitSpan,
)
from chaos.replace_rules import check_replacements, replaced_ranks
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.model import (
    AttemptState,
    ClusterState,
    JobState,
    MemberPlacement,
    Node,
    NodeInfo,
    NodeStatus,
    Resources,
)
from tests.chaos.test_chaos_checker import HEAL_WALL_MS, MS, clean_history, final_state

BOUND = HEAL_WALL_MS - 5_000  # every attempt of final_state() was bound then

JOB, TOKEN = "j1", 3


def member(
    rank: int, gen: int, node: str, start_ms: int, last_ms: int, *, pid: int, gpus: tuple[int, ...]
) -> list[MemberRecord]:
    """One member of j1 (token 3): start, a heartbeat every 100 ms, and its last record at
    ``last_ms`` (``term``: it was stopped)."""

    def rec(kind: str, at_ms: int) -> MemberRecord:
        return MemberRecord(
            kind, JOB, 1, TOKEN, rank, node, at_ms * MS, pid, gpus=gpus, world=2, generation=gen
        )

    return [
        rec("start", start_ms),
        *(rec("heartbeat", t) for t in range(start_ms + 100, last_ms, 100)),
        rec("term", last_ms),
    ]


def finished(records: list[MemberRecord], end_ms: int) -> list[MemberRecord]:
    """A member that committed its effect at ``end_ms``: its ``term`` becomes effect+end."""
    last = records[-1]
    return [
        *records[:-1],
        replace(last, type="effect", mono_ns=end_ms * MS),
        replace(last, type="end", mono_ns=end_ms * MS + 1, outcome="accepted"),
    ]


def accepted(rank: int, gen: int, at_ms: int, ok: bool = True) -> EffectRecord:
    return EffectRecord(JOB, TOKEN, rank, ok, at_ms * MS, generation=gen)


def replaced_history() -> History:
    """j1 token 3 (a clean history's j1): rank 0 ran on w1 throughout; rank 1 ran on w2
    until its node died (last record at 1,000 ms), and generation 1 of rank 1 started on
    w3 at 5,000 ms (after the dead timeout) and committed. j2 as in the clean history."""
    history = clean_history()
    history.members = [r for r in history.members if r.job != JOB]
    history.effects = [e for e in history.effects if e.job != JOB]
    history.members += [
        *finished(member(0, 0, "w1", 0, 6_900, pid=11, gpus=(0,)), 7_000),
        *member(1, 0, "w2", 0, 1_000, pid=12, gpus=(1,)),
        *finished(member(1, 1, "w3", 5_000, 7_900, pid=13, gpus=(1,)), 8_000),
    ]
    history.effects += [accepted(0, 0, 7_000), accepted(1, 1, 8_000)]
    return history


def kinds(history: History) -> list[str]:
    return sorted(v.kind for v in check_history(history))


def test_a_clean_replacement_is_no_violation_and_the_report_lists_it() -> None:
    history = replaced_history()
    assert check_history(history) == []
    assert replaced_ranks(history) == ["j1/3 rank 1: generations 0-1"]


def test_two_generations_of_a_rank_at_once_are_rank_twice() -> None:
    history = replaced_history()
    # The old member of rank 1 never stopped: it heartbeats on past its replacement's start.
    history.members += member(1, 0, "w2", 1_000, 5_300, pid=12, gpus=(1,))[1:]
    found = check_replacements(history)
    assert [v.kind for v in found] == ["rank-twice"]
    assert "generation 0 on w2 (pid 12)" in found[0].detail
    assert "after generation 1 started" in found[0].detail
    # A record at the very instant the new generation starts is already one too many.
    history = replaced_history()
    history.members.append(MemberRecord("heartbeat", JOB, 1, TOKEN, 1, "w2", 5_000 * MS, 12))
    assert kinds(history) == ["rank-twice"]


def test_the_old_generation_ending_just_before_the_new_one_starts_is_fine() -> None:
    history = replaced_history()
    history.members.append(MemberRecord("term", JOB, 1, TOKEN, 1, "w2", 4_999 * MS, 12))
    assert check_history(history) == []


def test_a_frozen_old_generation_is_excused_within_the_thaw_bound_only() -> None:
    def frozen(last_ms: int) -> History:
        history = replaced_history()
        history.faults.append(
            FaultRecord(
                "freeze-host",
                ("w2",),
                900 * MS,
                6_000 * MS,
                frozen=((JOB, TOKEN),),
                frozen_node="w2",
                declared_dead_ns=4_900 * MS,
            )
        )
        history.members.append(MemberRecord("term", JOB, 1, TOKEN, 1, "w2", last_ms * MS, 12))
        return history

    assert check_history(frozen(6_000 + THAW_KILL_BOUND_MS - 10)) == []
    assert kinds(frozen(6_000 + THAW_KILL_BOUND_MS + 50)) == ["rank-twice"]


def test_a_replaced_members_write_taken_after_its_replacement_started() -> None:
    history = replaced_history()
    # Rank 1's old member asked the sink at 5,200 ms, after generation 1 had started (at
    # 5,000 ms), and the sink took it: the old member was not fenced.
    history.effects.insert(-1, accepted(1, 0, 5_200))
    found = check_replacements(history)
    assert [v.kind for v in found] == ["replaced-before-fenced"]
    assert "from generation 0 after generation 1" in found[0].detail
    # Refused by the sink: fenced there in time.
    history.effects[-2] = accepted(1, 0, 5_200, ok=False)
    assert check_replacements(history) == []
    # Taken before the replacement started: the old member committed and then its node
    # died before its exit was reported; the new generation commits its rank again.
    history.effects[-2] = accepted(1, 0, 900)
    assert check_history(history) == []


def test_each_generation_commits_its_rank_at_most_once() -> None:
    history = replaced_history()
    history.effects.append(accepted(1, 1, 8_050))
    found = [v for v in check_history(history) if v.kind == "duplicate-effect"]
    assert len(found) == 1 and "rank 1 under token 3 generation 1" in found[0].detail


def test_one_generation_started_twice_is_a_duplicate_member() -> None:
    history = replaced_history()
    assert "duplicate-member" not in kinds(history)  # pids 12 and 13: generations 0 and 1
    history.members.append(
        MemberRecord("start", JOB, 1, TOKEN, 1, "w4", 5_001 * MS, 14, generation=1)
    )
    found = [v for v in check_history(history) if v.kind == "duplicate-member"]
    assert len(found) == 1 and "generation 1 started by pids [13, 14]" in found[0].detail


def test_gpu_reuse_follows_each_generation_on_its_own_node() -> None:
    history = replaced_history()
    # Another job used GPU 1 of w3 from 1,500 to 4,000 ms: after rank 1's first member
    # started (on w2) and before its replacement started on w3. Generations merged into
    # one life would place rank 1 on w3 from 0 ms on.
    history.members += [
        MemberRecord("start", "j9", 1, 9, 0, "w3", 1_500 * MS, 20, gpus=(1,)),
        MemberRecord("term", "j9", 1, 9, 0, "w3", 4_000 * MS, 20, gpus=(1,)),
    ]
    assert "gpu-reuse" not in kinds(history)
    # A generation started on the GPU another member still held is caught.
    history.members.append(MemberRecord("heartbeat", "j9", 1, 9, 0, "w3", 5_100 * MS, 20))
    assert "gpu-reuse" in kinds(history)


def test_two_generations_on_one_gpu_at_once_are_a_gpu_reuse_too() -> None:
    history = replaced_history()
    history.members = [
        replace(r, node="w2") if r.member == (JOB, TOKEN, 1, 1) else r for r in history.members
    ]
    history.members.append(MemberRecord("heartbeat", JOB, 1, TOKEN, 1, "w2", 5_200 * MS, 12))
    found = {v.kind for v in check_history(history)}
    assert {"gpu-reuse", "rank-twice"} <= found


def test_a_replacement_is_the_same_attempt_and_a_real_overlap_is_still_caught() -> None:
    history = replaced_history()
    assert "overlap" not in kinds(history) and "token-order" not in kinds(history)
    # A newer attempt (token 5) started at 7,500 ms while generation 1 ran on to 7,900 ms.
    history.members.append(MemberRecord("start", JOB, 2, 5, 0, "w4", 7_500 * MS, 30))
    assert "overlap" in kinds(history)


def test_a_frozen_rank_replaced_while_the_rest_of_its_gang_ran_on() -> None:
    """w2 froze with rank 1 of j1; the leader declared it dead and placed rank 1 again on
    w3. Rank 0 (on w1, never frozen) committing after the thaw is the attempt going on,
    not a stale write; rank 1's old member committing after the thaw is one."""
    history = replaced_history()
    freeze = FaultRecord(
        "freeze-host",
        ("w2",),
        900 * MS,
        6_000 * MS,
        frozen=((JOB, TOKEN),),
        frozen_node="w2",
        declared_dead_ns=4_900 * MS,
    )
    history.faults.append(freeze)
    assert check_history(history) == []  # rank 0 committed at 7,000 ms, after the thaw
    history.members.append(MemberRecord("effect", JOB, 1, TOKEN, 1, "w2", 6_050 * MS, 12))
    history.effects.insert(-1, accepted(1, 0, 6_100))
    assert kinds(history) == ["replaced-before-fenced", "stale-write"]


# ------------------------------------- binds: a replacement is bound on its own


def replaced_state(member_bound_ms: int) -> ClusterState:
    """The final state of j1 (token 3, bound at BOUND) after rank 1 was placed again on
    w3 (GPU 1) at ``member_bound_ms``, as generation 1; j2 as in the clean history."""
    state = final_state(
        ("j1", "req-1", TOKEN, 1, JobState.SUCCEEDED), ("j2", "req-2", 6, 2, JobState.SUCCEEDED)
    )
    attempt = state.jobs[JOB].attempt
    assert attempt is not None
    attempt.members = (attempt.members[0], MemberPlacement(1, "w3", (1,), generation=1))
    attempt.member_status[1].bound_at_ms = member_bound_ms
    state.jobs[JOB].owner = "admin"
    for name in ("w1", "w2", "w3"):
        info = NodeInfo(name, f"{name}:7070", Resources(8000, 16384, 4), ((0, 1, 2, 3),))
        state.nodes[name] = Node(info, NodeStatus.READY, 0)
    return state


def with_state(history: History, state: ClusterState) -> History:
    history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    return history


def test_a_replacement_is_judged_at_its_own_bind_for_gpu_health() -> None:
    # GPU 1 of w3 was unhealthy when the attempt was bound, and repaired before rank 1
    # was placed there again: no violation.
    span = GpuUnhealthy("w3", 1, BOUND - 1_000, BOUND + 3_000)
    history = with_state(replaced_history(), replaced_state(BOUND + 4_000))
    history.gpu_unhealthy = [span]
    assert check_history(history) == []
    # Placed there while it was unhealthy: flagged.
    history = with_state(replaced_history(), replaced_state(BOUND + 1_000))
    history.gpu_unhealthy = [span]
    found = check_history(history)
    assert [(v.kind, v.job) for v in found] == [("unhealthy-start", JOB)]
    assert f"bound at {BOUND + 1_000}" in found[0].detail


def test_a_replacement_is_judged_at_its_own_bind_for_node_fitness() -> None:
    # w3 was unfit for admin when the attempt was bound, fit again when rank 1 came.
    unfit = UnfitSpan("w3", "admin", BOUND + 2_000, 3_000)
    history = with_state(replaced_history(), replaced_state(BOUND + 4_000))
    history.unfit = [unfit]
    # The replicas' history of the attempt names w3 among its nodes, bound at BOUND.
    attempt = AttemptHistory(1, TOKEN, AttemptState.SUCCEEDED, BOUND, "", ("w1", "w2", "w3"))
    history.job_history = [JobHistory(JOB, JobState.SUCCEEDED, "", 0, 0, (attempt,), "admin")]
    assert check_history(history) == []
    history = with_state(replaced_history(), replaced_state(BOUND + 1_000))
    history.unfit = [unfit]
    assert kinds(history) == ["unfit-bind"]
