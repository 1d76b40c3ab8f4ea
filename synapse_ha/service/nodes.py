"""A worker's registration: its node's record, checked and committed, and the node
heard from then on."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import NEW_FIELDS, format_needed
from synapse_ha.core.identity import access
from synapse_ha.core.identity.access import Identity
from synapse_ha.core.model import ClusterState, NodeInfo
from synapse_ha.core.spec import validation
from synapse_ha.service import commit
from synapse_ha.service.refusal import Refusal, denied, invalid, node_not_found
from synapse_ha.service.replica import Replica


def register_node(
    replica: Replica, identity: Identity, info: NodeInfo, timeout_s: float
) -> ClusterState | Refusal:
    """Register (or refresh) ``info``'s node as ``identity``'s worker: the fields not
    every replica reads yet are left out, the record is checked, committed within
    ``timeout_s`` and the node heard now. The state after the commit."""
    floor = replica.snapshot().format_floor
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
    proposed = [replica.propose(cmd.RegisterNode(info=info, now_ms=now))]
    failed = commit.settle(proposed, time.monotonic() + timeout_s, node_not_found(info.node_id))
    if failed is not None:
        return failed
    replica.heard(info.node_id, now)
    return replica.snapshot()
