"""The client library of a synapse cluster.

:class:`Cluster` (with :class:`Job`, :class:`JobInfo`, :class:`Array`, :class:`ArrayInfo`
and the :class:`SynapseError` family) is the Python client documented in
``docs/python.md``: what a notebook, a pipeline or an orchestrator's task imports. Underneath,
:class:`~synapse_ha.client.cluster.ClusterClient` finds the leader among the replicas,
follows redirects and retries; it is what synctl, workers, the local launcher, the chaos
suite and the benchmarks call the cluster with. :func:`checkpoint` and
:func:`resume_step` are for the code of a gang member: its checkpoint marks;
:func:`preempt_notice` tells it that it is being preempted.
"""

from synapse_ha.client.api import Array, ArrayInfo, Cluster, Job, JobInfo, Member
from synapse_ha.client.credentials import CredentialsError
from synapse_ha.client.errors import (
    AccessDenied,
    ClusterUnreachable,
    InvalidSpec,
    JobNotFound,
    SynapseError,
    WaitTimedOut,
)
from synapse_ha.client.logs import LogLine
from synapse_ha.client.marks import checkpoint, preempt_notice, resume_step
from synapse_ha.core.model import JobState

__all__ = [
    "AccessDenied",
    "Array",
    "ArrayInfo",
    "Cluster",
    "ClusterUnreachable",
    "CredentialsError",
    "InvalidSpec",
    "Job",
    "JobInfo",
    "JobNotFound",
    "JobState",
    "LogLine",
    "Member",
    "SynapseError",
    "WaitTimedOut",
    "checkpoint",
    "preempt_notice",
    "resume_step",
]
