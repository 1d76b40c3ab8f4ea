"""The checker on hand-made histories: a clean one passes, each kind of breakage is named."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from chaos import ledger
from chaos.checker import (
    EffectRecord,
    History,
    MemberRecord,
    Submission,
    check_history,
    check_run,
    reruns,
    reruns_after_unfinished,
)
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.model import (
    Attempt,
    AttemptState,
    ClusterState,
    Job,
    JobSpec,
    JobState,
    MemberPlacement,
    MemberState,
    MemberStatus,
    Resources,
)
from synapse_ha.core.reasons import ReasonCode, reason

MS = 1_000_000  # nanoseconds per millisecond
HEAL_WALL_MS = 1_000_000


def final_state(*jobs: tuple[str, str, int, int, JobState]) -> ClusterState:
    """A final state holding ``(job_id, request_id, token, attempt number, state)`` jobs
    of two ranks each."""
    state = ClusterState()
    for seq, (job_id, request_id, token, number, job_state) in enumerate(jobs, start=1):
        spec = JobSpec(name=job_id, replicas=2, resources=Resources(500, 256, 1), command=("x",))
        attempt = Attempt(
            number=number,
            fencing_token=token,
            members=(MemberPlacement(0, "w1", (0,)), MemberPlacement(1, "w2", (0,))),
            master_port=29_500,
            bound_at_ms=HEAL_WALL_MS - 5_000,
            member_status=[
                MemberStatus(MemberState.EXITED, 0),
                MemberStatus(MemberState.EXITED, 0),
            ],
            started_at_ms=HEAL_WALL_MS - 4_000,
            ended_at_ms=HEAL_WALL_MS + 1_000,
            outcome=reason(ReasonCode.ALL_EXITED_ZERO, members=2),
            state=AttemptState.SUCCEEDED,
        )
        state.jobs[job_id] = Job(
            job_id=job_id,
            spec=spec,
            request_id=request_id,
            seq=seq,
            submitted_at_ms=HEAL_WALL_MS - 6_000,
            state=job_state,
            attempt=attempt,
            attempts_made=number,
            finished_at_ms=HEAL_WALL_MS + 1_000,
        )
        state.request_ids[request_id] = job_id
        state.last_fencing_token = max(state.last_fencing_token, token)
        state.next_job_seq = seq + 1
    return state


def run_attempt(
    job: str, token: int, attempt: int, start_ms: int, end_ms: int
) -> list[MemberRecord]:
    """Both ranks of one attempt: start, a heartbeat every 100 ms, effect, end."""
    out = []
    for rank in (0, 1):
        out.append(
            MemberRecord("start", job, attempt, token, rank, f"w{rank + 1}", start_ms * MS, 10)
        )
        for t in range(start_ms + 100, end_ms, 100):
            out.append(MemberRecord("heartbeat", job, attempt, token, rank, "w", t * MS, 10))
        out.append(MemberRecord("effect", job, attempt, token, rank, "w", end_ms * MS, 10))
        out.append(
            MemberRecord(
                "end", job, attempt, token, rank, "w", end_ms * MS + 1, 10, outcome="accepted"
            )
        )
    return out


def effects(job: str, token: int, at_ms: int, accepted: bool = True) -> list[EffectRecord]:
    return [EffectRecord(job, token, rank, accepted, at_ms * MS + rank) for rank in (0, 1)]


def clean_history() -> History:
    """j1 ran once (token 3); j2 failed once (token 4, fenced mid-run, one rank's effect
    already accepted) and succeeded on its second attempt (token 6)."""
    state = final_state(
        ("j1", "req-1", 3, 1, JobState.SUCCEEDED), ("j2", "req-2", 6, 2, JobState.SUCCEEDED)
    )
    members = [
        *run_attempt("j1", 3, 1, 0, 2_000),
        *[r for r in run_attempt("j2", 4, 1, 100, 1_500) if r.rank == 0 or r.mono_ns < 900 * MS],
        *run_attempt("j2", 6, 2, 6_000, 8_000),
    ]
    return History(
        members=members,
        effects=[*effects("j1", 3, 2_000), effects("j2", 4, 1_500)[0], *effects("j2", 6, 8_000)],
        submissions=[Submission("req-1", "ok", "j1"), Submission("req-2", "ok", "j2")],
        replica_states={r: encode_state(state) for r in ("r1", "r2", "r3")},
        heal_wall_ms=HEAL_WALL_MS,
        final_deadline_ms=60_000,
    )


def kinds(history: History) -> set[str]:
    return {v.kind for v in check_history(history)}


def test_a_clean_history_has_no_violations() -> None:
    assert check_history(clean_history()) == []


def test_an_older_attempt_still_running_after_a_newer_one_started_is_an_overlap() -> None:
    history = clean_history()
    # A paused member of j2's first attempt resumes and writes after token 6 started.
    history.members.append(MemberRecord("heartbeat", "j2", 1, 4, 1, "w2", 6_500 * MS, 11))
    found = check_history(history)
    assert [v.kind for v in found] == ["overlap"]
    assert found[0].job == "j2"
    assert "token 4" in found[0].detail and "token 6" in found[0].detail


def test_a_stale_token_effect_is_reported_twice_over() -> None:
    history = clean_history()
    history.members.append(MemberRecord("effect", "j2", 1, 4, 1, "w2", 8_100 * MS, 11))
    history.effects.append(EffectRecord("j2", 4, 1, True, 8_100 * MS, highest_before=6))
    # The stale effect also completes token 4's gang, so the job completed twice; and the
    # sink accepted it after token 6 had started: a stale write.
    assert kinds(history) == {"stale-effect", "stale-write", "completed-twice", "not-completed"}
    details = [v.detail for v in check_history(history)]
    assert any("sink accepted rank 1 under token 4 after token 6" in d for d in details)
    assert any("wrote 'effect'" in d for d in details)


def test_an_acknowledged_job_missing_from_the_final_state_is_lost() -> None:
    history = clean_history()
    history.submissions.append(Submission("req-3", "ok", "j3"))
    found = check_history(history)
    assert [(v.kind, v.job) for v in found] == [("lost", "j3")]


def test_a_job_that_completed_twice_is_reported() -> None:
    history = clean_history()
    # j1's work ran to completion a second time under a later token.
    history.members += run_attempt("j1", 7, 2, 9_000, 10_000)
    history.effects += effects("j1", 7, 10_000)
    assert "completed-twice" in kinds(history)


def test_one_member_accepted_twice_is_a_duplicate_effect() -> None:
    history = clean_history()
    history.effects.append(EffectRecord("j1", 3, 0, True, 2_500 * MS))
    assert kinds(history) == {"duplicate-effect"}


def test_tokens_must_grow_with_attempts() -> None:
    history = clean_history()
    # A later attempt that carries a smaller token than the one before it.
    history.members += run_attempt("j1", 2, 2, 12_000, 13_000)
    assert "token-order" in kinds(history)


def test_diverged_replicas_and_broken_invariants_are_reported() -> None:
    history = clean_history()
    other = final_state(("j1", "req-1", 3, 1, JobState.SUCCEEDED))
    history.replica_states["r3"] = encode_state(other)
    assert "divergence" in kinds(history)
    broken = final_state(
        ("j1", "req-1", 3, 1, JobState.SUCCEEDED), ("j2", "req-2", 6, 2, JobState.SUCCEEDED)
    )
    broken.last_fencing_token = 1  # tokens beyond the last issued one
    history.replica_states = {r: encode_state(broken) for r in ("r1", "r2", "r3")}
    assert "invariant" in kinds(history)


def test_phantoms_failed_submissions_and_unfinished_jobs() -> None:
    history = clean_history()
    history.submissions = [Submission("req-1", "ok", "j1"), Submission("req-2", "failed")]
    history.members.append(MemberRecord("start", "ghost", 1, 99, 0, "w1", 100 * MS, 12))
    found = {(v.kind, v.job) for v in check_history(history)}
    assert ("failed-ran", "j2") in found
    assert ("phantom", "ghost") in found

    late = clean_history()
    state = final_state(
        ("j1", "req-1", 3, 1, JobState.SUCCEEDED), ("j2", "req-2", 6, 2, JobState.RUNNING)
    )
    state.jobs["j2"].attempt.ended_at_ms = None  # type: ignore[union-attr]
    late.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    assert ("deadline", "j2") in {(v.kind, v.job) for v in check_history(late)}


def test_a_job_is_matched_to_its_submission_through_its_owners_scope() -> None:
    # The cluster stores "<owner>/<request id>"; the ledger holds the id as the client sent it.
    history = clean_history()
    state = final_state(
        ("j1", "admin/req-1", 3, 1, JobState.SUCCEEDED),
        ("j2", "admin/req-2", 6, 2, JobState.SUCCEEDED),
    )
    for job in state.jobs.values():
        job.owner = "admin"
    history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    assert check_history(history) == []
    # A scoped id the ledger never sent is still a phantom.
    state = final_state(
        ("j1", "admin/req-1", 3, 1, JobState.SUCCEEDED),
        ("j2", "admin/req-9", 6, 2, JobState.SUCCEEDED),
    )
    for job in state.jobs.values():
        job.owner = "admin"
    history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    assert ("phantom", "j2") in {(v.kind, v.job) for v in check_history(history)}


def test_a_stretch_after_the_heal_with_no_job_finishing_is_a_stall() -> None:
    def finishing_at(*after_heal_ms: int, stall_ms: int) -> History:
        history = clean_history()
        state = final_state(
            ("j1", "req-1", 3, 1, JobState.SUCCEEDED), ("j2", "req-2", 6, 2, JobState.SUCCEEDED)
        )
        for job_id, at in zip(("j1", "j2"), after_heal_ms, strict=True):
            state.jobs[job_id].finished_at_ms = HEAL_WALL_MS + at
        history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
        history.final_stall_ms = stall_ms
        return history

    # Steady finishes: none; a gap between finishes, or before the first, beyond the bound.
    assert check_history(finishing_at(20_000, 40_000, stall_ms=30_000)) == []
    between = check_history(finishing_at(20_000, 55_000, stall_ms=30_000))
    assert [(v.kind, v.job) for v in between] == [("deadline", "j2")]
    assert "from 20.0 s to 55.0 s after the heal" in between[0].detail
    first = check_history(finishing_at(31_000, 40_000, stall_ms=30_000))
    assert [(v.kind, v.job) for v in first] == [("deadline", "j1")]
    # A run that recorded no stall bound is judged by its cap alone.
    assert check_history(finishing_at(20_000, 55_000, stall_ms=0)) == []


def test_an_unknown_submission_may_have_run_once_but_not_twice() -> None:
    history = clean_history()
    history.submissions[1] = Submission("req-2", "unknown")
    assert check_history(history) == []
    history.members += run_attempt("j2", 9, 3, 20_000, 21_000)
    history.effects += effects("j2", 9, 21_000)
    assert "unknown-twice" in kinds(history)


def test_check_run_reads_a_saved_run_directory(tmp_path: Path) -> None:
    history = clean_history()
    with ledger.Appender(tmp_path / ledger.LEDGER) as out:
        for r in history.members:
            out.append(
                {
                    "type": r.type,
                    "job": r.job,
                    "attempt": r.attempt,
                    "token": r.token,
                    "rank": r.rank,
                    "node": r.node,
                    "mono_ns": r.mono_ns,
                    "pid": r.pid,
                }
            )
        out.append(
            {
                "type": "heartbeat",
                "job": "j2",
                "attempt": 1,
                "token": 4,
                "rank": 1,
                "node": "w2",
                "mono_ns": 7_000 * MS,
                "pid": 11,
            }
        )
    with ledger.Appender(tmp_path / ledger.EFFECTS) as out:
        for e in history.effects:
            out.append(
                {
                    "type": "effect",
                    "job": e.job,
                    "token": e.token,
                    "rank": e.rank,
                    "accepted": e.accepted,
                    "mono_ns": e.mono_ns,
                }
            )
    with ledger.Appender(tmp_path / ledger.SUBMISSIONS) as out:
        for s in history.submissions:
            out.append({"type": "begin", "request_id": s.request_id, "mono_ns": 0})
            out.append({"type": s.outcome, "request_id": s.request_id, "job_id": s.job_id})
    # A torn last line (its writer was killed mid-record) is ignored.
    with open(tmp_path / ledger.SUBMISSIONS, "a", encoding="utf-8") as f:
        f.write('{"type": "begin", "request_')
    states = tmp_path / "replica_states"
    states.mkdir()
    for rid, data in history.replica_states.items():
        (states / f"{rid}.state").write_bytes(data)
    (tmp_path / "meta.json").write_text(
        json.dumps({"heal_wall_ms": HEAL_WALL_MS, "final_deadline_ms": 60_000})
    )
    assert [v.kind for v in check_run(tmp_path)] == ["overlap"]


def test_a_run_without_replica_states_is_not_silently_clean() -> None:
    history = clean_history()
    history.replica_states = {}
    assert "divergence" in kinds(history)


def test_a_rerun_told_done_by_the_sink_is_not_a_second_completion() -> None:
    history = clean_history()
    # j1 completed under token 3 but its success reports were lost; attempt 2 (token 8)
    # re-ran, and the sink told every rank that the output was already committed.
    state = final_state(
        ("j1", "req-1", 8, 2, JobState.SUCCEEDED), ("j2", "req-2", 6, 2, JobState.SUCCEEDED)
    )
    history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    history.members += run_attempt("j1", 8, 2, 9_000, 10_000)
    history.effects += [
        EffectRecord("j1", 8, rank, False, 10_000 * MS + rank, 3, done=True) for rank in (0, 1)
    ]
    assert check_history(history) == []
    assert reruns(history) == ["j1"]
    # Without the sink's "done" answers, the SUCCEEDED attempt committed nothing.
    history.effects = [e for e in history.effects if not e.done]
    assert kinds(history) == {"not-completed"}


def test_a_rerun_after_an_attempt_killed_between_commit_and_end_is_not_a_lost_success() -> None:
    history = clean_history()
    # j1's token 3 committed both ranks, but rank 1 was killed before its end record (it
    # never exited 0): nothing could know the job had succeeded; token 8 ran again.
    history.members = [
        r for r in history.members if (r.job, r.token, r.rank, r.type) != ("j1", 3, 1, "end")
    ]
    history.members += run_attempt("j1", 8, 2, 9_000, 10_000)
    history.effects += [
        EffectRecord("j1", 8, rank, False, 10_000 * MS + rank, 3, done=True) for rank in (0, 1)
    ]
    assert reruns(history) == []
    assert reruns_after_unfinished(history) == ["j1"]


def test_an_attempt_where_a_rank_never_started_did_not_finish() -> None:
    history = clean_history()
    # j1's token 3: only rank 0 ran (rank 1's node died before it started), committed and
    # ended; the gang of two did not finish, so token 8 running again is no lost success.
    history.members = [
        replace(r, world=2)
        for r in history.members
        if not (r.job == "j1" and r.token == 3 and r.rank == 1)
    ]
    history.members += run_attempt("j1", 8, 2, 9_000, 10_000)
    assert reruns(history) == []
    # With its size unknown (an older ledger), the ranks that started are the gang.
    history.members = [replace(r, world=0) for r in history.members]
    assert reruns(history) == ["j1"]


def test_a_late_success_counts_completions_under_the_attempt_that_succeeded() -> None:
    history = clean_history()
    # j1 completed under token 3, its node was declared dead before the exits were
    # committed, attempt 2 (token 8) was bound but never started, and the late exit
    # reports ended the job SUCCEEDED with the newer attempt stopped.
    state = final_state(
        ("j1", "req-1", 8, 2, JobState.SUCCEEDED), ("j2", "req-2", 6, 2, JobState.SUCCEEDED)
    )
    job = state.jobs["j1"]
    late = reason(
        ReasonCode.SUCCEEDED_AFTER_NODE_DEATH, attempt=1, fencing_token=3, members=2, node="w1"
    )
    state.jobs["j1"] = replace(job, reason=late)
    history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    assert check_history(history) == []
    assert reruns(history) == []
    # The same final state without the late-success reason: nothing completed under 8.
    state.jobs["j1"] = job
    history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    assert kinds(history) == {"not-completed"}


def test_a_member_started_twice_is_reported() -> None:
    history = clean_history()
    history.members.append(MemberRecord("start", "j1", 1, 3, 0, "w3", 500 * MS, 99))
    assert kinds(history) == {"duplicate-member"}


def test_a_member_started_twice_with_one_pid_in_two_pid_namespaces_is_reported() -> None:
    history = clean_history()
    first = next(r for r in history.members if r.type == "start" and r.job == "j1")
    history.members.append(replace(first, node="w3", mono_ns=500 * MS, pid_ns=4026532999))
    assert kinds(history) == {"duplicate-member"}
    # Once in a namespace whose number a later one got again.
    again = clean_history()
    again.members.append(replace(first, mono_ns=500 * MS, start_ticks=first.start_ticks + 40))
    assert kinds(again) == {"duplicate-member"}
