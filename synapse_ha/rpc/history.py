"""Protobuf forms of history rows, usage rows and events: their conversions are in
:mod:`synapse_ha.rpc.to_proto`, named here as the history service calls them."""

from __future__ import annotations

from synapse_ha.rpc.to_proto import event_to_proto as event_to_proto
from synapse_ha.rpc.to_proto import history_attempt_to_proto as attempt_to_proto
from synapse_ha.rpc.to_proto import history_job_to_proto as history_job_to_proto
from synapse_ha.rpc.to_proto import usage_row_to_proto as usage_row_to_proto

__all__ = ["attempt_to_proto", "event_to_proto", "history_job_to_proto", "usage_row_to_proto"]
