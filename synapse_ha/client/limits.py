"""The cluster's per-identity limits as the client library hands them out: the core
:class:`~synapse_ha.core.cluster_config.Limits`. Anyone may read them; admins change
the ones they name and keep the others."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.cluster_config import Limits
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


def limits_from_proto(msg: pb.Limits) -> Limits:
    return Limits(**{f.name: int(getattr(msg, f.name)) for f in dataclasses.fields(Limits)})


def get_limits(client: ClusterClient) -> Limits:
    """The limits every user is held to now."""
    return limits_from_proto(client.get_limits())


def set_limits(client: ClusterClient, values: Mapping[str, int]) -> Limits:
    """Change the named limits (admins only); the limits now. A name the cluster does
    not know is refused, naming it."""
    return limits_from_proto(client.set_limits(values))
