"""Cohorts of the cohort tree to and from their messages (DESIGN §8, docs/queues.md): their
conversions are in :mod:`synapse_ha.rpc.to_proto` and :mod:`synapse_ha.rpc.from_proto`,
named here as the admin service calls them."""

from __future__ import annotations

from synapse_ha.rpc.from_proto import cohort_from_proto as cohort_from_proto
from synapse_ha.rpc.to_proto import cohort_status_to_proto as cohort_status_to_proto
from synapse_ha.rpc.to_proto import cohort_to_proto as cohort_to_proto

__all__ = ["cohort_from_proto", "cohort_status_to_proto", "cohort_to_proto"]
