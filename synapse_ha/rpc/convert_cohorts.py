"""Cohorts of the cohort tree to and from their messages (DESIGN §8, docs/queues.md)."""

from __future__ import annotations

from synapse_ha.core.cluster_config import Cohort
from synapse_ha.core.queue_usage import CohortUsage
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

_LIMITS = ("gpu", "borrowing_limit_gpu", "lending_limit_gpu")


def cohort_from_proto(msg: pb.Cohort) -> Cohort:
    """Build a cohort (not yet checked: :func:`synapse_ha.core.cohort_tree.check_cohort`).
    An unset limit stays None ("no limit"; for ``gpu``: nothing of its own)."""

    def opt(name: str) -> int | None:
        return int(getattr(msg, name)) if msg.HasField(name) else None

    return Cohort(
        name=msg.name,
        parent=msg.parent,
        gpu=opt("gpu"),
        borrowing_limit_gpu=opt("borrowing_limit_gpu"),
        lending_limit_gpu=opt("lending_limit_gpu"),
    )


def cohort_to_proto(cohort: Cohort) -> pb.Cohort:
    msg = pb.Cohort(name=cohort.name, parent=cohort.parent)
    for name in _LIMITS:
        value = getattr(cohort, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def cohort_status_to_proto(usage: CohortUsage) -> pb.CohortStatus:
    return pb.CohortStatus(
        cohort=cohort_to_proto(usage.cohort),
        defined=usage.defined,
        nominal_gpu=usage.nominal_gpu,
        used_gpu=usage.used_gpu,
        borrowed_gpu=usage.borrowed_gpu,
        lendable_gpu=usage.lendable_gpu,
    )
