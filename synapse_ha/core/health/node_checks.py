"""The rules a worker's report of its node checks must keep (a check's name, once, and a
bounded printable message), checked by the gRPC adapter before it proposes the report
and again at apply."""

from __future__ import annotations

from collections.abc import Sequence

from synapse_ha.core.health.fitness import (
    CHECK_NAME_PATTERN,
    MAX_CHECK_MESSAGE,
    MAX_CHECK_NAME,
    NodeCheck,
)
from synapse_ha.core.spec.validation import Violation, invalid


def check_node_checks(checks: Sequence[NodeCheck]) -> list[Violation]:
    """Every rule a report of node checks breaks, naming the field of each."""
    out: list[Violation] = []
    seen: set[str] = set()
    for i, check in enumerate(checks):
        where = f"checks[{i}]"
        if len(check.name) > MAX_CHECK_NAME or not CHECK_NAME_PATTERN.fullmatch(check.name):
            out.append(
                invalid(
                    f"{where}.name",
                    f"1 to {MAX_CHECK_NAME} lowercase letters and digits in words joined by -",
                )
            )
        elif check.name in seen:
            out.append(invalid(f"{where}.name", f"check {check.name!r} is named twice"))
        seen.add(check.name)
        if len(check.message) > MAX_CHECK_MESSAGE or not check.message.isprintable():
            out.append(
                invalid(f"{where}.message", f"at most {MAX_CHECK_MESSAGE} printable characters")
            )
    return out
