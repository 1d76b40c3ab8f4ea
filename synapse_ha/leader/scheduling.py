"""Replicated settings a replica is configured with (TOML ``[scheduling]``, ``[limits]``
and ``[raft] compact_state``), which the leader replicates when they differ."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from synapse_ha.core.cluster_config import ClusterConfig, PreemptionMode, PriorityClass, Timeouts


@dataclass(frozen=True, slots=True)
class SchedulingSettings:
    """Replicated settings a replica is configured with (TOML ``[scheduling]``,
    ``[limits]`` and ``[raft] compact_state``); None leaves the replicated value as it is.
    ``limits`` names only the limits the file sets (``synctl config set`` changes the
    others)."""

    priority_classes: tuple[PriorityClass, ...] | None = None
    preemption: PreemptionMode | None = None
    fair_share_half_life_ms: int | None = None
    max_requeues: int | None = None
    compact_state: bool | None = None
    start_timeout_ms: int | None = None
    limits: tuple[tuple[str, int], ...] = ()
    gpu_drain_threshold: int | None = None
    unfit_backoff_ms: int | None = None
    cordon_after_start_failures: int | None = None
    hold_until_stopped: bool | None = None
    clear_gpu_faults_on_reboot: bool | None = None
    reclaim_wait_max_ms: int | None = None
    relay_heartbeats: bool | None = None
    master_port_base: int | None = None
    spares: int | None = None
    spare_level: str | None = None
    defrag_share_pct: int | None = None

    @property
    def pinned_limits(self) -> frozenset[str]:
        """The names of the limits this replica puts back when it leads."""
        return frozenset(name for name, _ in self.limits)

    def applied_to(self, config: ClusterConfig) -> ClusterConfig:
        """``config`` with every setting given here (not None) in place of its own, and
        the limits named in ``limits``."""
        if self.limits:
            config = replace(config, limits=replace(config.limits, **dict(self.limits)))
        given: dict[str, Any] = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "limits" and getattr(self, f.name) is not None
        }
        return replace(config, **given)


@dataclass(frozen=True, slots=True)
class DesiredSettings:
    """Everything a replica is configured with that its leader loop replicates: the
    timeouts, the locality wait and the scheduling settings; None leaves the replicated
    value as it is."""

    timeouts: Timeouts | None = None
    locality_wait_ms: int | None = None
    scheduling: SchedulingSettings | None = None

    def applied_to(self, config: ClusterConfig) -> ClusterConfig:
        """``config`` with every setting given here in place of its own."""
        if self.timeouts is not None:
            config = replace(config, timeouts=self.timeouts)
        if self.locality_wait_ms is not None:
            config = replace(config, locality_wait_ms=self.locality_wait_ms)
        if self.scheduling is not None:
            config = self.scheduling.applied_to(config)
        return config
