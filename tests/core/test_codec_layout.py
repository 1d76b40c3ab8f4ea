"""The compact state writes every dataclass as a list of its field values in declaration
order (:mod:`synapse_ha.core.codec.versioned`), so that order is part of the format: a replica of
the next release must read this release's states. Every type the state holds is pinned
here to the fields it had; a field may only be appended, with a default. A field moved,
renamed or removed fails this test: that is a format change, and needs a new state
version."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any

import pytest

from synapse_ha.core import cluster_config, model, reasons
from synapse_ha.core.codec.decode_errors import CodecError, UnreadableFormat
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.health.fitness import GpuFault, NodeCondition, Unfit
from synapse_ha.core.health.prestart import Prestart
from synapse_ha.core.health.progress import Progress
from synapse_ha.core.model import ClusterState
from synapse_ha.core.node_selector import NodeSelector
from synapse_ha.core.replacement import ReplacePolicy, Vacancy
from synapse_ha.core.workflows.checkpoints import CheckpointMark
from synapse_ha.core.workflows.dependencies import Dependencies
from tests.core.harness import Cluster
from tests.core.test_codec import a_running_and_a_waiting_job

PINNED: dict[type, tuple[str, ...]] = {
    model.Attempt: ("number", "fencing_token", "members", "master_port", "bound_at_ms",
                    "member_status", "started_at_ms", "ended_at_ms", "state", "outcome",
                    "preempted_by", "preemption", "preempt_deadline_ms", "held", "marks",
                    "reserved", "vacancies", "membership"),
    cluster_config.ClusterConfig: ("topology_levels", "timeouts", "retention_ms",
                                   "master_port_base", "master_port_span", "locality_wait_ms",
                                   "max_requeues", "start_timeout_ms", "priority_classes",
                                   "fair_share_half_life_ms", "preemption", "compact_state",
                                   "limits", "gpu_drain_threshold", "unfit_backoff_ms",
                                   "cordon_after_start_failures", "hold_until_stopped",
                                   "clear_gpu_faults_on_reboot", "reclaim_wait_max_ms",
                                   "relay_heartbeats", "spares", "spare_level",
                                   "defrag_share_pct", "reservations_per_pass"),
    model.ClusterState: ("config", "nodes", "jobs", "request_ids", "next_job_seq",
                         "last_fencing_token", "applied_commands", "last_time_ms", "tokens",
                         "queues", "queue_history", "format_floor", "arrays", "cohorts"),
    model.Job: ("job_id", "spec", "request_id", "seq", "submitted_at_ms", "state", "reason",
                "attempt", "attempts_made", "retries_used", "requeues", "retry_not_before_ms",
                "finished_at_ms", "owner", "cancelled_by", "lost_attempt", "waiting_for",
                "dependants", "array_id", "array_index", "resume_step"),
    model.JobSpec: ("name", "replicas", "resources", "command", "shell", "env", "workdir",
                    "priority", "topology_required", "topology_preferred", "time_limit_ms",
                    "retries", "image", "queue", "priority_class", "progress",
                    "prestart", "dependencies", "begin_at_ms", "begin_delay_ms",
                    "deadline_at_ms", "deadline_delay_ms", "array"),
    cluster_config.Limits: ("spec_bytes", "env_bytes", "pending_jobs_per_user",
                            "pending_jobs_per_queue", "submit_burst", "submit_per_s",
                            "watch_streams_per_identity", "watch_streams_total",
                            "member_min_cpu_milli", "member_min_memory_mib",
                            "member_overhead_memory_mib", "running_members_per_user",
                            "members_per_node_per_user"),
    model.ArrayJob: ("array_id", "spec", "request_id", "seq", "submitted_at_ms", "indices",
                     "throttle", "owner", "dependants"),
    model.LostAttempt: ("number", "fencing_token", "node_id", "nodes", "exited_zero"),
    model.MemberPlacement: ("rank", "node_id", "gpus", "generation"),
    model.MemberStatus: ("state", "exit_code", "started_at_ms", "finished_at_ms", "bound_at_ms"),
    ReplacePolicy: ("timeout_ms", "signal"),
    ElasticPolicy: ("min_replicas", "signal"),
    Vacancy: ("rank", "node_id", "since_ms", "cause", "stopped"),
    model.Node: ("info", "status", "registered_at_ms", "allocated", "allocated_gpus",
                 "master_ports", "status_reason", "status_by", "gpu_faults", "unfit",
                 "start_failures", "conditions"),
    GpuFault: ("gpu", "code", "detail", "since_ms"),
    Unfit: ("owner", "detail", "until_ms"),
    NodeCondition: ("name", "message", "since_ms"),
    Prestart: ("command", "shell", "timeout_ms"),
    Dependencies: ("after_ok", "after_any", "after_not_ok", "after"),
    NodeSelector: ("features", "gpu_model", "names", "exclude"),
    model.NodeInfo: ("node_id", "address", "capacity", "gpu_islands", "gpu_model", "topology",
                     "features", "members_run_as", "boot_id", "member_isolation"),
    cluster_config.PriorityClass: ("name", "value", "preempts", "grace_ms", "min_runtime_ms"),
    cluster_config.Queue: ("name", "gpu", "cpu_milli", "memory_mib", "cohort",
                           "borrowing_limit_gpu", "lending_limit_gpu", "priority_classes",
                           "max_priority", "min_runtime_ms", "running_members_per_user",
                           "members_per_node_per_user", "default_time_limit_ms",
                           "learned_estimates"),
    cluster_config.Cohort: ("name", "parent", "gpu", "borrowing_limit_gpu", "lending_limit_gpu",
                            "fair_sharing_preemption"),
    cluster_config.QueueHistory: ("gpu_ms", "cpu_milli_ms", "memory_mib_ms", "at_ms"),
    reasons.Reason: ("code", "params", "cause"),
    model.Resources: ("cpu_milli", "memory_mib", "gpu"),
    model.RetryPolicy: ("max_retries", "backoff_ms", "max_backoff_ms"),
    Progress: ("timeout_ms", "source"),
    CheckpointMark: ("rank", "at_ms", "step", "seq"),
    cluster_config.Timeouts: ("heartbeat_interval_ms", "lease_ttl_ms",
                              "leader_step_down_ms", "dead_timeout_ms", "safety_margin_ms"),
    model.Token: ("token_id", "user", "role", "secret_sha256", "created_at_ms", "created_by",
                  "queues", "expires_at_ms", "revoked_at_ms", "revoked_by", "priority_classes",
                  "max_priority"),
}  # fmt: skip


def state_types() -> set[type]:
    """Every dataclass a ClusterState can hold."""
    seen: set[type] = set()

    def visit(tp: typing.Any) -> None:
        origin = typing.get_origin(tp)
        if origin is not None:
            for arg in typing.get_args(tp):
                if arg is not Ellipsis:
                    visit(arg)
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp not in seen:
            seen.add(tp)
            for hint in typing.get_type_hints(tp).values():
                visit(hint)
        elif isinstance(tp, types.UnionType):
            for arg in tp.__args__:
                visit(arg)

    visit(ClusterState)
    return seen


def test_every_state_type_is_pinned() -> None:
    assert state_types() == set(PINNED), "pin the layout of a new state type here"


@pytest.mark.parametrize("cls", sorted(PINNED, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_fields_are_only_ever_appended_with_a_default(cls: type) -> None:
    fields = [f for f in dataclasses.fields(cls) if f.init]
    pinned = PINNED[cls]
    assert tuple(f.name for f in fields[: len(pinned)]) == pinned, (
        f"{cls.__name__}: the compact state reads fields by position; append new fields "
        f"after {pinned[-1]!r} instead of moving, renaming or removing one"
    )
    for f in fields[len(pinned) :]:
        assert (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        ), f"{cls.__name__}.{f.name}: an appended field needs a default"


def compact_cluster() -> Cluster:
    cl = a_running_and_a_waiting_job()
    cl.state.config = dataclasses.replace(cl.state.config, compact_state=True)
    return cl


def test_a_compact_state_names_no_field() -> None:
    data = encode_state(compact_cluster().state)
    for name in ("spec", "submitted_at_ms", "fencing_token", "allocated_gpus", "node_id"):
        assert f'"{name}"'.encode() not in data


def decoded_with_first_job(change: Callable[[list[Any]], list[Any]]) -> tuple[str, Any]:
    """Decode a compact state whose first job's list ``change`` rewrote: (that job's id,
    what decoding raised, or None)."""
    envelope = json.loads(encode_state(compact_cluster().state))
    jobs = envelope["state"][PINNED[ClusterState].index("jobs")]
    first = next(iter(jobs))
    jobs[first] = change(jobs[first])
    try:
        decode_state(json.dumps(envelope).encode())
    except CodecError as exc:
        return first, exc
    return first, None


def test_a_compact_state_of_a_newer_release_is_refused_with_the_upgrade_advice() -> None:
    # Fields this release cannot know.
    first, refused = decoded_with_first_job(lambda job: [*job, *[None] * len(PINNED[model.Job])])
    assert isinstance(refused, UnreadableFormat)
    assert re.match(rf"state\.jobs\.{first}: .* upgrade this replica", str(refused))


def test_a_compact_value_missing_a_required_field_is_refused() -> None:
    first, refused = decoded_with_first_job(lambda job: job[:1])  # the job id alone: no spec
    assert isinstance(refused, CodecError)
    assert str(refused).startswith(f"state.jobs.{first}: ")


def test_a_bad_value_deep_in_a_compact_state_is_named_by_its_exact_path() -> None:
    def bad_gpu_count(job: list[Any]) -> list[Any]:
        spec = job[PINNED[model.Job].index("spec")]
        spec[PINNED[model.JobSpec].index("resources")][2] = "eight"  # Resources.gpu
        return job

    first, refused = decoded_with_first_job(bad_gpu_count)
    assert str(refused) == f"state.jobs.{first}.spec.resources.gpu: expected an integer, got str"
