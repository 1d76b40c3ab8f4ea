"""Replicated settings a replica is configured with (TOML ``[scheduling]``, ``[limits]``
and ``[raft] compact_state``), which the leader replicates when they differ."""

from __future__ import annotations

from dataclasses import dataclass, replace

from synapse_ha.core.cluster_config import ClusterConfig, PreemptionMode, PriorityClass


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

    @property
    def pinned_limits(self) -> frozenset[str]:
        """The names of the limits this replica puts back when it leads."""
        return frozenset(name for name, _ in self.limits)

    def applied_to(self, config: ClusterConfig) -> ClusterConfig:
        if self.limits:
            config = replace(config, limits=replace(config.limits, **dict(self.limits)))
        config = replace(
            config,
            gpu_drain_threshold=_given(self.gpu_drain_threshold, config.gpu_drain_threshold),
            unfit_backoff_ms=_given(self.unfit_backoff_ms, config.unfit_backoff_ms),
            cordon_after_start_failures=_given(
                self.cordon_after_start_failures, config.cordon_after_start_failures
            ),
        )
        if self.hold_until_stopped is not None:
            config = replace(config, hold_until_stopped=self.hold_until_stopped)
        if self.clear_gpu_faults_on_reboot is not None:
            config = replace(config, clear_gpu_faults_on_reboot=self.clear_gpu_faults_on_reboot)
        if self.start_timeout_ms is not None:
            config = replace(config, start_timeout_ms=self.start_timeout_ms)
        if self.compact_state is not None:
            config = replace(config, compact_state=self.compact_state)
        if self.max_requeues is not None:
            config = replace(config, max_requeues=self.max_requeues)
        if self.priority_classes is not None:
            config = replace(config, priority_classes=self.priority_classes)
        if self.preemption is not None:
            config = replace(config, preemption=self.preemption)
        if self.fair_share_half_life_ms is not None:
            config = replace(config, fair_share_half_life_ms=self.fair_share_half_life_ms)
        if self.reclaim_wait_max_ms is not None:
            config = replace(config, reclaim_wait_max_ms=self.reclaim_wait_max_ms)
        if self.relay_heartbeats is not None:
            config = replace(config, relay_heartbeats=self.relay_heartbeats)
        return config


def _given(value: int | None, current: int) -> int:
    return current if value is None else value
