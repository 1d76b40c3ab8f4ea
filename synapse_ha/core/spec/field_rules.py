"""Rules of the job spec fields that live in modules of their own (dependencies, the
window, arrays, the node selector, member replacement, elastic gangs, the one-value fields of
:mod:`synapse_ha.core.spec.fields`), gathered for
:func:`synapse_ha.core.spec.validation.check_job_spec`."""

from __future__ import annotations

from synapse_ha.core.elastic import elastic_problems
from synapse_ha.core.model import JobSpec
from synapse_ha.core.node_selector import selector_problems
from synapse_ha.core.replacement import replace_problems
from synapse_ha.core.spec.fields import spec_field_problems
from synapse_ha.core.workflows.arrays import array_problems
from synapse_ha.core.workflows.dependencies import dependency_problems
from synapse_ha.core.workflows.windows import window_problems


def more_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """``(field, rule)`` for every such rule ``spec`` breaks, in field order."""
    return (
        dependency_problems(spec.dependencies)
        + window_problems(
            spec.begin_at_ms, spec.begin_delay_ms, spec.deadline_at_ms, spec.deadline_delay_ms
        )
        + array_problems(spec.array)
        + selector_problems(spec.nodes, spec.replicas)
        + replace_problems(spec.replace, spec.replicas)
        + elastic_problems(spec.elastic, spec.replicas)
        + spec_field_problems(spec)
    )
