"""Questions asked of one job and its attempts that several parts of the core share: when
a live attempt's time limit ends, how many members its gang may have."""

from __future__ import annotations

from synapse_ha.core.model import Job, JobSpec


def time_limit_deadline(job: Job) -> int | None:
    """When the live attempt of ``job`` must be stopped, or None without a limit."""
    attempt = job.live_attempt()
    if attempt is None or job.spec.time_limit_ms <= 0:
        return None
    start = attempt.bound_at_ms if attempt.started_at_ms is None else attempt.started_at_ms
    return start + job.spec.time_limit_ms


def gang_sizes(spec: JobSpec) -> tuple[int, int]:
    """The fewest and the most members an attempt of ``spec`` may have: ``replicas`` for
    both, or an elastic gang's ``min`` and ``max`` (core/elastic.py)."""
    if spec.elastic is None:
        return spec.replicas, spec.replicas
    return spec.elastic.min_replicas, spec.replicas


def membership_signal(spec: JobSpec) -> str:
    """The signal members of ``spec`` get when its membership changes ("" for none)."""
    if spec.replace is not None:
        return spec.replace.signal
    return spec.elastic.signal if spec.elastic is not None else ""
