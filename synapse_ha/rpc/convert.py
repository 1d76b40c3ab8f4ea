"""Conversions between protobuf messages and core values, by their older names: from the
wire in :mod:`synapse_ha.rpc.from_proto`, to the wire in :mod:`synapse_ha.rpc.to_proto`,
the fields both name alike in :mod:`synapse_ha.rpc.fields`."""

from __future__ import annotations

from synapse_ha.rpc.from_proto import checks_from_proto as checks_from_proto
from synapse_ha.rpc.from_proto import dependencies_from_proto as dependencies_from_proto
from synapse_ha.rpc.from_proto import gpu_faults_from_proto as gpu_faults_from_proto
from synapse_ha.rpc.from_proto import limits_with as limits_with
from synapse_ha.rpc.from_proto import member_events_from_proto as member_events_from_proto
from synapse_ha.rpc.from_proto import node_info_from_proto as node_info_from_proto
from synapse_ha.rpc.from_proto import prestart_from_proto as prestart_from_proto
from synapse_ha.rpc.from_proto import queue_from_proto as queue_from_proto
from synapse_ha.rpc.from_proto import spec_from_proto as spec_from_proto
from synapse_ha.rpc.to_proto import ENDED_ATTEMPT as ENDED_ATTEMPT
from synapse_ha.rpc.to_proto import array_to_proto as array_to_proto
from synapse_ha.rpc.to_proto import attempt_to_proto as attempt_to_proto
from synapse_ha.rpc.to_proto import checkpoint_to_proto as checkpoint_to_proto
from synapse_ha.rpc.to_proto import checks_to_proto as checks_to_proto
from synapse_ha.rpc.to_proto import clamp_int32 as clamp_int32
from synapse_ha.rpc.to_proto import conditions_to_proto as conditions_to_proto
from synapse_ha.rpc.to_proto import dependencies_to_proto as dependencies_to_proto
from synapse_ha.rpc.to_proto import desired_to_proto as desired_to_proto
from synapse_ha.rpc.to_proto import gpu_faults_to_proto as gpu_faults_to_proto
from synapse_ha.rpc.to_proto import job_to_proto as job_to_proto
from synapse_ha.rpc.to_proto import limits_to_proto as limits_to_proto
from synapse_ha.rpc.to_proto import node_to_proto as node_to_proto
from synapse_ha.rpc.to_proto import preemption_to_desired as preemption_to_desired
from synapse_ha.rpc.to_proto import priority_class_to_proto as priority_class_to_proto
from synapse_ha.rpc.to_proto import queue_to_proto as queue_to_proto
from synapse_ha.rpc.to_proto import queue_usage_to_proto as queue_usage_to_proto
from synapse_ha.rpc.to_proto import resources_to_proto as resources_to_proto
from synapse_ha.rpc.to_proto import spec_to_proto as spec_to_proto
from synapse_ha.rpc.to_proto import token_to_proto as token_to_proto
