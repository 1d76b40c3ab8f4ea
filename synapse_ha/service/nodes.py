"""A worker's registration: its node's record, checked and committed, and the node
heard from then on."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import NEW_FIELDS, format_needed
from synapse_ha.core.identity import access
from synapse_ha.core.identity.access import Identity
from synapse_ha.core.model import ClusterState, NodeInfo
from synapse_ha.core.spec import validation
from synapse_ha.service import commit
from synapse_ha.service.heartbeat import report_command
from synapse_ha.service.refusal import Refusal, denied, invalid, node_not_found
from synapse_ha.service.replica import Replica


@dataclasses.dataclass(frozen=True, slots=True)
class Registered:
    """A registration committed: the state after it, and how many of the reports the
    worker sent with it were committed before it."""

    state: ClusterState
    acked_reports: int


def register_node(
    replica: Replica,
    identity: Identity,
    info: NodeInfo,
    timeout_s: float,
    events: Sequence[cmd.MemberEvent] = (),
) -> Registered | Refusal:
    """Register (or refresh) ``info``'s node as ``identity``'s worker: the fields not
    every replica reads yet are left out, the record is checked, committed within
    ``timeout_s`` and the node heard now.

    ``events``: the worker's reports not acknowledged yet. For a node the state knows
    they are committed first, in the same order as a heartbeat's, so that a node coming
    back from dead has its members' exits counted (an exit 0 that ends its job after
    all) before the registration makes it ready for new placements."""
    state = replica.snapshot()
    floor = state.format_floor
    if format_needed(info) > floor:  # left out: not every replica reads them yet
        newer: dict[str, Any] = {
            name: "" for name, version in NEW_FIELDS[NodeInfo].items() if version > floor
        }
        info = dataclasses.replace(info, **newer)
    refusal = access.may_speak_for_node(identity, info.node_id)
    if refusal is not None:
        return denied(refusal, identity)
    violations = validation.check_node_info(info)
    if violations:
        return invalid(violations)
    elsewhere = replica.leader_refusal()
    if elsewhere is not None:
        return elsewhere
    now = replica.clock_ms()
    report = None
    if info.node_id in state.nodes:
        report = report_command(info.node_id, events, now, floor)
    proposed = [replica.propose(report)] if report is not None else []
    proposed.append(replica.propose(cmd.RegisterNode(info=info, now_ms=now)))
    failed = commit.settle(proposed, time.monotonic() + timeout_s, node_not_found(info.node_id))
    if failed is not None:
        return failed
    replica.heard(info.node_id, now)
    return Registered(replica.snapshot(), len(events) if report is not None else 0)
